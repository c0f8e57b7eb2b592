export * from './types.js';
export * from './errors.js';
export { createSqliteJobStore, type SqliteJobStoreOptions } from './sqlite/store.js';
export { createPostgresJobStore, type PostgresJobStoreOptions } from './postgres/store.js';
export { openJobStore, type OpenJobStoreOptions } from './open.js';
export { migrateLeasePostgres, migrateLeaseSqlite } from './migrate.js';
export { runWorker } from './runner/run-worker.js';
export type { RunWorkerOptions, KindOptions, PayloadSchema } from './runner/options.js';
export type { JobContext, JobHandler, JobView, LeaseWorker, StopOptions } from './runner/types.js';
export {
  createFencedFetch,
  createStep,
  DEFAULT_FENCE_HEADERS,
  type FenceClaims,
  type FenceContext,
  type FencedFetch,
  type FencedRequestInit,
  type FenceHeaderNames,
  type FenceOptions,
  type FenceSigner,
  type StepContext,
  type StepFn,
} from './fenced-fetch.js';
// Signed fences (DESIGN §7): `fenceSigner: createFenceSigner({ secret }, { graceSeconds: 5 })`.
export { createFenceSigner, mintFence, type FenceClaimsInput, type FenceSigningKey } from '../protocol/fence-token.js';
export { LeaseEvents, type InFlightRequest, type LeaseEvent, type LeaseEventMap, type LeaseEventOf, type LeaseEventType } from './events.js';
export type { KindCounters, KindGauges, LeaseMetrics } from './metrics.js';
export { backoffMs, canStartAction, checkLeaseTiming, type BackoffPolicy, type LeaseTiming } from './timing.js';
