/**
 * The entity and key prefix of a queue job (docs/queues.md): one gateway is
 * shared by every queue and store that sends through it, so both name the
 * store, the queue and the job, as the lease module's keys do (DESIGN §6.2).
 */
import { LeaseError } from '../lease/errors.js';

/** A job of some queue: the queue's name and the job's id there, as text. */
export interface JobRef {
  queue: string;
  id: string;
  /**
   * Which life of the job id this is, when the queue lets an id be used
   * again after its job was removed (1, the default: the first). From the
   * second on, the key prefix names it, so a new job under an old id never
   * replays the old job's stored answers.
   */
  life?: number;
}

export interface JobKeys {
  /** `queue-job:<storeId>:<queue>:<id>`: the fence entity. */
  entity: string;
  /**
   * Each step's `Idempotency-Key` is `<keyPrefix>:<step>`: the entity, and
   * for a later life of the job id `@<life>` after it (`@` is escaped in
   * the encoded queue and id, and no step name holds one).
   */
  keyPrefix: string;
}

/** 32 lowercase hex characters, as `tool_job_store.store_id` (DESIGN §6.2). */
export const STORE_ID = /^[0-9a-f]{32}$/;

/**
 * The longest prefix that still leaves room for any valid step name
 * (`[A-Za-z0-9._~:-]{1,128}`) and its colon under the gateway's 255-character
 * `Idempotency-Key` limit (DESIGN §3).
 */
export const MAX_KEY_PREFIX = 255 - 129;

/**
 * Queue names and job ids enter the key percent-encoded, so a `:` inside
 * either can never make two jobs' keys equal (`a:b` + `c` vs `a` + `b:c`),
 * and `"` or `,` never reach the header (DESIGN §3).
 */
function part(what: string, value: unknown): string {
  if (typeof value !== 'string' || value.length === 0) {
    throw new LeaseError('invalid_input', `${what} must be a non-empty string, got ${JSON.stringify(value)}`);
  }
  return encodeURIComponent(value);
}

/**
 * @example
 * jobKeys('5f0c…e1', { queue: 'payments', id: '42' }).keyPrefix
 * // 'queue-job:5f0c…e1:payments:42'
 */
export function jobKeys(storeId: string, job: JobRef): JobKeys {
  if (!STORE_ID.test(storeId))
    throw new LeaseError('store_identity', `the fence store's id must be 32 lowercase hex characters, got ${JSON.stringify(storeId)}`);
  const key = `queue-job:${storeId}:${part('queue name', job.queue)}:${part('job id', job.id)}`;
  const life = job.life ?? 1;
  if (!Number.isSafeInteger(life) || life < 1) throw new LeaseError('invalid_input', `life must be a positive integer, got ${String(job.life)}`);
  const keyPrefix = life === 1 ? key : `${key}@${life}`;
  if (keyPrefix.length > MAX_KEY_PREFIX) {
    throw new LeaseError(
      'invalid_input',
      `queue name and job id are too long for an Idempotency-Key (prefix ${keyPrefix.length} > ${MAX_KEY_PREFIX} characters)`,
    );
  }
  return { entity: key, keyPrefix };
}
