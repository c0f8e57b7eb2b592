/**
 * What every queue adapter does at the start of an attempt: draw the fence,
 * build the keys, and give the handler a `fencedFetch` whose `stale-fence`
 * aborts the attempt's signal.
 */
import { LeaseLostError } from '../lease/errors.js';
import type { FencedFetch, FenceOptions } from '../lease/fenced-fetch.js';
import { fencedFetchFor } from './fenced-fetch-for.js';
import { jobKeys, type JobRef } from './keys.js';
import type { FenceGuard, FenceSource } from './types.js';

/** What a fenced handler gets besides the queue's own job object. */
export interface FencedJobContext {
  /** This attempt's fence: higher than every earlier attempt's of the job. */
  fence: number;
  /** `queue-job:<storeId>:<queue>:<id>`, sent as `X-Fence-Entity`. */
  entity: string;
  /** Each step's `Idempotency-Key` is `<keyPrefix>:<step>`, the same in every attempt. */
  keyPrefix: string;
  fencedFetch: FencedFetch;
  /** Aborts when the gateway refuses this attempt's fence (and with the queue's own signal). */
  signal: AbortSignal;
}

export interface AdapterOptions extends FenceOptions {
  /** The fence source on the queue's own store. */
  fences: FenceSource;
}

export interface Attempt {
  context: FencedJobContext;
  /** The refusal, once the gateway refused the fence; the attempt must not report success. */
  stale(): LeaseLostError | null;
  /** The queue says the lock is gone: abort the attempt as a gateway refusal would. */
  lose(error: LeaseLostError): void;
}

/**
 * Until when the queue's lock is confirmed, for the signed fence's `exp`
 * (DESIGN §7): built from what `begin` saw (`sentAt`: `Date.now()` before its
 * statement was sent), never from the clock at the time of a call.
 */
export type LockEnd = (begun: { fence: number; guardTtlMs?: number }, sentAt: number) => () => Date;

export async function beginAttempt(
  options: AdapterOptions,
  job: JobRef,
  guard: FenceGuard | undefined,
  queueSignal: AbortSignal | undefined,
  lockEnd?: LockEnd,
): Promise<Attempt> {
  const { fences, ...fenceOptions } = options;
  const sentAt = Date.now();
  const begun = await fences.begin(job, guard);
  if (!begun.ok) {
    throw new LeaseLostError(`job ${job.id} of ${job.queue} is no longer this worker's (its lock was taken over before the attempt drew a fence)`);
  }
  // A later life of a reused job id (BullMQ: removed, then added again) gets keys of its own.
  // The identity the fence was drawn under (a Redis source replaces a lost one), never one read later.
  const { entity, keyPrefix } = jobKeys(begun.storeId ?? fences.storeId, { ...job, ...(begun.life !== undefined ? { life: begun.life } : {}) });
  const aborted = new AbortController();
  let refusal: LeaseLostError | null = null;
  const signal = queueSignal === undefined ? aborted.signal : AbortSignal.any([aborted.signal, queueSignal]);
  const lose = (error: LeaseLostError) => {
    if (refusal !== null) return;
    refusal = error;
    aborted.abort(error);
  };
  const fencedFetch = fencedFetchFor({
    ...fenceOptions,
    fence: begun.fence,
    entity,
    keyPrefix,
    signal,
    leaseUntil: lockEnd?.(begun, sentAt),
    onStale: lose,
  });
  return { context: { fence: begun.fence, entity, keyPrefix, fencedFetch, signal }, stale: () => refusal, lose };
}

/** Runs the handler; a refused fence wins over whatever the handler made of it. */
export async function runAttempt<R>(attempt: Attempt, run: () => Promise<R>): Promise<R> {
  let result: R;
  try {
    result = await run();
  } catch (err) {
    throw attempt.stale() ?? err;
  }
  const stale = attempt.stale();
  if (stale !== null) throw stale;
  return result;
}
