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
    signal: a.controller.signal,
    leaseUntil: () => a.leaseUntil,
    assertCanStart() {
      if (a.controller.signal.aborted) {
        const reason = a.controller.signal.reason;
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
 * first (throws a non-retryable `JobError` when it does not match).
 */
export function jobContext(ctx: AttemptContext, a: Attempt, fence: FenceContext): JobContext<unknown> {
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
  return {
    job,
    signal: a.controller.signal,
    fencedFetch: createFencedFetch(fence, {
      ...(config.fetch ? { fetch: config.fetch } : {}),
      ...(config.fenceHeaders ? { headers: config.fenceHeaders } : {}),
      ...(config.fenceSigner ? { fenceSigner: config.fenceSigner } : {}),
    }),
    step: createStep(fence, config.fenceSigner ? { fenceSigner: config.fenceSigner } : {}),
    mcp: (client) => fencedMcp(client, fence, config.fenceSigner ? { fenceSigner: config.fenceSigner } : {}),
  };
}
