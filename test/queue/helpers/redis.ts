/**
 * Redis for the queue tests: `FENCEGATE_TEST_REDIS_URL` (CI sets
 * redis://127.0.0.1:6379) and an ioredis client, which bullmq 6 takes as an
 * optional peer. Without either the Redis suites skip, with one message.
 */
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import type { RedisLike } from '../../../src/queue/redis-source.js';

export const REDIS_URL = process.env.FENCEGATE_TEST_REDIS_URL;

/** The subset of an ioredis client the tests use. */
export interface TestRedis extends RedisLike {
  scan(cursor: string, match: 'MATCH', pattern: string, count: 'COUNT', n: number): Promise<[string, string[]]>;
  del(...keys: string[]): Promise<number>;
  get(key: string): Promise<string | null>;
  set(key: string, value: string): Promise<unknown>;
  quit(): Promise<unknown>;
}

type RedisCtor = new (url: string, options?: Record<string, unknown>) => TestRedis;

/** ioredis as bullmq would load it (its own `require`), or null. */
function loadIORedis(): RedisCtor | null {
  try {
    const req = createRequire(createRequire(import.meta.url).resolve('bullmq'));
    const mod = req('ioredis') as { default?: RedisCtor; Redis?: RedisCtor };
    return mod.Redis ?? mod.default ?? null;
  } catch {
    return null;
  }
}

export const IORedis = loadIORedis();

/** Why the Redis suites skip, or null when they run. */
export const REDIS_SKIP: string | null = !REDIS_URL
  ? 'FENCEGATE_TEST_REDIS_URL is not set: the Redis and BullMQ suites are SKIPPED. Set it (e.g. redis://127.0.0.1:6379) to run them; CI always does.'
  : IORedis === null
    ? 'ioredis cannot be loaded (bullmq 6 has it as an optional peer and this checkout does not install it): the Redis and BullMQ suites are SKIPPED.'
    : null;

if (REDIS_SKIP !== null && !process.env.FENCEGATE_REDIS_SKIP_NOTICE) {
  process.env.FENCEGATE_REDIS_SKIP_NOTICE = '1';
  console.warn(`[fencegate] ${REDIS_SKIP}`);
}

export function connectRedis(options: Record<string, unknown> = {}): TestRedis {
  if (IORedis === null || !REDIS_URL) throw new Error(REDIS_SKIP ?? 'no Redis');
  return new IORedis(REDIS_URL, options);
}

/** A fresh key prefix for one test, so that tests never share a key. */
export const uniquePrefix = (what: string) => `fgt-${what}-${randomBytes(5).toString('hex')}`;

/** Deletes every key under `prefix` (SCAN, never KEYS). */
export async function deleteKeys(client: TestRedis, prefix: string): Promise<number> {
  let cursor = '0';
  let n = 0;
  do {
    const [next, keys] = await client.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 500);
    cursor = next;
    if (keys.length > 0) n += await client.del(...keys);
  } while (cursor !== '0');
  return n;
}
