/**
 * `fencedFetchFor`: the lease module's `fencedFetch` (src/lease/fenced-fetch.ts,
 * DESIGN §6.4) for a job of another queue. The same headers, the same
 * stable per-step keys, the same answer to a `stale-fence`: only the fence
 * comes from a `FenceSource` instead of a claim.
 */
import { LeaseError, LeaseLostError } from '../lease/errors.js';
import { createFencedFetch, fenceRefusalText, type FenceContext, type FencedFetch, type FenceOptions } from '../lease/fenced-fetch.js';
import { MAX_KEY_PREFIX } from './keys.js';

export interface FencedFetchForOptions extends FenceOptions {
  /** This attempt's fence (`FenceSource.begin`). */
  fence: number;
  /** The fence entity, `jobKeys(...).entity`. */
  entity: string;
  /** Each step's `Idempotency-Key` is `<keyPrefix>:<step>`: `jobKeys(...).keyPrefix`. */
  keyPrefix: string;
  /** Aborts every call in flight and refuses new ones (the job's own signal). */
  signal?: AbortSignal;
  /** Called once, when the gateway first refuses the fence: abort the job's other work here. */
  onStale?: (error: LeaseLostError) => void;
  /**
   * For `fenceSigner`: until when the job was last confirmed this worker's
   * (the queue's lock end as its store last reported it). Never "now + the
   * lock's length": a worker frozen past its lock would mint a fresh fence.
   */
  leaseUntil?: () => Date;
  /** The signed fence's `sub`; default `queue-worker`. */
  workerId?: string;
}

/**
 * @example
 * const fencedFetch = fencedFetchFor({ fence: 7, entity, keyPrefix: entity, signal: job.signal });
 * await fencedFetch('http://127.0.0.1:8080/payments/charges', {
 *   step: 'charge', method: 'POST', body: JSON.stringify({ amount: 1200 }),
 *   headers: { 'content-type': 'application/json' }, timeoutMs: 10_000,
 * });
 * // a newer attempt holds the job: rejects with LeaseLostError, and every later call too
 */
export function fencedFetchFor(options: FencedFetchForOptions): FencedFetch {
  const { fence, entity, keyPrefix, signal, onStale, leaseUntil, workerId, ...fenceOptions } = options;
  if (!Number.isSafeInteger(fence) || fence < 0) throw new LeaseError('invalid_input', `fence must be a non-negative safe integer, got ${String(fence)}`);
  if (typeof entity !== 'string' || entity.length === 0) throw new LeaseError('invalid_input', 'entity must be a non-empty string');
  if (typeof keyPrefix !== 'string' || keyPrefix.length === 0 || keyPrefix.length > MAX_KEY_PREFIX) {
    throw new LeaseError('invalid_input', `keyPrefix must be 1–${MAX_KEY_PREFIX} characters (it is part of every Idempotency-Key)`);
  }
  if (fenceOptions.fenceSigner !== undefined && leaseUntil === undefined) {
    throw new LeaseError('invalid_config', 'fenceSigner needs leaseUntil (the signed fence expires with it, DESIGN §7)');
  }
  const lost = new AbortController();
  const ctx: FenceContext = {
    workerId: workerId ?? 'queue-worker',
    // Only the lease runner's events read these two; this context emits none.
    jobId: 0,
    kind: 'queue',
    fencingToken: fence,
    jobKey: keyPrefix,
    fenceKey: entity,
    signal: signal === undefined ? lost.signal : AbortSignal.any([lost.signal, signal]),
    leaseUntil: leaseUntil ?? (() => new Date()),
    assertCanStart() {
      if (lost.signal.aborted) throw lost.signal.reason as Error;
      if (signal?.aborted) throw signal.reason instanceof Error ? signal.reason : new LeaseLostError('the job was aborted');
    },
    markLost(_cause, refusal) {
      if (lost.signal.aborted) return;
      // An expired fence here is the queue's lock end as last confirmed (leaseUntil): say how that happens.
      const text = fenceRefusalText(fence, entity, refusal, 'a newer attempt holds the job');
      const error = new LeaseLostError(
        refusal === 'fence-expired'
          ? `${text}: the worker was paused past the queue's lock, or the lock's renewals were not followed (BullMQ: a processor follows the Worker its job came from; for jobs that do not carry it, call processor.watch(worker); docs/queues.md)`
          : text,
      );
      lost.abort(error);
      onStale?.(error);
    },
    emit() {},
  };
  return createFencedFetch(ctx, fenceOptions);
}
