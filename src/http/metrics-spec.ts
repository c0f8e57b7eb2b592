/**
 * The gateway's metrics: names, help, labels and buckets, in one table that
 * both backends read (./metrics-text.ts on every runtime, ./metrics-node.ts
 * with prom-client on Node), so a dashboard works unchanged on either.
 * Every label set is bounded: routes come from the config, outcomes and
 * reasons from the tables below, statuses are HTTP status codes.
 */
import { ERROR_CODES } from '../protocol/codes.js';
import { SWEEP_BACKLOG_CAP } from '../store/sweep.js';

/** The package version, for `fencegate_build_info` (test/metrics holds it to package.json). */
export const FENCEGATE_VERSION = '0.1.0';

export type MetricType = 'counter' | 'gauge' | 'histogram';

export interface MetricSpec {
  name: string;
  help: string;
  type: MetricType;
  labels: readonly string[];
  buckets?: readonly number[];
}

const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
const FAST_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5];

const spec = (name: string, type: MetricType, labels: readonly string[], help: string, buckets?: readonly number[]): MetricSpec => ({
  name,
  type,
  labels,
  help,
  ...(buckets ? { buckets } : {}),
});

export const SPECS = {
  requests: spec(
    'fencegate_requests_total',
    'counter',
    ['route', 'outcome'],
    'Proxied requests by route and outcome (coarse: accepted, upstream_error, ...; see fencegate_decisions_total for the split).',
  ),
  decisions: spec(
    'fencegate_decisions_total',
    'counter',
    ['route', 'outcome', 'status'],
    'Proxied requests by route, decision outcome and the HTTP status answered.',
  ),
  rejections: spec('fencegate_rejections_total', 'counter', ['route', 'reason'], 'Requests refused before the upstream, by route and refusal code.'),
  toolCalls: spec('fencegate_mcp_tool_calls_total', 'counter', ['route', 'tool', 'outcome'], 'tools/call requests on mcp routes by route, tool and outcome.'),
  total: spec('fencegate_request_duration_seconds', 'histogram', ['route'], 'Time from the request to the answer, upstream included.', LATENCY_BUCKETS),
  upstream: spec('fencegate_upstream_duration_seconds', 'histogram', ['route'], 'Upstream exchange time, response body included.', LATENCY_BUCKETS),
  overhead: spec('fencegate_overhead_duration_seconds', 'histogram', ['route'], 'Time the gateway adds: total minus the upstream exchange.', FAST_BUCKETS),
  store: spec(
    'fencegate_store_duration_seconds',
    'histogram',
    ['op'],
    'One store call (admit: one admission transaction; finish: one finish), errors included.',
    FAST_BUCKETS,
  ),
  groupSize: spec(
    'fencegate_store_group_size',
    'histogram',
    [],
    'Group commit: decisions committed together in one transaction (SQLite: admissions and finishes together; PostgreSQL: the admissions, or the finishes, of one statement).',
    [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
  ),
  groupSync: spec(
    'fencegate_store_sync_duration_seconds',
    'histogram',
    [],
    'SQLite group commit at synchronous=FULL: the WAL fsync after a group, which its callers wait for.',
    FAST_BUCKETS,
  ),
  storeErrors: spec('fencegate_store_errors_total', 'counter', ['op'], 'Store calls that failed (a finish is retried while its lock lives).'),
  lateFinishes: spec(
    'fencegate_late_finishes_total',
    'counter',
    [],
    'Finishes the store discarded: the record had passed to another owner (its lock expired first).',
  ),
  inflight: spec('fencegate_inflight_requests', 'gauge', [], 'Proxied requests being handled now.'),
  storeUp: spec('fencegate_store_up', 'gauge', [], 'Whether the store answered this scrape.'),
  rejectionRows: spec('fencegate_rejection_log_rows', 'gauge', [], 'Rows in the rejection log.'),
  unknownRecords: spec('fencegate_outcome_unknown_records', 'gauge', [], 'Idempotency records waiting for an operator.'),
  asyncReplication: spec(
    'fencegate_store_async_replication',
    'gauge',
    [],
    'PostgreSQL: 1 when a failover may lose acknowledged decisions (a standby replicates asynchronously, or synchronous_commit is off/local while standbys exist), 0 when not; absent when the store cannot tell.',
  ),
  pool: spec('fencegate_store_pool_clients', 'gauge', ['state'], 'PostgreSQL pool clients: total, idle, and requests waiting for one (waiting).'),
  sweeps: spec('fencegate_sweeps_total', 'counter', ['result'], 'Sweeps run, by result.'),
  swept: spec(
    'fencegate_swept_rows_total',
    'counter',
    ['kind'],
    'Rows the sweeper deleted (dead_records: in-progress records whose lock expired, marked outcome_unknown).',
  ),
  backlog: spec(
    'fencegate_sweep_backlog_rows',
    'gauge',
    ['kind'],
    `Rows still past their retention when the last sweep stopped (0: it caught up; counted up to ${SWEEP_BACKLOG_CAP}).`,
  ),
  sweepSeconds: spec('fencegate_sweep_duration_seconds', 'gauge', [], 'How long the last sweep took.'),
  reconciles: spec(
    'fencegate_reconcile_attempts_total',
    'counter',
    ['route', 'result'],
    'Status queries for outcome_unknown records (routes with reconcile), by route and result: found, not-found (released), not-yet-trusted, unknown, error.',
  ),
  reconcileUnknown: spec(
    'fencegate_reconcile_unknown_records',
    'gauge',
    ['route', 'age'],
    'outcome_unknown records of routes with reconcile at the last background pass, by route and age since admission (under_1m, under_1h, under_1d, over_1d).',
  ),
  reconcileGaveUp: spec(
    'fencegate_reconcile_gave_up_records',
    'gauge',
    ['route'],
    'outcome_unknown records past reconcile.maxAge at the last background pass: left to an operator.',
  ),
  buildInfo: spec('fencegate_build_info', 'gauge', ['version', 'node'], 'Always 1: the fencegate version and the Node version it runs on (empty off Node).'),
} as const satisfies Record<string, MetricSpec>;

/** Decision code → the coarse `outcome` of fencegate_requests_total (kept as it was; 400s and 413 are `invalid`). */
const COARSE: Record<string, string> = {
  forwarded: 'accepted',
  'forwarded-released': 'accepted',
  // asyncReply (DESIGN §3.12): a 202 kept as the interim answer, and its replay to a retry.
  'forwarded-interim': 'accepted',
  'interim-replayed': 'replayed',
  // An mcp task call followed to its end (../mcp/tasks.ts): recorded with the task's result, or unknown.
  'task-completed': 'accepted',
  'task-failed': 'accepted',
  'task-cancelled': 'accepted',
  'task-unknown': 'upstream_error',
  'task-lock-lost': 'upstream_error',
  passed: 'passed',
  'passed-read-only': 'passed',
  // An mcp client's cancel of a call in flight, answered by the gateway (../mcp/resume.ts).
  'cancel-withheld': 'passed',
  'upstream-no-response': 'upstream_error',
  replayed: 'replayed',
  'stale-fence': 'stale',
  'idempotency-key-reused': 'mismatch',
  'idempotency-in-progress': 'in_progress',
  'entity-busy': 'busy',
  'outcome-unknown': 'unknown',
  'upstream-unavailable': 'upstream_error',
  'upstream-timeout': 'upstream_error',
  'upstream-response-too-large': 'upstream_error',
  'upstream-response-too-large-released': 'upstream_error',
  unauthorized: 'unauthorized',
  forbidden: 'forbidden',
  'tool-denied': 'tool_denied',
  'invalid-fence-signature': 'invalid_signature',
  'fence-expired': 'fence_expired',
  'store-unavailable': 'store_error',
  'admission-expired': 'admission_expired',
  'no-route': 'no_route',
  'internal-error': 'internal_error',
};

/**
 * Decision code → the `outcome` of fencegate_decisions_total, and the status
 * it always answers (null: the upstream's status, or varies). The upstream
 * failures carry their status in the name, since what a caller may do next
 * differs: 502 nothing was sent (retry), 504 the outcome is unknown.
 */
const FINE: Record<string, [string, number | null]> = {
  forwarded: ['forwarded', null],
  'forwarded-released': ['released', null],
  'forwarded-interim': ['forwarded', null],
  'interim-replayed': ['replayed', null],
  // The agent had the task's handle (its status); the record has the task's result, or is unknown.
  'task-completed': ['forwarded', null],
  'task-failed': ['forwarded', null],
  'task-cancelled': ['forwarded', null],
  'task-unknown': ['unknown_504', null],
  'task-lock-lost': ['unknown_504', null],
  passed: ['passed', null],
  'passed-read-only': ['passed', null],
  'cancel-withheld': ['passed', null],
  replayed: ['replayed', null],
  'stale-fence': ['stale', 409],
  'idempotency-key-reused': ['mismatch', 422],
  'idempotency-in-progress': ['in_progress', 409],
  'entity-busy': ['busy', 409],
  'outcome-unknown': ['outcome_unknown', 409],
  'upstream-unavailable': ['unavailable_502', 502],
  'upstream-timeout': ['unknown_504', 504],
  'upstream-no-response': ['unknown_504', 504],
  'upstream-response-too-large': ['too_large_502', 502],
  'upstream-response-too-large-released': ['too_large_502', 502],
  'admission-expired': ['admission_expired_503', 503],
  'store-unavailable': ['store_unavailable_503', 503],
  unauthorized: ['unauthorized', 401],
  forbidden: ['forbidden', 403],
  // An mcp route's refusal: a JSON-RPC error in a 200 (docs/mcp.md "Allowed tools").
  'tool-denied': ['tool_denied', 200],
  'invalid-fence-signature': ['invalid_signature', 401],
  'fence-expired': ['fence_expired', 409],
  'no-route': ['no_route', 404],
  'internal-error': ['internal_error', 500],
};

const base = (decision: string) => decision.replace(/-after-takeover$/, '');

/** Decision code → coarse `outcome` label (fencegate_requests_total). */
export function outcomeOf(decision: string): string {
  return COARSE[base(decision)] ?? 'invalid';
}

/** Decision code → fine `outcome` label (fencegate_decisions_total). */
export function decisionOutcomeOf(decision: string): string {
  return FINE[base(decision)]?.[0] ?? 'invalid';
}

/** The decisions that let the request through (or answered it from the record): not rejections. */
const NOT_REJECTED = new Set([
  'forwarded',
  'forwarded-released',
  'forwarded-interim',
  'passed',
  'passed-read-only',
  'cancel-withheld',
  'replayed',
  'interim-replayed',
]);

/**
 * A refusal code, as the `reason` of fencegate_rejections_total, or null
 * when the request was not refused before the upstream (it went through,
 * was replayed, or the upstream failed). Unknown codes (never expected)
 * fold into `invalid-request` to keep the label set closed.
 */
export function rejectionReasonOf(decision: string): string | null {
  const d = base(decision);
  if (NOT_REJECTED.has(d) || d.startsWith('upstream-')) return null;
  return d in ERROR_CODES ? d : 'invalid-request';
}

/** The series initialised at zero per route, so that `increase()` sees the first one. */
export function knownDecisionSeries(): [outcome: string, status: string][] {
  const seen = new Map<string, string>();
  for (const [outcome, status] of Object.values(FINE)) if (status !== null) seen.set(outcome, String(status));
  seen.set('invalid', '400');
  return [...seen];
}

export const KNOWN_COARSE = [...new Set([...Object.values(COARSE), 'invalid'])];

/** Refusal reasons a proxied request on a route can have (the admin API's own codes excluded). */
export const KNOWN_REASONS = Object.keys(ERROR_CODES).filter(
  (c) => !c.startsWith('upstream-') && !['not-found', 'admin-disabled', 'not-outcome-unknown', 'no-route'].includes(c),
);
