/**
 * OpenTelemetry spans for fencegate/lease, when `@opentelemetry/api` is
 * installed and loaded (`loadTracing()`, which `runWorker` need not wait
 * for: an attempt claimed before it loaded is simply not traced). One span
 * per attempt (`fencegate.lease.attempt`), a `fencegate.lease.claim` child
 * for the claim's round trip, and a `fencegate.lease.tool_request` child per
 * `fencedFetch` / `step`, whose context `fencedFetch` sends as `traceparent`.
 * The handler runs inside the attempt's context, so the user's own spans nest
 * under it when a context manager is registered (the Node SDK's is).
 *
 * Attributes: job id, kind, attempt, fence, entity (fence key), idempotency
 * key, request id, step, method, path; never payloads, results, bodies or
 * query strings.
 */
import { clean, loadTracing as load, otel, type Attributes } from '../observe/tracing.js';
import type { LeaseEvent } from './events.js';
import type { Lease } from './types.js';
import { monotonicMs } from './timing.js';

export { loadTracing } from '../observe/tracing.js';

// Started on import, so that it has loaded by the first claim (runWorker first starts its heartbeat thread);
// `await loadTracing()` before runWorker makes sure of it.
void load();

export interface AttemptSpan {
  /** Runs the handler with this attempt as the active span. */
  run<T>(fn: () => Promise<T>): Promise<T>;
  /** Records the attempt's result from its terminal event. */
  note(event: LeaseEvent): void;
  end(): void;
}

export interface ToolSpan {
  /** Sets `traceparent` (and `tracestate`) on the request's headers to this span's context. */
  inject(headers: Headers): void;
  end(status: number | null, error?: unknown, decision?: string): void;
}

const NOOP_ATTEMPT: AttemptSpan = { run: (fn) => fn(), note() {}, end() {} };
const NOOP_TOOL: ToolSpan = { inject() {}, end() {} };

const RESULTS: Partial<Record<LeaseEvent['type'], (e: any) => string>> = {
  result_committed: () => 'committed',
  result_rejected: (e) => `rejected:${e.reason}`,
  job_failed: (e) => (e.terminal ? `failed:${e.errorCode}` : `retry:${e.errorCode}`),
  heartbeat_lost: (e) => `lost:${e.cause}`,
};

/**
 * The span of one claimed attempt, started back at the moment the claim was
 * sent (`claimSentAt`, monotonic), so the claim's round trip is its first child.
 */
export function startAttemptSpan(lease: Lease, workerId: string, claimSentAt: number): AttemptSpan {
  const o = otel();
  if (o === null) return NOOP_ATTEMPT;
  const tracer = o.trace.getTracer('fencegate/lease');
  const claimedAt = Date.now();
  const sentAt = claimedAt - Math.max(0, monotonicMs() - claimSentAt);
  const attrs = clean({
    'fencegate.job_id': lease.id,
    'fencegate.job_kind': lease.kind,
    'fencegate.attempt': lease.attempt,
    'fencegate.fence': lease.fencingToken,
    'fencegate.entity': lease.fenceKey,
    'fencegate.worker_id': workerId,
    'fencegate.reclaimed': lease.previousOwnerId !== null,
  });
  const span = tracer.startSpan('fencegate.lease.attempt', { kind: o.SpanKind.CONSUMER, attributes: attrs, startTime: sentAt });
  if (!span.isRecording()) return NOOP_ATTEMPT;
  const ctx = o.trace.setSpan(o.context.active(), span);
  tracer.startSpan('fencegate.lease.claim', { attributes: attrs, startTime: sentAt }, ctx).end(claimedAt);
  let result: string | undefined;
  return {
    run: (fn) => o.context.with(ctx, fn),
    note(e) {
      const r = RESULTS[e.type]?.(e);
      // The first terminal word wins: a loss, then the rejection it causes, is a loss.
      if (r !== undefined) result ??= r;
    },
    end() {
      span.setAttribute('fencegate.decision', result ?? 'released');
      if (result !== undefined && result !== 'committed') span.setStatus({ code: o.SpanStatusCode.ERROR, message: result });
      span.end();
    },
  };
}

/** The span of one external action, a child of the active context (the attempt, or the user's span inside it). */
export function startToolSpan(fields: {
  jobId: number;
  kind: string;
  fencingToken: number;
  fenceKey: string;
  step: string;
  idempotencyKey: string;
  requestId: string;
  method?: string;
  url?: URL;
}): ToolSpan {
  const o = otel();
  if (o === null) return NOOP_TOOL;
  const attributes: Attributes = {
    'fencegate.job_id': fields.jobId,
    'fencegate.job_kind': fields.kind,
    'fencegate.fence': fields.fencingToken,
    'fencegate.entity': fields.fenceKey,
    'fencegate.step': fields.step,
    'fencegate.idempotency_key': fields.idempotencyKey,
    'fencegate.request_id': fields.requestId,
    'http.request.method': fields.method,
    // Origin and path: a query string may carry secrets.
    'server.address': fields.url?.hostname,
    'url.path': fields.url?.pathname,
  };
  const span = o.trace.getTracer('fencegate/lease').startSpan('fencegate.lease.tool_request', { kind: o.SpanKind.CLIENT, attributes: clean(attributes) });
  if (!span.isRecording()) return NOOP_TOOL;
  return {
    inject(headers) {
      o.propagation.inject(o.trace.setSpan(o.context.active(), span), headers, { set: (h, k, v) => h.set(k, v) });
    },
    end(status, error, decision) {
      if (status !== null) span.setAttribute('http.response.status_code', status);
      if (decision !== undefined) span.setAttribute('fencegate.decision', decision);
      if (error !== undefined) span.setStatus({ code: o.SpanStatusCode.ERROR, message: error instanceof Error ? error.name : 'error' });
      span.end();
    },
  };
}
