/**
 * The fence source on Redis: `INCR` of one namespaced key per job, in the
 * Redis the queue itself lives in (docs/queues.md).
 */
import { randomBytes } from 'node:crypto';
import { LeaseError } from '../lease/errors.js';
import { STORE_ID } from './keys.js';
import type { JobRef } from './keys.js';
import type { BeginResult, FenceGuard, FenceSource } from './types.js';

/**
 * The part of a Redis client this source uses, in ioredis's shape, so that
 * the package never imports a Redis client (the caller hands in its own).
 */
export interface RedisLike {
  eval(script: string, numKeys: number, ...args: (string | number)[]): Promise<unknown>;
}

export interface RedisFenceSourceOptions {
  /** Prefix of every key this source writes; default `fencegate:queue`. */
  namespace?: string;
  /**
   * How long a job id's fence counter and lives record are kept after its
   * latest fence was drawn, in ms (each draw renews it); default
   * KEY_TTL_MS, 100 days. `null` keeps them for ever. Must be longer than
   * the gateway's `entityRetention` (default 90 days) plus the longest a job
   * runs: while the gateway remembers an entity's fence, its counter must
   * not start again at 1 (docs/queues.md).
   */
  keyTtlMs?: number | null;
}

/** The default `keyTtlMs`: the gateway's default entityRetention (90 days) plus 10 days for the jobs that run long. */
export const KEY_TTL_MS = 100 * 86_400_000;

const NAMESPACE = /^[A-Za-z0-9._:{}-]{1,64}$/;

// KEYS[1] the store-id key, ARGV[1] a fresh id: the first caller's id wins and
// every later one reads it (SET NX then GET, atomically).
const STORE_ID_SCRIPT = `redis.call('SET', KEYS[1], ARGV[1], 'NX') return redis.call('GET', KEYS[1])`;

/** The field of a job's own hash that marks its life (BullMQ reads only the fields it knows). */
export const LIFE_FIELD = 'fencegate:life';

// KEYS[1] the store-id key, ARGV[1] the identity this source draws under,
// ARGV[2] how long the job id's keys are kept after this draw (ms; 0: for ever):
// -2 when the key no longer holds it (the Redis restarted without
// persistence, was flushed, or evicted the key), before anything is written.
// Otherwise a process that still holds the old identity and one started
// after the loss would fence one job on two entities, neither of which ever
// sees the other's fences (docs/queues.md).
//
// KEYS[2] the fence key; KEYS[3] the guard key (optional), ARGV[3] the value it
// must hold. The check and the INCR are one script, so a worker that lost the
// queue's lock between its hand-out and here draws no fence at all; -1 means
// not the owner. With a guard the answer is {fence, PTTL of the guard key}:
// how long the lock is confirmed for at this very instant (docs/queues.md).
//
// With a life hash (KEYS[4] the job's own hash, KEYS[5] this source's record
// of the job id's lives, ARGV[4] a fresh marker): the job's hash gets a marker
// field once per life (HSETNX: every attempt of one life reads the first
// one; the hash, and with it the marker, is gone once the job is removed),
// and the answer's third member is the life's number: its position among
// the markers this job id ever had.
//
// The fence counter and the lives record are this source's own keys, one
// pair per job id ever fenced: each draw renews their expiry (PEXPIRE), so
// an id that is no longer used is forgotten KEY_TTL_MS after its last draw.
const BEGIN_SCRIPT = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -2 end
local keep = tonumber(ARGV[2])
if #KEYS == 2 then
  local fence = redis.call('INCR', KEYS[2])
  if keep > 0 then redis.call('PEXPIRE', KEYS[2], keep) end
  return fence
end
if redis.call('GET', KEYS[3]) ~= ARGV[3] then return -1 end
local fence = redis.call('INCR', KEYS[2])
if keep > 0 then redis.call('PEXPIRE', KEYS[2], keep) end
local ttl = redis.call('PTTL', KEYS[3])
if #KEYS == 3 then return {fence, ttl} end
redis.call('HSETNX', KEYS[4], '${LIFE_FIELD}', ARGV[4])
local marker = redis.call('HGET', KEYS[4], '${LIFE_FIELD}')
local life = redis.call('HGET', KEYS[5], marker)
if not life then
  life = redis.call('HLEN', KEYS[5]) + 1
  redis.call('HSET', KEYS[5], marker, life)
end
if keep > 0 then redis.call('PEXPIRE', KEYS[5], keep) end
return {fence, ttl, tonumber(life)}`;

/** The script's answer when the store-id key no longer holds the source's identity. */
const IDENTITY_LOST = -2;

// KEYS[1] the guard key, ARGV[1] the value it must hold: its PTTL, or -3
// (PTTL itself answers -2 and -1 only) when it does not hold the value.
const GUARD_TTL_SCRIPT = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -3 end
return redis.call('PTTL', KEYS[1])`;

function redisKeyGuard(guard: FenceGuard): Extract<FenceGuard, { kind: 'redis-key' }> {
  if (guard.kind !== 'redis-key') throw new LeaseError('invalid_input', `a Redis fence source takes a 'redis-key' guard, got '${guard.kind}'`);
  return guard;
}

/**
 * The store identity is a key of its own (`<namespace>:store-id`). If the
 * Redis is wiped, both the counters and the identity go: the next identity
 * is a new one, so the fresh counters name new entities at the gateway
 * instead of presenting fences below ones it has already seen.
 */
export async function redisFenceSource(client: RedisLike, options: RedisFenceSourceOptions = {}): Promise<FenceSource> {
  const ns = options.namespace ?? 'fencegate:queue';
  if (!NAMESPACE.test(ns)) throw new LeaseError('invalid_config', `namespace must match ${NAMESPACE}, got ${JSON.stringify(ns)}`);
  const keyTtl = options.keyTtlMs === undefined ? KEY_TTL_MS : options.keyTtlMs;
  if (keyTtl !== null && !(Number.isSafeInteger(keyTtl) && keyTtl >= 86_400_000))
    throw new LeaseError(
      'invalid_config',
      `keyTtlMs must be a whole number of ms of at least a day (longer than the gateway's entityRetention), or null, got ${String(keyTtl)}`,
    );
  const keep = String(keyTtl ?? 0);
  const storeIdKey = `${ns}:store-id`;
  const readIdentity = async () => {
    const id = String(await client.eval(STORE_ID_SCRIPT, 1, storeIdKey, randomBytes(16).toString('hex')));
    if (!STORE_ID.test(id)) throw new LeaseError('store_identity', `${storeIdKey} does not hold a 32-hex store id`);
    return id;
  };
  let storeId = await readIdentity();
  const fenceKey = (id: string, queue: string, job: string) => `${ns}:fence:${id}:${encodeURIComponent(queue)}:${encodeURIComponent(job)}`;
  // Kept as long as the fence counter is, so a later life never takes an earlier one's number.
  const livesKey = (id: string, queue: string, job: string) => `${ns}:lives:${id}:${encodeURIComponent(queue)}:${encodeURIComponent(job)}`;

  async function beginUnder(id: string, job: JobRef, guard: FenceGuard | undefined): Promise<BeginResult | typeof IDENTITY_LOST> {
    if (guard === undefined) return answer(await client.eval(BEGIN_SCRIPT, 2, storeIdKey, fenceKey(id, job.queue, job.id), id, keep), id);
    const g = redisKeyGuard(guard);
    const keys = [storeIdKey, fenceKey(id, job.queue, job.id), g.key, ...(g.lifeHash === undefined ? [] : [g.lifeHash, livesKey(id, job.queue, job.id)])];
    const args = [id, keep, g.equals, ...(g.lifeHash === undefined ? [] : [randomBytes(16).toString('hex')])];
    const reply = await client.eval(BEGIN_SCRIPT, keys.length, ...keys, ...args);
    if (!Array.isArray(reply)) return answer(reply, id);
    const result = answer(reply[0], id);
    if (result === IDENTITY_LOST || !result.ok) return result;
    const life = reply[2] === undefined ? undefined : Number(reply[2]);
    if (life !== undefined && (!Number.isSafeInteger(life) || life < 1))
      throw new LeaseError('invalid_input', `the job's life record returned an unusable life: ${String(reply[2])}`);
    return { ...result, guardTtlMs: Number(reply[1]), ...(life !== undefined ? { life } : {}) };
  }

  return {
    backend: 'redis',
    /** The identity of the latest begin: a lost one is replaced (below), so read the one a `BeginResult` names. */
    get storeId() {
      return storeId;
    },
    async begin(job, guard) {
      const first = await beginUnder(storeId, job, guard);
      if (first !== IDENTITY_LOST) return first;
      // The identity is gone with the counters it named: take the store's
      // current one (a new one if none is there yet, as at start-up), so
      // every process on this Redis fences a job on one entity again, and
      // the fresh counters never present fences under the old entities.
      const lost = storeId;
      const current = await readIdentity();
      if (storeId === lost) storeId = current;
      const again = await beginUnder(current, job, guard);
      if (again === IDENTITY_LOST)
        throw new LeaseError('store_identity', `${storeIdKey} changed again while this fence was drawn; nothing was drawn, try the attempt again`);
      return again;
    },
    async guardTtl(guard) {
      const g = redisKeyGuard(guard);
      const ttl = Number(await client.eval(GUARD_TTL_SCRIPT, 1, g.key, g.equals));
      return ttl === -3 || ttl === -2 ? null : ttl;
    },
  };
}

function answer(reply: unknown, storeId: string): BeginResult | typeof IDENTITY_LOST {
  const n = Number(reply);
  if (n === IDENTITY_LOST) return IDENTITY_LOST;
  if (n === -1) return { ok: false, reason: 'not_owner' };
  if (!Number.isSafeInteger(n) || n < 1) throw new LeaseError('invalid_input', `the fence key returned an unusable fence: ${n}`);
  return { ok: true, fence: n, storeId };
}
