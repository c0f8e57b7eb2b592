/**
 * `runWorker`: claims jobs, runs their handlers, keeps their leases alive
 * from a heartbeat thread, and commits results only through the
 * ownership-conditional statements of the store (DESIGN §6).
 *
 * This file composes the parts: the heartbeat thread and the handler
 * thread's pulse, the attempts (attempt.ts: one claimed attempt from its
 * claim to its end), the claim lanes (claim-lanes.ts), and stop.
 */
import { LeaseEvents, type LeaseEvent } from '../events.js';
import { HeartbeatThread } from '../heartbeat/client.js';
import { LeaseStatus, Pulse } from '../heartbeat/cell.js';
import { countEvents, type KindGauges, type LeaseMetrics } from '../metrics.js';
import { monotonicMs } from '../timing.js';
import type { Attempt, AttemptContext } from './attempt-types.js';
import { onHeartbeatReport, releaseAttempt, reportLoss, startAttempt } from './attempt.js';
import { startClaimLanes } from './claim-lanes.js';
import { parseWorkerOptions, type RunWorkerOptions } from './options.js';
import type { LeaseWorker, StopOptions } from './types.js';

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
  const emit = (event: LeaseEvent) => events.emit(event);

  const idleWaiters: (() => void)[] = [];
  /** Resolves when no attempt is active. */
  function idle(): Promise<void> {
    return active.size === 0 ? Promise.resolve() : new Promise((resolve) => idleWaiters.push(resolve));
  }

  // Attempts start only from the claim lanes, once the thread has started.
  let thread: HeartbeatThread;
  const attempts: AttemptContext = {
    workerId,
    config,
    store,
    heartbeats: {
      watch: (lease, maxStallMs, confirmedUntil) => thread.watch(lease, maxStallMs, confirmedUntil),
      unwatch: (key, cell) => thread.unwatch(key, cell),
    },
    active,
    emit,
    freed() {
      if (active.size === 0) for (const resolve of idleWaiters.splice(0)) resolve();
      lanes.wake();
    },
    nextClaim: () => lanes.next(),
  };

  // The handler thread's pulse: if this interval stops firing, the event loop
  // is blocked and the heartbeat thread stops extending (see heartbeat/thread.ts).
  const pulse = new Pulse();
  const pulseTimer = setInterval(() => pulse.tick(), config.pulseMs);
  pulseTimer.unref();

  let fatal: Error | undefined;
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
        onMessage: (message) => onHeartbeatReport(attempts, message),
        onCrash: (error) => onThreadCrash(error),
      },
    );
  } catch (err) {
    clearInterval(pulseTimer);
    throw err;
  }

  const lanes = startClaimLanes({
    workerId,
    config,
    store,
    activeCount: () => active.size,
    start: (lease, claimSentAt) => void startAttempt(attempts, lease, claimSentAt),
    emit,
  });

  function onThreadCrash(error: Error): void {
    fatal ??= error;
    // Nobody extends these leases any more: treat them as lost, and stop.
    for (const a of active.values()) {
      a.cell.end(LeaseStatus.Lost, 'thread_exit');
      reportLoss(attempts, a);
    }
    void stop();
  }

  // --- stop -----------------------------------------------------------------

  let resolveClosed!: (error: Error | undefined) => void;
  const closed = new Promise<Error | undefined>((resolve) => (resolveClosed = resolve));
  let stopped: Promise<void> | undefined;
  const releaseAll = () => Promise.all([...active.values()].map((a) => releaseAttempt(attempts, a)));

  function stop(stopOptions: StopOptions = {}): Promise<void> {
    stopped ??= (async () => {
      await lanes.stop();
      if (stopOptions.release || fatal) {
        await releaseAll();
      } else if (stopOptions.timeoutMs !== undefined) {
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([idle(), new Promise((r) => (timer = setTimeout(r, stopOptions.timeoutMs)))]);
        clearTimeout(timer);
        await releaseAll();
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
