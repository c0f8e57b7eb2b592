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
 *
 * A slot whose job succeeded does not wait for a lane: while the queue has
 * work, it sends its complete and the claim of its next job in one call
 * (`next()`, the store's `completeAndClaim`), one statement instead of two.
 * The claim is the lanes' own, and lands here (`take`), so the same rules
 * apply: the lease starts as an attempt, or is given back if the worker
 * stopped meanwhile.
 */
import type { LeaseEvent } from '../events.js';
import { monotonicMs } from '../timing.js';
import type { ClaimOptions, ClaimResult, CompleteAndClaimResult, JobStore, Lease, LeaseRef } from '../types.js';
import type { WorkerConfig } from './options.js';

/** What the lanes need from their worker. */
export interface ClaimLaneContext {
  readonly workerId: string;
  readonly config: Pick<WorkerConfig, 'concurrency' | 'pollIntervalMs' | 'leaseMs' | 'kinds' | 'handlers'>;
  readonly store: Pick<JobStore, 'claim' | 'release' | 'completeAndClaim'>;
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
  /** Stops claiming; a lease claimed meanwhile is given back. Resolves with `done` and once every `next()` was taken. */
  stop(): Promise<void>;
  /**
   * For a slot whose job succeeded, before it completes: the claim of its
   * next job, to send with the complete. Undefined when the slot would not
   * claim now: the worker is stopping, the queue is idle (lane 0 polls
   * alone), or the store has no `completeAndClaim`.
   */
  next(): NextClaim | undefined;
}

/** The claim of a slot's next job, sent with its complete. */
export interface NextClaim {
  /** Completes `lease` and, if that matched, claims with the lanes' own options, in one call of the store. */
  send(lease: LeaseRef, result: unknown): Promise<CompleteAndClaimResult>;
  /**
   * Call exactly once, after `send` settled (undefined: it failed, or its
   * complete was refused, so it claimed nothing). Reports
   * dead jobs, starts the claimed lease as an attempt, or gives it back if
   * the worker is stopping. True if an attempt started: the slot is taken again.
   */
  take(claim: ClaimResult | undefined): boolean;
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

  const claimOptions: ClaimOptions = { workerId, kinds, leaseMs: config.leaseMs, leaseMsByKind };

  let stopping = false;
  let claiming = 0;
  /** next() claims not yet taken (or given back): stop() waits for them. */
  const handing = new Set<Promise<void>>();
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

  function reportFailed(failed: ClaimResult['failed']): void {
    for (const f of failed) {
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
  }

  function next(): NextClaim | undefined {
    if (stopping || idleQueue || !store.completeAndClaim) return undefined;
    let sentAt = 0;
    let taken = false;
    let settled!: () => void;
    const handed = new Promise<void>((resolve) => (settled = resolve));
    handing.add(handed);
    const finish = () => {
      handing.delete(handed);
      settled();
    };
    return {
      send(lease, result) {
        sentAt = monotonicMs();
        return store.completeAndClaim!(lease, result, claimOptions);
      },
      take(claim) {
        if (taken) return false;
        taken = true;
        const lease = claim?.lease ?? null;
        // stop() began while the call was out: the job goes back, as a lane's would.
        const giveBack = lease !== null && stopping;
        // Found nothing (no lease, no dead job): the queue is drained, as
        // after a lane's empty claim; so the slots freed now wake lane 0 to
        // poll alone instead of one empty claim each.
        if (claim && lease === null && claim.failed.length === 0) idleQueue = true;
        try {
          if (claim) reportFailed(claim.failed);
          if (lease && !giveBack) ctx.start(lease, sentAt);
        } finally {
          if (giveBack) {
            void store
              .release(lease)
              .catch(() => {})
              .then(finish);
          } else {
            finish();
          }
        }
        return lease !== null && !giveBack;
      },
    };
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
        result = await store.claim(claimOptions);
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
      reportFailed(result.failed);
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
      return Promise.all([done, ...handing]).then(() => undefined);
    },
    next,
  };
}
