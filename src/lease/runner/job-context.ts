/**
 * What a handler sees of its attempt: the job, the abort signal, and the
 * fenced actions, each gated by the lease cell the heartbeat thread keeps
 * (DESIGN §6).
 */
import { JobError, LeaseLostError, OwnershipUnknownError } from '../errors.js';
import { createFencedFetch, createStep, type FenceContext } from '../fenced-fetch.js';
import { LeaseStatus } from '../heartbeat/cell.js';
import { fencedMcp } from '../mcp.js';
import { canStartAction, monotonicMs } from '../timing.js';
import { signalOf } from './abort.js';
import type { Attempt, AttemptContext } from './attempt-types.js';
import type { JobContext } from './types.js';

/**
 * The fence context of one attempt. `markLost` is the attempt's own way of
 * ending the lease when the gateway refuses its fence.
 */
export function fenceContext(ctx: AttemptContext, a: Attempt, markLost: FenceContext['markLost']): FenceContext {
  const { heartbeatMs } = ctx.config;
  return {
    workerId: ctx.workerId,
    jobId: a.lease.id,
    kind: a.lease.kind,
    fencingToken: a.lease.fencingToken,
    jobKey: a.lease.jobKey,
    fenceKey: a.lease.fenceKey,
    get signal() {
      return signalOf(a);
    },
    leaseUntil: () => a.leaseUntil,
    assertCanStart() {
      if (a.aborted) {
        const reason = a.abortReason;
        throw reason instanceof Error ? reason : new LeaseLostError(`job ${a.lease.id}: the attempt has ended`);
      }
      const status = a.cell.status;
      if (status !== LeaseStatus.Ok && status !== LeaseStatus.Unknown) {
        throw new LeaseLostError(`job ${a.lease.id} (fence ${a.lease.fencingToken}): the lease is no longer held`);
      }
      const now = monotonicMs();
      if (status === LeaseStatus.Unknown || !canStartAction(a.cell.confirmedUntil, now, heartbeatMs)) {
        throw new OwnershipUnknownError(
          `job ${a.lease.id} (fence ${a.lease.fencingToken}): the lease is confirmed for ${a.cell.confirmedUntil - now} ms, ` +
            `less than one heartbeat (${heartbeatMs} ms); no new external action may start`,
        );
      }
    },
    // The confirmed lease left less one heartbeat: a wait that ends by then still passes assertCanStart.
    waitableMs: () => a.cell.confirmedUntil - monotonicMs() - heartbeatMs,
    markLost,
    emit: (event) => ctx.emit(event),
    started(request) {
      a.inFlight.add(request);
      return () => a.inFlight.delete(request);
    },
  };
}

/**
 * The handler's context: the payload validated against the kind's schema
 * first (throws a non-retryable `JobError` when it does not match). The
 * signal and the fenced actions are made when the handler first reads them
 * (`fence` builds the attempt's fence context then): a handler that uses
 * none of them costs none of them.
 */
export function jobContext(ctx: AttemptContext, a: Attempt, fence: () => FenceContext): JobContext<unknown> {
  const { config } = ctx;
  const handler = config.handlers[a.lease.kind]!;
  let payload = a.lease.payload;
  if (handler.schema) {
    const parsed = handler.schema.safeParse(payload);
    if (!parsed.success) {
      throw new JobError('invalid_payload', `payload does not match the ${a.lease.kind} schema: ${String(parsed.error)}`, {
        retryable: false,
      });
    }
    payload = parsed.data;
  }
  const job = {
    id: a.lease.id,
    kind: a.lease.kind,
    attempt: a.lease.attempt,
    maxAttempts: a.lease.maxAttempts,
    fencingToken: a.lease.fencingToken,
    jobKey: a.lease.jobKey,
    fenceKey: a.lease.fenceKey,
    idempotencyKey: a.lease.idempotencyKey,
    payload,
    payloadSha256: a.lease.payloadSha256,
    deadlineAt: a.lease.deadlineAt,
    get leaseUntil() {
      return a.leaseUntil;
    },
  };
  let fenced: FenceContext | undefined;
  const fenceOnce = () => (fenced ??= fence());
  const signer = config.fenceSigner ? { fenceSigner: config.fenceSigner } : {};
  let fencedFetch: JobContext<unknown>['fencedFetch'] | undefined;
  let step: JobContext<unknown>['step'] | undefined;
  let mcp: JobContext<unknown>['mcp'] | undefined;
  return {
    job,
    get signal() {
      return signalOf(a);
    },
    get fencedFetch() {
      return (fencedFetch ??= createFencedFetch(fenceOnce(), {
        ...(config.fetch ? { fetch: config.fetch } : {}),
        ...(config.fenceHeaders ? { headers: config.fenceHeaders } : {}),
        ...signer,
      }));
    },
    get step() {
      return (step ??= createStep(fenceOnce(), signer));
    },
    get mcp() {
      return (mcp ??= (client) => fencedMcp(client, fenceOnce(), signer));
    },
  };
}
