/**
 * The claim lanes: how a worker asks the store for jobs (DESIGN §6).
 *
 * Up to `concurrency` claims may be in flight at once (one lane per slot),
 * so a worker with many slots is not held to one claim round trip at a
 * time: with 16 slots and one serial claim loop, throughput was capped at
 * 1 / (claim latency) whatever the database could do (docs/bench-lease.md).
 * A lane claims only while `active + claiming < concurrency`, so no more
 * jobs are held than there are slots. When a claim finds nothing (or the
 * database is down), the worker goes idle: only lane 0 polls, every
 * `pollIntervalMs`, as the single loop did, and the first job it finds
 * wakes the other lanes.
 */
import type { LeaseEvent } from '../events.js';
import { monotonicMs } from '../timing.js';
import type { JobStore, Lease } from '../types.js';
import type { WorkerConfig } from './options.js';

/** What the lanes need from their worker. */
export interface ClaimLaneContext {
  readonly workerId: string;
  readonly config: Pick<WorkerConfig, 'concurrency' | 'pollIntervalMs' | 'leaseMs' | 'kinds' | 'handlers'>;
  readonly store: Pick<JobStore, 'claim' | 'release'>;
  /** How many attempts hold a slot now. */
  activeCount(): number;
  /** A claimed lease becomes an attempt; `claimSentAt` is the monotonic time the claim was sent. */
  start(lease: Lease, claimSentAt: number): void;
  emit(event: LeaseEvent): void;
}

export interface ClaimLanes {
  /** Settles when every lane has stopped. */
  readonly done: Promise<void>;
  /** A slot freed up: wakes a lane that waits for one (every waiting lane while the queue is idle). */
  wake(): void;
  /** Stops claiming; a lease claimed meanwhile is given back. Resolves with `done`. */
  stop(): Promise<void>;
}

/**
 * Starts `concurrency` lanes on the next turn of the event loop, so that
 * listeners attached right after `await runWorker(...)` see the first
 * job_claimed.
 */
export function startClaimLanes(ctx: ClaimLaneContext): ClaimLanes {
  const { config, store, workerId } = ctx;
  const kinds = Object.keys(config.handlers);
  const leaseMsByKind = Object.fromEntries(Object.entries(config.kinds).map(([kind, k]) => [kind, k.leaseMs]));

  let stopping = false;
  let claiming = 0;
  let idleQueue = false;
  const wakers = new Set<() => void>();
  /** Wakes every waiting lane: the queue has work again, or the worker stops. */
  function wakeAll(): void {
    for (const done of [...wakers]) done();
  }
  /**
   * One slot freed up: one lane can claim for it. While the queue has work,
   * every waiting lane waits for a slot, so waking the longest-waiting one
   * is enough; waking them all made each finished job re-arm a timer for
   * every other lane, all but one of which found no slot and waited again.
   * While the queue is idle, all wake as before (lane 0 polls at once).
   */
  function wakeOne(): void {
    if (idleQueue) return wakeAll();
    for (const done of wakers) return done();
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

  async function claimLane(lane: number): Promise<void> {
    while (!stopping) {
      if (ctx.activeCount() + claiming >= config.concurrency) {
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
        ctx.emit({
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
        ctx.start(result.lease, sentAt);
        if (idleQueue) {
          idleQueue = false;
          wakeAll();
        }
      } else if (result.failed.length === 0) {
        idleQueue = true;
        await pause(config.pollIntervalMs);
      }
    }
  }

  const done = new Promise<void>((resolve) => setImmediate(resolve)).then(() =>
    Promise.all(Array.from({ length: config.concurrency }, (_, lane) => claimLane(lane))).then(() => undefined),
  );

  return {
    done,
    wake: wakeOne,
    stop() {
      stopping = true;
      wakeAll();
      return done;
    },
  };
}
