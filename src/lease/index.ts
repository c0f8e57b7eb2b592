export * from './types.js';
export * from './errors.js';
export { createSqliteJobStore, type SqliteJobStoreOptions } from './sqlite/store.js';
export { createPostgresJobStore, type PostgresJobStoreOptions } from './postgres/store.js';
export { openJobStore, type OpenJobStoreOptions } from './open.js';
export { migrateLeasePostgres, migrateLeaseSqlite } from './migrate.js';
export { runWorker } from './runner/run-worker.js';
export type { RunWorkerOptions, KindOptions } from './runner/options.js';
export type { JobContext, JobHandler, JobView, LeaseWorker, PayloadSchema, StopOptions } from './runner/types.js';
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
export type { KindCounters, KindGauges, LeaseMetrics, LossCause } from './metrics.js';
// Prometheus (prom-client) and OpenTelemetry (optional peer): docs/metrics.md.
export { leaseMetricsRegistry, type LeaseMetricsRegistryOptions } from './prometheus.js';
export { loadTracing } from './tracing.js';
export { backoffMs, canStartAction, checkLeaseTiming, type BackoffPolicy, type LeaseTiming } from './timing.js';
// MCP (docs/mcp.md): the fence, entity and step key in each tools/call's `_meta`.
export {
  fencedMcp,
  McpRefusalError,
  type FencedMcp,
  type FencedMcpCallParams,
  type FencedMcpOptions,
  type McpClientLike,
  type McpRequestOptionsLike,
  type McpToolCallParams,
} from './mcp.js';
// MCP tasks (2025-11-25): a tool call run as a task, created, polled within the lease, its result fetched.
export { fencedMcpTasks, type FencedMcpTaskOptions, type FencedMcpTaskParams, type FencedMcpTasks, type McpRequestClientLike } from './mcp-tasks.js';
export { MCP_ERROR_CODES, MCP_META } from '../protocol/mcp.js';
export {
  advanceStage,
  dispatchToolCalls,
  followStages,
  parseTools,
  toolJobKey,
  toolKinds,
  type AdvanceAnswer,
  type AnthropicToolUse,
  type DispatchAnswer,
  type DispatchOptions,
  type OpenAiToolCall,
  type PlainToolCall,
  type ProposedToolCall,
  type RefusalCode,
  type StagePayload,
  type ToolConfig,
  type ToolLimits,
  type ToolsInput,
  type ToolStageConfig,
} from './dispatch.js';
