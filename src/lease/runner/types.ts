import type { FencedFetch, StepFn } from '../fenced-fetch.js';
import type { FencedMcp, McpClientLike } from '../mcp.js';
import type { LeaseEvents } from '../events.js';
import type { LeaseMetrics } from '../metrics.js';

/** What a handler sees of its job. */
export interface JobView<P = unknown> {
  id: number;
  kind: string;
  attempt: number;
  maxAttempts: number;
  fencingToken: number;
  /** `tool-job:<storeId>:<id>`: each step's `Idempotency-Key` is `<jobKey>:<step>`. */
  jobKey: string;
  /** The fence entity (`X-Fence-Entity`): the custom key given at enqueue, else the `jobKey`. */
  fenceKey: string;
  idempotencyKey: string;
  payload: P;
  payloadSha256: string;
  deadlineAt: Date | null;
  /** The latest lease end the database confirmed. */
  readonly leaseUntil: Date;
}

export interface JobContext<P = unknown> {
  job: JobView<P>;
  /**
   * Aborts when the lease is lost (its reason is a `LeaseLostError`), when the
   * attempt runs past the kind's `maxRunMs` (a `LeaseError` with code
   * `stage_timeout`) or when the worker releases its jobs on `stop`.
   */
  signal: AbortSignal;
  fencedFetch: FencedFetch;
  step: StepFn;
  /**
   * Wraps an MCP client (e.g. the SDK's `Client`) so that each `callTool`
   * carries this attempt's fence, entity and step key in `params._meta`
   * (see `fencedMcp`), signed with the worker's `fenceSigner` if any.
   */
  mcp<C extends McpClientLike>(client: C): FencedMcp<C>;
}

/** What a handler's optional `schema` must offer (a zod schema does). */
export interface PayloadSchema<P = unknown> {
  safeParse(value: unknown): { success: true; data: P } | { success: false; error: unknown };
}

/**
 * A job handler: a function of the context, or `{ schema, run }` to have the
 * payload validated first (a failed validation ends the job, never retried).
 * Its return value is the job's result (stored as JSON); throwing fails the
 * attempt (retried after a backoff unless it is a `JobError` with
 * `retryable: false` or a validation error).
 */
export type JobHandler<P = unknown, R = unknown> =
  | ((ctx: JobContext<P>) => Promise<R> | R)
  | { schema?: PayloadSchema<P>; run: (ctx: JobContext<P>) => Promise<R> | R };

export interface StopOptions {
  /**
   * `false` (default): let running jobs finish, heartbeats continue.
   * `true`: abort their handlers and give the jobs back to the queue now.
   */
  release?: boolean;
  /** With `release: false`, release whatever is still running after this long. */
  timeoutMs?: number;
}

export interface LeaseWorker {
  readonly workerId: string;
  readonly events: LeaseEvents;
  metrics(): LeaseMetrics;
  /** Stops claiming and ends the worker (see `StopOptions`). Idempotent: later calls get the same promise. */
  stop(options?: StopOptions): Promise<void>;
  /** Settles when the worker has stopped, with the fault that stopped it (the heartbeat thread died) or undefined. */
  readonly closed: Promise<Error | undefined>;
}
