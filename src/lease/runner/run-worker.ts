/**
 * `runWorker`: claims jobs, runs their handlers, keeps their leases alive
 * from a heartbeat thread, and commits results only through the
 * ownership-conditional statements of the store (DESIGN §6).
 *
 * Who decides what:
 * - the database decides ownership: every commit is conditional, and a
 *   refusal is reported (`result_rejected`), never retried or overridden;
 * - the heartbeat thread decides whether the lease is still *confirmed*
 *   (shared `LeaseCell`), which gates every new external action;
 * - this thread decides when an attempt ends (handler returned or threw,
 *   `maxRunMs` passed, `stop({ release })`).
 */
import { JobError, LeaseError, LeaseLostError, OutcomeUnknownError, OwnershipUnknownError } from '../errors.js';
import { LeaseEvents, type InFlightRequest, type LeaseEvent } from '../events.js';
import { createFencedFetch, createStep, type FenceContext } from '../fenced-fetch.js';
import { HeartbeatThread } from '../heartbeat/client.js';
import { LeaseCell, LeaseStatus, Pulse, type LossCause } from '../heartbeat/cell.js';
import { leaseKey, type FromThread } from '../heartbeat/protocol.js';
import { countEvents, type KindGauges, type LeaseMetrics } from '../metrics.js';
import { sha256Json } from '../store-common.js';
import { backoffMs, canStartAction, monotonicMs } from '../timing.js';
import type { JobErrorInfo, Lease } from '../types.js';
import { parseWorkerOptions, type RunWorkerOptions } from './options.js';
import type { JobContext, LeaseWorker, StopOptions } from './types.js';

/** One claimed attempt. */
interface Attempt {
  key: string;
  lease: Lease;
  cell: LeaseCell;
  controller: AbortController;
  /** The latest lease end the database confirmed. */
  leaseUntil: Date;
  /** Monotonic time of the last successful heartbeat (or the claim). */
  lastOkAt: number;
  stageTimer: NodeJS.Timeout | undefined;
  /** Set once the attempt's outcome is decided; a later handler outcome is ignored. */
  ended: boolean;
  /** heartbeat_lost was emitted (once per attempt, whoever notices first). */
  lossReported: boolean;
  /** External actions started and not yet settled, for ownership_unknown. */
  inFlight: Set<InFlightRequest>;
}

type Outcome = { ok: true; value: unknown } | { ok: false; error: unknown };

const MAX_ERROR_MESSAGE = 1_000;

/** Maps a handler's error to the stored error code and whether a retry may help. */
function classify(error: unknown): { code: string; retryable: boolean; message: string } {
  const message = (error instanceof Error ? error.message : String(error)).slice(0, MAX_ERROR_MESSAGE);
  if (error instanceof JobError) return { code: error.code, retryable: error.retryable, message };
  // Validation errors never get better by retrying.
  if (error instanceof Error && error.name === 'ZodError') return { code: 'invalid_payload', retryable: false, message };
  if (error instanceof OwnershipUnknownError) return { code: 'ownership_unknown', retryable: true, message };
  // Retried with the same step names, hence the same idempotency keys.
  if (error instanceof OutcomeUnknownError) return { code: 'outcome_unknown', retryable: true, message };
  return { code: 'handler_error', retryable: true, message };
}

/**
 * Starts a worker. Resolves once its heartbeat thread has its own database
 * connection; rejects with a `LeaseConfigError` naming the field when the
 * options cannot work (e.g. `leaseMs ≤ maxMissedHeartbeats × heartbeatMs + jitterMs`).
 *
 * @example
 * const worker = await runWorker({
 *   store, workerId: `billing-${process.pid}`,
 *   leaseMs: 30_000, heartbeatMs: 5_000, maxMissedHeartbeats: 3, jitterMs: 1_000,
 *   kinds: { payment: { maxRunMs: 120_000 } },
 *   handlers: {
 *     payment: async ({ job, fencedFetch }) => {
 *       const res = await fencedFetch('http://127.0.0.1:8080/payments/charges', { step: 'charge', method: 'POST', body: JSON.stringify(job.payload) });
 *       return { status: res.status };
 *     },
 *   },
 * });
 * process.on('SIGTERM', () => void worker.stop());
 */
export async function runWorker(options: RunWorkerOptions): Promise<LeaseWorker> {
  const config = parseWorkerOptions(options);
  const { store, workerId } = config;
  const events = options.events ?? new LeaseEvents();
  const counters = countEvents(events);
  const active = new Map<string, Attempt>();
  const leaseMsByKind = Object.fromEntries(Object.entries(config.kinds).map(([kind, k]) => [kind, k.leaseMs]));

  // The handler thread's pulse: if this interval stops firing, the event loop
  // is blocked and the heartbeat thread stops extending (see heartbeat/thread.ts).
  const pulse = new Pulse();
  const pulseTimer = setInterval(() => pulse.tick(), config.pulseMs);
  pulseTimer.unref();

  let fatal: Error | undefined;
  let thread: HeartbeatThread;
  try {
    thread = await HeartbeatThread.start(
      {
        store: config.threadStore,
        pulse: pulse.buffer,
        heartbeatMs: config.heartbeatMs,
        jitterMs: config.jitterMs,
        maxMissedHeartbeats: config.maxMissedHeartbeats,
        timeoutMs: config.heartbeatTimeoutMs,
      },
      {
        ...(config.threadExecArgv ? { execArgv: config.threadExecArgv } : {}),
        onMessage: (message) => onThreadMessage(message),
        onCrash: (error) => onThreadCrash(error),
      },
    );
  } catch (err) {
    clearInterval(pulseTimer);
    throw err;
  }

  const fields = (a: Attempt) => ({
    at: new Date(),
    workerId,
    jobId: a.lease.id,
    kind: a.lease.kind,
    fencingToken: a.lease.fencingToken,
  });
  const emit = (event: LeaseEvent) => events.emit(event);

  // --- the heartbeat thread's reports -------------------------------------

  function onThreadMessage(message: FromThread): void {
    if (!('key' in message)) return;
    const a = active.get(message.key);
    if (!a) return; // a late report for an attempt that already ended
    switch (message.type) {
      case 'ok':
        a.leaseUntil = message.leaseUntil;
        a.lastOkAt = monotonicMs();
        emit({ type: 'heartbeat_ok', ...fields(a), leaseUntil: message.leaseUntil, latencyMs: message.latencyMs });
        break;
      case 'failed':
        emit({ type: 'heartbeat_failed', ...fields(a), error: message.error, consecutive: message.consecutive });
        break;
      case 'unknown':
        emit({
          type: 'ownership_unknown',
          ...fields(a),
          confirmedForMs: message.confirmedForMs,
          consecutiveFailures: message.consecutive,
          lastConfirmedLeaseUntil: a.leaseUntil,
          inFlight: [...a.inFlight],
        });
        break;
      case 'lost':
      case 'stalled':
        reportLoss(a);
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
  function reportLoss(a: Attempt): void {
    const status = a.cell.status;
    if (a.lossReported || (status !== LeaseStatus.Lost && status !== LeaseStatus.Stalled)) return;
    a.lossReported = true;
    const cause = a.cell.cause ?? 'zero_rows';
    emit({ type: 'heartbeat_lost', ...fields(a), cause });
    a.controller.abort(new LeaseLostError(`job ${a.lease.id} (fence ${a.lease.fencingToken}): lease lost, ${LOSS_TEXT[cause]}`));
  }

  function onThreadCrash(error: Error): void {
    fatal ??= error;
    // Nobody extends these leases any more: treat them as lost, and stop.
    for (const a of active.values()) {
      a.cell.end(LeaseStatus.Lost, 'thread_exit');
      reportLoss(a);
    }
    void stop();
  }

  // --- one attempt ----------------------------------------------------------

  function fenceContext(a: Attempt): FenceContext {
    return {
      workerId,
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
        if (status === LeaseStatus.Unknown || !canStartAction(a.cell.confirmedUntil, now, config.heartbeatMs)) {
          throw new OwnershipUnknownError(
            `job ${a.lease.id} (fence ${a.lease.fencingToken}): the lease is confirmed for ${a.cell.confirmedUntil - now} ms, ` +
              `less than one heartbeat (${config.heartbeatMs} ms); no new external action may start`,
          );
        }
      },
      markLost(cause) {
        a.cell.end(LeaseStatus.Lost, cause);
        thread.unwatch(a.key);
        reportLoss(a);
      },
      emit,
      started(request) {
        a.inFlight.add(request);
        return () => a.inFlight.delete(request);
      },
    };
  }

  function startAttempt(lease: Lease, claimSentAt: number): void {
    const kind = config.kinds[lease.kind]!;
    const a: Attempt = {
      key: leaseKey(lease),
      lease,
      cell: new LeaseCell(),
      controller: new AbortController(),
      leaseUntil: lease.leaseUntil,
      lastOkAt: monotonicMs(),
      stageTimer: undefined,
      ended: false,
      lossReported: false,
      inFlight: new Set(),
    };
    // Conservative: the database's now was no earlier than when we sent the claim.
    a.cell.confirmedUntil = claimSentAt + lease.leaseMs;
    active.set(a.key, a);
    emit({
      type: 'job_claimed',
      ...fields(a),
      attempt: lease.attempt,
      leaseUntil: lease.leaseUntil,
      payloadSha256: lease.payloadSha256,
      previousOwnerId: lease.previousOwnerId,
    });
    thread.watch(a.key, lease, a.cell, kind.maxStallMs);
    a.stageTimer = setTimeout(() => void onStageTimeout(a, kind.maxRunMs), kind.maxRunMs);
    void runHandler(a).then((outcome) => settle(a, outcome));
  }

  async function runHandler(a: Attempt): Promise<Outcome> {
    const handler = config.handlers[a.lease.kind]!;
    const ctx = fenceContext(a);
    try {
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
      const context: JobContext<unknown> = {
        job,
        signal: a.controller.signal,
        fencedFetch: createFencedFetch(ctx, {
          ...(config.fetch ? { fetch: config.fetch } : {}),
          ...(config.fenceHeaders ? { headers: config.fenceHeaders } : {}),
          ...(config.fenceSigner ? { fenceSigner: config.fenceSigner } : {}),
        }),
        step: createStep(ctx, config.fenceSigner ? { fenceSigner: config.fenceSigner } : {}),
      };
      return { ok: true, value: await handler.run(context) };
    } catch (error) {
      return { ok: false, error };
    }
  }

  /**
   * Ends the attempt's heartbeats and reports what the lease looked like at
   * that moment. Returns undefined if the attempt had already ended.
   */
  function endAttempt(a: Attempt): { lost: boolean } | undefined {
    if (a.ended) return undefined;
    a.ended = true;
    clearTimeout(a.stageTimer);
    thread.unwatch(a.key);
    reportLoss(a);
    const lost = a.cell.status === LeaseStatus.Lost;
    a.cell.end(LeaseStatus.Released);
    return { lost };
  }

  const idleWaiters: (() => void)[] = [];
  /** Resolves when no attempt is active. */
  function idle(): Promise<void> {
    return active.size === 0 ? Promise.resolve() : new Promise((resolve) => idleWaiters.push(resolve));
  }

  function free(a: Attempt): void {
    active.delete(a.key);
    if (active.size === 0) for (const resolve of idleWaiters.splice(0)) resolve();
    wake();
  }

  async function settle(a: Attempt, outcome: Outcome): Promise<void> {
    const state = endAttempt(a);
    if (!state) {
      // The attempt already ended (stage timeout, release, lost): a value
      // returned now is not stored, and we say so.
      if (outcome.ok) emit({ type: 'result_rejected', ...fields(a), reason: a.controller.signal.reason?.code === 'stage_timeout' ? 'stage_timeout' : 'lease_lost' });
      return;
    }
    try {
      // Zero rows was already seen (or the gateway refused our fence): never
      // commit. Otherwise the conditional statement decides, even when the
      // heartbeats had stopped (a stall) or failed (ownership unknown).
      if (state.lost || (!outcome.ok && outcome.error instanceof LeaseLostError)) {
        emit({ type: 'result_rejected', ...fields(a), reason: 'lease_lost' });
        return;
      }
      if (outcome.ok) {
        const res = await store.complete(a.lease, outcome.value);
        emit(
          res.ok
            ? { type: 'result_committed', ...fields(a), resultSha256: sha256Json(outcome.value) }
            : { type: 'result_rejected', ...fields(a), reason: 'lease_lost' },
        );
        return;
      }
      const { code, retryable, message } = classify(outcome.error);
      await failAttempt(a, { code, message }, retryable);
    } catch (err) {
      // The store itself failed: the commit may or may not have happened. The
      // lease will run out and the job be claimed again with a new token.
      emit({ type: 'result_rejected', ...fields(a), reason: 'store_error', error: err instanceof Error ? err.message : String(err) });
    } finally {
      free(a);
    }
  }

  async function failAttempt(a: Attempt, error: JobErrorInfo, retryable: boolean): Promise<void> {
    const res = await store.fail(a.lease, error, { retryable, backoffMs: backoffMs(a.lease.attempt, config.retry) });
    if (!res.ok) {
      emit({ type: 'result_rejected', ...fields(a), reason: 'lease_lost' });
    } else if (res.state === 'queued') {
      emit({ type: 'job_failed', ...fields(a), reason: error.code, errorCode: error.code, terminal: false, retryAt: res.runAfter });
    } else {
      emit({ type: 'job_failed', ...fields(a), reason: res.reason, errorCode: error.code, terminal: true });
    }
  }

  /**
   * The attempt ran past its kind's maxRunMs. Heartbeats may be fine; the
   * run time is a separate limit (a browser stuck on a modal heartbeats
   * forever). Abort the handler and fail the attempt while we still own it.
   */
  async function onStageTimeout(a: Attempt, maxRunMs: number): Promise<void> {
    const state = endAttempt(a);
    if (!state) return;
    a.controller.abort(new LeaseError('stage_timeout', `job ${a.lease.id}: ran past maxRunMs (${maxRunMs} ms)`));
    try {
      if (state.lost) {
        emit({ type: 'result_rejected', ...fields(a), reason: 'lease_lost' });
        return;
      }
      await failAttempt(a, { code: 'stage_timeout', message: `ran past maxRunMs (${maxRunMs} ms)` }, true);
    } catch (err) {
      emit({ type: 'result_rejected', ...fields(a), reason: 'store_error', error: err instanceof Error ? err.message : String(err) });
    } finally {
      // The slot is free even if the handler ignores the signal and never returns.
      free(a);
    }
  }

  /** `stop({ release: true })`: abort the handler and give the job back now. */
  async function releaseAttempt(a: Attempt): Promise<void> {
    const state = endAttempt(a);
    if (!state) return;
    a.controller.abort(new LeaseError('worker_stopping', `job ${a.lease.id}: the worker is stopping`));
    try {
      if (!state.lost) await store.release(a.lease);
    } catch {
      // The lease runs out on its own; the job is claimed again after it.
    } finally {
      free(a);
    }
  }

  // --- the claim loop -------------------------------------------------------
  //
  // Up to `concurrency` claims may be in flight at once (one lane per slot),
  // so a worker with many slots is not held to one claim round trip at a
  // time: with 16 slots and one serial claim loop, throughput was capped at
  // 1 / (claim latency) whatever the database could do (docs/bench-lease.md).
  // A lane claims only while `active + claiming < concurrency`, so no more
  // jobs are held than there are slots. When a claim finds nothing (or the
  // database is down), the worker goes idle: only lane 0 polls, every
  // `pollIntervalMs`, as the single loop did, and the first job it finds
  // wakes the other lanes.

  let stopping = false;
  let claiming = 0;
  let idleQueue = false;
  const wakers = new Set<() => void>();
  function wake(): void {
    for (const done of [...wakers]) done();
  }
  /** Waits up to `ms` (forever if undefined), or until a slot frees up, the queue has work again, or the worker stops. */
  function pause(ms: number | undefined): Promise<void> {
    return new Promise((resolve) => {
      const timer = ms === undefined ? undefined : setTimeout(done, ms);
      function done() {
        clearTimeout(timer);
        wakers.delete(done);
        resolve();
      }
      wakers.add(done);
    });
  }

  const kinds = Object.keys(config.handlers);
  async function claimLane(lane: number): Promise<void> {
    while (!stopping) {
      if (active.size + claiming >= config.concurrency) {
        await pause(config.pollIntervalMs);
        continue;
      }
      if (idleQueue && lane !== 0) {
        // Lane 0 polls for the idle worker; it wakes us when it finds a job.
        await pause(undefined);
        continue;
      }
      const sentAt = monotonicMs();
      let result;
      claiming++;
      try {
        result = await store.claim({ workerId, kinds, leaseMs: config.leaseMs, leaseMsByKind });
      } catch {
        result = undefined;
      }
      claiming--;
      if (!result) {
        // The database is unreachable: nothing to hand out; try again later.
        idleQueue = true;
        await pause(config.pollIntervalMs);
        continue;
      }
      for (const f of result.failed) {
        emit({
          type: 'job_failed',
          at: new Date(),
          workerId,
          jobId: f.id,
          kind: f.kind,
          fencingToken: f.fencingToken,
          reason: f.reason,
          errorCode: f.reason,
          terminal: true,
        });
      }
      if (result.lease) {
        if (stopping) {
          await store.release(result.lease).catch(() => {});
          break;
        }
        startAttempt(result.lease, sentAt);
        if (idleQueue) {
          idleQueue = false;
          wake();
        }
      } else if (result.failed.length === 0) {
        idleQueue = true;
        await pause(config.pollIntervalMs);
      }
    }
  }
  // Claiming starts on the next turn of the event loop, so that listeners
  // attached right after `await runWorker(...)` see the first job_claimed.
  const loopDone = new Promise<void>((resolve) => setImmediate(resolve)).then(() =>
    Promise.all(Array.from({ length: config.concurrency }, (_, lane) => claimLane(lane))).then(() => undefined),
  );

  // --- stop -----------------------------------------------------------------

  let resolveClosed!: (error: Error | undefined) => void;
  const closed = new Promise<Error | undefined>((resolve) => (resolveClosed = resolve));
  let stopped: Promise<void> | undefined;

  function stop(stopOptions: StopOptions = {}): Promise<void> {
    stopped ??= (async () => {
      stopping = true;
      wake();
      await loopDone;
      if (stopOptions.release || fatal) {
        await Promise.all([...active.values()].map(releaseAttempt));
      } else if (stopOptions.timeoutMs !== undefined) {
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([idle(), new Promise((r) => (timer = setTimeout(r, stopOptions.timeoutMs)))]);
        clearTimeout(timer);
        await Promise.all([...active.values()].map(releaseAttempt));
      } else {
        await idle();
      }
      clearInterval(pulseTimer);
      await thread.stop();
      resolveClosed(fatal);
    })();
    return stopped;
  }

  function metrics(): LeaseMetrics {
    const gauges: Record<string, KindGauges> = {};
    const now = monotonicMs();
    for (const a of active.values()) {
      const g = (gauges[a.lease.kind] ??= { running: 0, maxHeartbeatAgeMs: 0, minLeaseLeftMs: null });
      g.running++;
      g.maxHeartbeatAgeMs = Math.max(g.maxHeartbeatAgeMs, now - a.lastOkAt);
      const left = a.cell.confirmedUntil - now;
      g.minLeaseLeftMs = g.minLeaseLeftMs === null ? left : Math.min(g.minLeaseLeftMs, left);
    }
    return { counters: counters(), gauges };
  }

  return { workerId, events, metrics, stop, closed };
}

