// fencegate/queue: fences and fenced calls for jobs of any queue (docs/queues.md).
export { createFenceSource, type FenceSourceOptions } from './fence-source.js';
export { fencedFetchFor, type FencedFetchForOptions } from './fenced-fetch-for.js';
export { jobKeys, MAX_KEY_PREFIX, type JobKeys, type JobRef } from './keys.js';
export { migrateQueuePostgres, migrateQueueSqlite } from './migrate.js';
export type { RedisLike } from './redis-source.js';
export type { BeginResult, FenceGuard, FenceSource } from './types.js';
export type { FencedJobContext } from './context.js';
export { LeaseLostError, OutcomeUnknownError } from '../lease/errors.js';
export { DEFAULT_FENCE_HEADERS, type FencedFetch, type FencedRequestInit, type FenceOptions, type FenceSigner } from '../lease/fenced-fetch.js';
