/**
 * One claimed attempt, from the claim to its end (DESIGN §6): the handler
 * runs, the heartbeat thread's reports update the lease, and exactly one of
 * settle (the handler's outcome), the stage timeout or a release ends it and
 * frees its slot.
 *
 * Who decides what:
 * - the database decides ownership: every commit is conditional, and a
 *   refusal is reported (`result_rejected`), never retried or overridden;
 * - the heartbeat thread decides whether the lease is still *confirmed*
 *   (shared `LeaseCell`), which gates every new external action;
 * - this module decides when an attempt ends (handler returned or threw,
 *   `maxRunMs` passed, `stop({ release })`).
 *
 * Everything it needs from the worker comes through `AttemptContext`, so the
 * lifecycle can be driven with plain objects in a test.
 */
import { LeaseError, LeaseLostError } from '../errors.js';
import type { LeaseEvent } from '../events.js';
import { LeaseStatus, type LossCause } from '../heartbeat/cell.js';
import { leaseKey, type FromThread } from '../heartbeat/protocol.js';
import { sha256Json } from '../store-common.js';
import { backoffMs, monotonicMs } from '../timing.js';
import { startAttemptSpan } from '../tracing.js';
import type { ClaimResult, JobErrorInfo, Lease } from '../types.js';
import type { Attempt, AttemptContext } from './attempt-types.js';
import { abortAttempt } from './abort.js';
import { classify } from './classify.js';
import { fenceContext, jobContext } from './job-context.js';

type Outcome = { ok: true; value: unknown } | { ok: false; error: unknown };

/** The fields every event about this attempt carries. */
function fields(ctx: AttemptContext, a: Attempt) {
  return {
    at: new Date(),
    workerId: ctx.workerId,
    jobId: a.lease.id,
    kind: a.lease.kind,
    fencingToken: a.lease.fencingToken,
  };
}

/** Starts a claimed attempt: watched by the heartbeats, its handler running, its stage timer set. */
export function startAttempt(outer: AttemptContext, lease: Lease, claimSentAt: number): Attempt {
  // The attempt's own events also tell its span how it ended.
  const ctx: AttemptContext = Object.create(outer, { emit: { value: (e: LeaseEvent) => (a.span.note(e), outer.emit(e)) } });
  const kind = ctx.config.kinds[lease.kind]!;
  // Watched from here on, with its own cell. Conservative: the database's now
  // was no earlier than when we sent the claim.
  const cell = ctx.heartbeats.watch(lease, kind.maxStallMs, claimSentAt + lease.leaseMs);
  const a: Attempt = {
    key: leaseKey(lease),
    lease,
    cell,
    controller: undefined,
    aborted: false,
    abortReason: undefined,
    leaseUntil: lease.leaseUntil,
    lastOkAt: monotonicMs(),
    stageTimer: undefined,
    ended: false,
    lossReported: false,
    inFlight: new Set(),
    span: startAttemptSpan(lease, ctx.workerId, claimSentAt),
  };
  ctx.active.set(a.key, a);
  ctx.emit({
    type: 'job_claimed',
    ...fields(ctx, a),
    attempt: lease.attempt,
    leaseUntil: lease.leaseUntil,
    payloadSha256: lease.payloadSha256,
    previousOwnerId: lease.previousOwnerId,
  });
  a.stageTimer = setTimeout(() => void onStageTimeout(ctx, a, kind.maxRunMs), kind.maxRunMs);
  void runHandler(ctx, a).then((outcome) => settle(ctx, a, outcome));
  return a;
}

/** A report of the heartbeat thread about an active attempt. */
export function onHeartbeatReport(ctx: AttemptContext, message: FromThread): void {
  if (!('key' in message)) return;
  const a = ctx.active.get(message.key);
  if (!a) return; // a late report for an attempt that already ended
  switch (message.type) {
    case 'ok':
      a.leaseUntil = message.leaseUntil;
      a.lastOkAt = monotonicMs();
      ctx.emit({ type: 'heartbeat_ok', ...fields(ctx, a), leaseUntil: message.leaseUntil, latencyMs: message.latencyMs });
      break;
    case 'failed':
      ctx.emit({ type: 'heartbeat_failed', ...fields(ctx, a), error: message.error, consecutive: message.consecutive });
      break;
    case 'unknown':
      ctx.emit({
        type: 'ownership_unknown',
        ...fields(ctx, a),
        confirmedForMs: message.confirmedForMs,
        consecutiveFailures: message.consecutive,
        lastConfirmedLeaseUntil: a.leaseUntil,
        inFlight: [...a.inFlight],
      });
      break;
    case 'lost':
    case 'stalled':
      reportLoss(ctx, a);
      break;
  }
}

const LOSS_TEXT: Record<LossCause, string> = {
  zero_rows: 'a heartbeat matched no row (a newer owner, a cancel, or it expired)',
  unconfirmed: 'no heartbeat succeeded before the conservative deadline',
  stalled: "heartbeats stopped: the handler's thread was blocked past maxStallMs",
  stale_fence: 'the gateway refused the fence: a newer owner holds it',
  thread_exit: 'the heartbeat thread died',
};

/**
 * If the cell says the lease is gone (Lost or Stalled, set by whoever
 * noticed first, in shared memory), emit heartbeat_lost once and abort the
 * handler. Called on the thread's message and again when the attempt ends,
 * because that message may still be queued behind a handler that just woke.
 */
export function reportLoss(ctx: AttemptContext, a: Attempt): void {
  const status = a.cell.status;
  if (a.lossReported || (status !== LeaseStatus.Lost && status !== LeaseStatus.Stalled)) return;
  a.lossReported = true;
  const cause = a.cell.cause ?? 'zero_rows';
  ctx.emit({ type: 'heartbeat_lost', ...fields(ctx, a), cause });
  abortAttempt(a, new LeaseLostError(`job ${a.lease.id} (fence ${a.lease.fencingToken}): lease lost, ${LOSS_TEXT[cause]}`));
}

async function runHandler(ctx: AttemptContext, a: Attempt): Promise<Outcome> {
  const handler = ctx.config.handlers[a.lease.kind]!;
  // Built when the handler first uses a fenced action (./job-context.ts).
  const fence = () =>
    fenceContext(ctx, a, (cause) => {
      a.cell.end(LeaseStatus.Lost, cause);
      ctx.heartbeats.unwatch(a.key, a.cell);
      reportLoss(ctx, a);
    });
  try {
    return { ok: true, value: await a.span.run(async () => handler.run(jobContext(ctx, a, fence))) };
  } catch (error) {
    return { ok: false, error };
  }
}

/**
 * Ends the attempt's heartbeats and reports what the lease looked like at
 * that moment. Returns undefined if the attempt had already ended.
 */
function endAttempt(ctx: AttemptContext, a: Attempt): { lost: boolean } | undefined {
  if (a.ended) return undefined;
  a.ended = true;
  clearTimeout(a.stageTimer);
  reportLoss(ctx, a);
  const lost = a.cell.status === LeaseStatus.Lost;
  a.cell.end(LeaseStatus.Released);
  // After the cell ended: an ended cell is dropped by the thread itself, without a message.
  ctx.heartbeats.unwatch(a.key, a.cell);
  return { lost };
}

/** The attempt leaves its slot; `refilled`: the next job's attempt already took it, so no lane is woken for it. */
function free(ctx: AttemptContext, a: Attempt, refilled = false): void {
  a.span.end();
  ctx.active.delete(a.key);
  if (!refilled) ctx.freed();
}

const errorText = (err: unknown) => (err instanceof Error ? err.message : String(err));

async function settle(ctx: AttemptContext, a: Attempt, outcome: Outcome): Promise<void> {
  const state = endAttempt(ctx, a);
  if (!state) {
    // The attempt already ended (stage timeout, release, lost): a value
    // returned now is not stored, and we say so.
    if (outcome.ok) {
      const reason = (a.abortReason as { code?: unknown } | undefined)?.code === 'stage_timeout' ? 'stage_timeout' : 'lease_lost';
      ctx.emit({ type: 'result_rejected', ...fields(ctx, a), reason });
    }
    return;
  }
  let refilled = false;
  try {
    // Zero rows was already seen (or the gateway refused our fence): never
    // commit. Otherwise the conditional statement decides, even when the
    // heartbeats had stopped (a stall) or failed (ownership unknown).
    if (state.lost || (!outcome.ok && outcome.error instanceof LeaseLostError)) {
      ctx.emit({ type: 'result_rejected', ...fields(ctx, a), reason: 'lease_lost' });
      return;
    }
    if (outcome.ok) {
      // While the queue has work, the slot's next claim goes in the same
      // call (one statement instead of two); the complete's ownership
      // condition is the same, and a refused complete claims nothing.
      const next = ctx.nextClaim();
      let claimed: ClaimResult | undefined;
      try {
        const res = next
          ? await next.send(a.lease, outcome.value).then((both) => ((claimed = both.complete.ok ? both.claim : undefined), both.complete))
          : await ctx.store.complete(a.lease, outcome.value);
        ctx.emit(
          res.ok
            ? { type: 'result_committed', ...fields(ctx, a), resultSha256: sha256Json(outcome.value) }
            : { type: 'result_rejected', ...fields(ctx, a), reason: 'lease_lost' },
        );
      } finally {
        // After the commit's event: the next job's attempt takes this slot.
        refilled = next?.take(claimed) ?? false;
      }
      return;
    }
    const { code, retryable, message } = classify(outcome.error);
    await failAttempt(ctx, a, { code, message }, retryable);
  } catch (err) {
    // The store itself failed: the commit may or may not have happened. The
    // lease will run out and the job be claimed again with a new token.
    ctx.emit({ type: 'result_rejected', ...fields(ctx, a), reason: 'store_error', error: errorText(err) });
  } finally {
    free(ctx, a, refilled);
  }
}

async function failAttempt(ctx: AttemptContext, a: Attempt, error: JobErrorInfo, retryable: boolean): Promise<void> {
  const res = await ctx.store.fail(a.lease, error, { retryable, backoffMs: backoffMs(a.lease.attempt, ctx.config.retry) });
  if (!res.ok) {
    ctx.emit({ type: 'result_rejected', ...fields(ctx, a), reason: 'lease_lost' });
  } else if (res.state === 'queued') {
    ctx.emit({ type: 'job_failed', ...fields(ctx, a), reason: error.code, errorCode: error.code, terminal: false, retryAt: res.runAfter });
  } else {
    ctx.emit({ type: 'job_failed', ...fields(ctx, a), reason: res.reason, errorCode: error.code, terminal: true });
  }
}

/**
 * The attempt ran past its kind's maxRunMs. Heartbeats may be fine; the
 * run time is a separate limit (a browser stuck on a modal heartbeats
 * forever). Abort the handler and fail the attempt while we still own it.
 */
async function onStageTimeout(ctx: AttemptContext, a: Attempt, maxRunMs: number): Promise<void> {
  const state = endAttempt(ctx, a);
  if (!state) return;
  abortAttempt(a, new LeaseError('stage_timeout', `job ${a.lease.id}: ran past maxRunMs (${maxRunMs} ms)`));
  try {
    if (state.lost) {
      ctx.emit({ type: 'result_rejected', ...fields(ctx, a), reason: 'lease_lost' });
      return;
    }
    await failAttempt(ctx, a, { code: 'stage_timeout', message: `ran past maxRunMs (${maxRunMs} ms)` }, true);
  } catch (err) {
    ctx.emit({ type: 'result_rejected', ...fields(ctx, a), reason: 'store_error', error: errorText(err) });
  } finally {
    // The slot is free even if the handler ignores the signal and never returns.
    free(ctx, a);
  }
}

/** `stop({ release: true })`: abort the handler and give the job back now. */
export async function releaseAttempt(ctx: AttemptContext, a: Attempt): Promise<void> {
  const state = endAttempt(ctx, a);
  if (!state) return;
  abortAttempt(a, new LeaseError('worker_stopping', `job ${a.lease.id}: the worker is stopping`));
  try {
    if (!state.lost) await ctx.store.release(a.lease);
  } catch {
    // The lease runs out on its own; the job is claimed again after it.
  } finally {
    free(ctx, a);
  }
}
