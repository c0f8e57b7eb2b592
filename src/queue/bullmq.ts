/**
 * `fencegate/bullmq`: fenced, idempotent gateway calls from BullMQ jobs
 * (docs/queues.md). The fence is an `INCR` in the queue's own Redis, in one
 * script with a check that this worker still holds the job's BullMQ lock.
 *
 * Why not `job.attemptsMade`: BullMQ raises it only when an attempt fails; a
 * stalled job that another worker takes over (its lock expired) runs again
 * with the same `attemptsMade`, so the stale worker and the new one would
 * present the same fence. `attemptsStarted` is raised in the script that
 * takes the lock, but `reprocessJob` (`job.retry(..., { resetAttemptsStarted })`)
 * deletes it, and a job removed and added again under the same id starts
 * from 0: neither may go down under a fence the gateway already saw.
 */
import { LeaseConfigError, LeaseLostError } from '../lease/errors.js';
import { beginAttempt, runAttempt, type AdapterOptions, type Attempt, type FencedJobContext } from './context.js';
import type { FenceGuard } from './types.js';

/** The fields of a BullMQ `Job` the adapter reads. */
export interface BullJobLike {
  id?: string;
  /** `<prefix>:<name>`: the job's Redis keys start with it. */
  queueQualifiedName: string;
}

/** A BullMQ processor that also gets the fenced context. */
export type FencedProcessor<J extends BullJobLike, R> = (job: J, fenced: FencedJobContext, token?: string) => Promise<R>;

export type FencedProcessorOptions = AdapterOptions;

/** The part of a BullMQ `Worker` that `watch` uses: its lock renewal events. */
export interface BullWorkerLike {
  on(event: 'locksRenewed', listener: (renewed: { jobIds: string[] }) => void): unknown;
  on(event: 'lockRenewalFailed', listener: (jobIds: string[]) => void): unknown;
}

/** The wrapped processor, to hand to `new Worker(...)`. */
export interface FencedBullProcessor<J extends BullJobLike, R> {
  (job: J, token?: string, signal?: AbortSignal): Promise<R>;
  /**
   * Follows the worker's lock renewals: after each one BullMQ reports for a
   * job this processor runs, the adapter reads the lock in Redis again, and
   * the signed fence's `exp` moves to the end it confirmed. A run follows the
   * Worker its job came from by itself (`job.queue`); call this for a worker
   * whose jobs do not carry it. Unfollowed, `exp` stays at the lock end that
   * `begin` confirmed (docs/queues.md). Watching a worker twice is one watch.
   */
  watch<W extends BullWorkerLike>(worker: W): W;
}

/** One run of the processor: its lock, and until when Redis confirmed it. */
interface Run {
  jobId: string;
  guard: FenceGuard;
  until: number;
  attempt?: Attempt;
  checking: boolean;
}

/**
 * Wraps a processor: each run draws the next fence for the job, the handler
 * sends its side effects with `fencedFetch`, and a gateway `stale-fence`
 * aborts `signal` and fails the run with `LeaseLostError`.
 *
 * @example
 * const fences = await createFenceSource({ redis: connection });
 * const processor = fencedProcessor(async (job, { fencedFetch }) => {
 *   const res = await fencedFetch(`${gateway}/payments/charges`, { step: 'charge', method: 'POST', body: JSON.stringify(job.data) });
 *   return res.json();
 * }, { fences });
 * processor.watch(new Worker('payments', processor, { connection }));
 */
export function fencedProcessor<J extends BullJobLike, R>(processor: FencedProcessor<J, R>, options: FencedProcessorOptions): FencedBullProcessor<J, R> {
  const fences = options?.fences;
  if (fences?.backend !== 'redis')
    throw new LeaseConfigError("fencegate/bullmq needs a Redis fence source on the queue's Redis (createFenceSource({ redis }))");
  if ('lockDurationMs' in options) {
    // It used to set the signed fence's exp to "now + lockDurationMs" at every call, which a worker
    // frozen past its lock still passed: refuse it rather than ignore it.
    throw new LeaseConfigError(
      'lockDurationMs is no longer an option: the signed fence expires with the BullMQ lock as Redis last confirmed it (docs/queues.md)',
    );
  }
  const runs = new Map<string, Set<Run>>();

  // Reads the lock again; `sentAt` before the script is sent, so the end it
  // confirms is never later than the one Redis holds (DESIGN §7).
  async function confirm(run: Run): Promise<void> {
    if (run.checking) return;
    run.checking = true;
    try {
      const sentAt = Date.now();
      const ttl = await fences.guardTtl!(run.guard);
      if (ttl === null) {
        run.attempt?.lose(new LeaseLostError(`BullMQ's lock on job ${run.jobId} is no longer this run's: it expired or another worker holds it`));
      } else if (ttl > 0) {
        run.until = Math.max(run.until, sentAt + ttl);
      }
    } catch {
      // Not confirmed: exp stays where the last confirmation put it.
    } finally {
      run.checking = false;
    }
  }
  const confirmAll = (jobIds: readonly string[]) => {
    for (const id of jobIds) for (const run of runs.get(id) ?? []) void confirm(run);
  };
  const watched = new WeakSet<object>();
  function follow(worker: BullWorkerLike): void {
    if (watched.has(worker)) return;
    watched.add(worker);
    worker.on('locksRenewed', (renewed) => confirmAll(renewed.jobIds));
    // A failed renewal is checked the same way: the lock itself says whether this run lost it.
    worker.on('lockRenewalFailed', (jobIds) => confirmAll(jobIds));
  }

  async function fencedBullProcessor(job: J, token?: string, signal?: AbortSignal): Promise<R> {
    if (job.id === undefined || token === undefined)
      throw new LeaseConfigError('a fenced processor needs the job id and the lock token BullMQ passes to a Worker processor');
    // lifeHash: the job's own hash, which BullMQ deletes with the job, marks this life of the id.
    const jobHash = `${job.queueQualifiedName}:${job.id}`;
    const guard: FenceGuard = { kind: 'redis-key', key: `${jobHash}:lock`, equals: token, lifeHash: jobHash };
    const run: Run = { jobId: job.id, guard, until: 0, checking: false };
    const attempt = await beginAttempt(options, { queue: job.queueQualifiedName, id: job.id }, guard, signal, (begun, sentAt) => {
      // The lock's PTTL in the script that drew the fence: the lock end as of begin.
      run.until = sentAt + Math.max(0, begun.guardTtlMs ?? 0);
      return () => new Date(run.until);
    });
    run.attempt = attempt;
    // The Worker that handed out the job renews its lock: follow it without
    // being asked, or a job longer than one lock duration would mint expired
    // fences. A renewal reported before this run is registered is not lost
    // time: begin's own read saw it, or the next renewal's read does.
    // `job.queue` (protected in BullMQ's types) is what created the job: for
    // a job a Worker hands its processor, that Worker (`Job.fromJSON(worker, …)`).
    const source = (job as unknown as { queue?: unknown }).queue;
    if (fences.guardTtl !== undefined && isWorkerLike(source)) follow(source);
    const live = runs.get(job.id) ?? new Set<Run>();
    runs.set(job.id, live.add(run));
    try {
      return await runAttempt(attempt, () => processor(job, attempt.context, token));
    } finally {
      live.delete(run);
      if (live.size === 0 && runs.get(job.id) === live) runs.delete(job.id);
    }
  }

  return Object.assign(fencedBullProcessor, {
    watch<W extends BullWorkerLike>(worker: W): W {
      if (fences.guardTtl === undefined) throw new LeaseConfigError('watch needs a fence source that can read the lock again (createFenceSource({ redis }))');
      follow(worker);
      return worker;
    },
  });
}

/** An event emitter in a BullMQ Worker's shape (a Queue has `on` too, but never emits renewals: following it changes nothing). */
function isWorkerLike(value: unknown): value is BullWorkerLike {
  return typeof value === 'object' && value !== null && typeof (value as { on?: unknown }).on === 'function';
}

export { createFenceSource, type FenceSourceOptions } from './fence-source.js';
export type { RedisLike } from './redis-source.js';
export type { FencedJobContext } from './context.js';
export type { FenceSource, BeginResult } from './types.js';
export { LeaseLostError, OutcomeUnknownError } from '../lease/errors.js';
