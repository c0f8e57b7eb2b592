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
import { LeaseConfigError } from '../lease/errors.js';
import { beginAttempt, runAttempt, type AdapterOptions, type FencedJobContext } from './context.js';

/** The fields of a BullMQ `Job` the adapter reads. */
export interface BullJobLike {
  id?: string;
  /** `<prefix>:<name>`: the job's Redis keys start with it. */
  queueQualifiedName: string;
}

/** A BullMQ processor that also gets the fenced context. */
export type FencedProcessor<J extends BullJobLike, R> = (job: J, fenced: FencedJobContext, token?: string) => Promise<R>;

export interface FencedProcessorOptions extends AdapterOptions {
  /** The worker's `lockDuration` (default BullMQ's 30 s): the signed fence's `exp` (DESIGN §7). */
  lockDurationMs?: number;
}

/**
 * Wraps a processor: each run draws the next fence for the job, the handler
 * sends its side effects with `fencedFetch`, and a gateway `stale-fence`
 * aborts `signal` and fails the run with `LeaseLostError`.
 *
 * @example
 * const fences = await createFenceSource({ redis: connection });
 * new Worker('payments', fencedProcessor(async (job, { fencedFetch }) => {
 *   const res = await fencedFetch(`${gateway}/payments/charges`, { step: 'charge', method: 'POST', body: JSON.stringify(job.data) });
 *   return res.json();
 * }, { fences }), { connection });
 */
export function fencedProcessor<J extends BullJobLike, R>(
  processor: FencedProcessor<J, R>,
  options: FencedProcessorOptions,
): (job: J, token?: string, signal?: AbortSignal) => Promise<R> {
  if (options.fences?.backend !== 'redis') throw new LeaseConfigError("fencegate/bullmq needs a Redis fence source on the queue's Redis (createFenceSource({ redis }))");
  const { lockDurationMs = 30_000, ...adapter } = options;
  return async function fencedBullProcessor(job, token, signal) {
    if (job.id === undefined || token === undefined) throw new LeaseConfigError('a fenced processor needs the job id and the lock token BullMQ passes to a Worker processor');
    const lockKey = `${job.queueQualifiedName}:${job.id}:lock`;
    const attempt = await beginAttempt(
      adapter,
      { queue: job.queueQualifiedName, id: job.id },
      { kind: 'redis-key', key: lockKey, equals: token },
      signal,
      // BullMQ extends the lock by lockDuration from each renewal: now + lockDuration bounds its end.
      () => new Date(Date.now() + lockDurationMs),
    );
    return runAttempt(attempt, () => processor(job, attempt.context, token));
  };
}

export { createFenceSource, type FenceSourceOptions } from './fence-source.js';
export type { RedisLike } from './redis-source.js';
export type { FencedJobContext } from './context.js';
export type { FenceSource, BeginResult } from './types.js';
export { LeaseLostError, OutcomeUnknownError } from '../lease/errors.js';
