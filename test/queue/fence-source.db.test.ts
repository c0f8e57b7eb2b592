/**
 * One contract for every fence source, run against each real backend:
 * SQLite always, PostgreSQL and Redis when their test URLs are set.
 */
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, describe, expect, test } from 'vitest';
import { createFenceSource } from '../../src/queue/fence-source.js';
import { jobKeys } from '../../src/queue/keys.js';
import type { FenceGuard, FenceSource } from '../../src/queue/types.js';
import { createTestSchema, POSTGRES_URL } from '../helpers/postgres.js';
import { tempDir } from '../helpers/temp.js';
import { connectRedis, deleteKeys, REDIS_SKIP, uniquePrefix } from './helpers/redis.js';

interface Backend {
  name: string;
  skip: boolean;
  /** Opens a source on a fresh store; `reopen` opens a second source on the same store. */
  open(): Promise<{
    source: FenceSource;
    reopen(): Promise<FenceSource>;
    holds: FenceGuard;
    notHeld: FenceGuard;
    /** SQL only: moves a job's latest fence `ms` into the past, as if it had been drawn then. */
    backdate?(queue: string, id: string, ms: number): Promise<void>;
  }>;
}

const disposers: (() => Promise<unknown> | unknown)[] = [];
afterAll(async () => {
  for (const d of disposers.splice(0).reverse()) await d();
});

const backends: Backend[] = [
  {
    name: 'sqlite',
    skip: false,
    async open() {
      const tmp = tempDir();
      const path = join(tmp.dir, 'queue.db');
      const db = new Database(path);
      disposers.push(
        () => tmp.cleanup(),
        () => db.close(),
      );
      const reopen = async () => {
        const other = new Database(path);
        disposers.push(() => other.close());
        return createFenceSource({ sqlite: other });
      };
      return {
        source: await createFenceSource({ sqlite: db }),
        reopen,
        holds: { kind: 'sql', where: '? = 1', values: [1] },
        notHeld: { kind: 'sql', where: '? = 1', values: [0] },
        async backdate(queue: string, id: string, ms: number) {
          db.prepare('UPDATE fencegate_queue_fences SET updated_at = updated_at - ? WHERE queue = ? AND job_ref = ?').run(ms, queue, id);
        },
      };
    },
  },
  {
    name: 'postgres',
    skip: !POSTGRES_URL,
    async open() {
      const db = await createTestSchema('fgq');
      disposers.push(() => db.drop());
      return {
        source: await createFenceSource({ postgres: db.pool }),
        reopen: () => createFenceSource({ postgres: db.pool }),
        holds: { kind: 'sql', where: '$3::text = $4::text', values: ['w1', 'w1'] },
        notHeld: { kind: 'sql', where: '$3::text = $4::text', values: ['w1', 'w2'] },
        async backdate(queue: string, id: string, ms: number) {
          await db.pool.query(`UPDATE fencegate_queue_fences SET updated_at = updated_at - $1 * interval '1 millisecond' WHERE queue = $2 AND job_ref = $3`, [
            ms,
            queue,
            id,
          ]);
        },
      };
    },
  },
  {
    name: 'redis',
    skip: REDIS_SKIP !== null,
    async open() {
      const client = connectRedis();
      const namespace = uniquePrefix('fences');
      disposers.push(async () => {
        await deleteKeys(client, namespace);
        await client.quit();
      });
      await client.set(`${namespace}:lock`, 'token-1');
      return {
        source: await createFenceSource({ redis: client, namespace }),
        reopen: () => createFenceSource({ redis: client, namespace }),
        holds: { kind: 'redis-key', key: `${namespace}:lock`, equals: 'token-1' },
        notHeld: { kind: 'redis-key', key: `${namespace}:lock`, equals: 'token-2' },
      };
    },
  },
];

const fenceOf = async (source: FenceSource, queue: string, id: string, guard?: FenceGuard) => {
  const r = await source.begin({ queue, id }, guard);
  return r.ok ? r.fence : r.reason;
};

describe.each(backends)('fence source: $name', (backend) => {
  test.skipIf(backend.skip)("every begin raises the job's fence by one; jobs and queues count apart", async () => {
    const { source } = await backend.open();
    expect([await fenceOf(source, 'q', '1'), await fenceOf(source, 'q', '1'), await fenceOf(source, 'q', '1')]).toEqual([1, 2, 3]);
    expect(await fenceOf(source, 'q', '2')).toBe(1);
    expect(await fenceOf(source, 'other', '1')).toBe(1);
    expect(await fenceOf(source, 'q', '1')).toBe(4);
  });

  test.skipIf(backend.skip)('concurrent begins on one job never share a fence', async () => {
    const { source, reopen } = await backend.open();
    const second = await reopen();
    const fences = await Promise.all(Array.from({ length: 20 }, (_, i) => fenceOf(i % 2 ? second : source, 'q', 'hot')));
    expect([...fences].sort((a, b) => Number(a) - Number(b))).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
  });

  test.skipIf(backend.skip)('the store identity is created once and kept', async () => {
    const { source, reopen } = await backend.open();
    expect(source.storeId).toMatch(/^[0-9a-f]{32}$/);
    expect((await reopen()).storeId).toBe(source.storeId);
    const other = await backend.open();
    expect(other.source.storeId).not.toBe(source.storeId);
  });

  test.skipIf(backend.skip)('a guard that does not hold draws no fence; one that holds does (the control)', async () => {
    const { source, holds, notHeld } = await backend.open();
    expect(await fenceOf(source, 'q', 'g', holds)).toBe(1);
    expect(await fenceOf(source, 'q', 'g', notHeld)).toBe('not_owner');
    expect(await fenceOf(source, 'q', 'g', holds)).toBe(2);
  });

  // SQL only (no test at all on Redis, whose keys expire by themselves: keyTtlMs, below).
  if (backend.name !== 'redis')
    test.skipIf(backend.skip)('sweep forgets the job ids whose latest fence is older than olderThanMs, and only those', async () => {
      const { source, backdate } = await backend.open();
      const DAY = 86_400_000;
      for (const id of ['old', 'old', 'recent', 'renewed']) await fenceOf(source, 'q', id);
      await backdate!('q', 'old', 3 * DAY);
      await backdate!('q', 'recent', DAY / 2);
      await backdate!('q', 'renewed', 3 * DAY);
      // A later draw renews it: its latest fence is now.
      expect(await fenceOf(source, 'q', 'renewed')).toBe(2);
      // The control: an age beyond every row's deletes nothing.
      expect(await source.sweep!({ olderThanMs: 4 * DAY })).toBe(0);
      expect(await source.sweep!({ olderThanMs: 2 * DAY })).toBe(1);
      expect(await fenceOf(source, 'q', 'old')).toBe(1);
      expect(await fenceOf(source, 'q', 'recent')).toBe(2);
      expect(await fenceOf(source, 'q', 'renewed')).toBe(3);
      // In batches: at most `batch` rows per call.
      for (const id of ['a', 'b', 'c']) {
        await fenceOf(source, 'q', id);
        await backdate!('q', id, 3 * DAY);
      }
      expect([await source.sweep!({ olderThanMs: 2 * DAY, batch: 2 }), await source.sweep!({ olderThanMs: 2 * DAY, batch: 2 })]).toEqual([2, 1]);
      await expect(source.sweep!({ olderThanMs: 60_000 })).rejects.toMatchObject({ code: 'invalid_input' });
    });

  test.skipIf(backend.skip)('a guard of another backend is refused', async () => {
    const { source } = await backend.open();
    const foreign: FenceGuard = source.backend === 'redis' ? { kind: 'sql', where: 'true', values: [] } : { kind: 'redis-key', key: 'k', equals: 'v' };
    await expect(source.begin({ queue: 'q', id: '1' }, foreign)).rejects.toMatchObject({ code: 'invalid_input' });
  });
});

describe.skipIf(REDIS_SKIP !== null)("fence source: redis, the lock's remaining life", () => {
  test("begin with a guard reports the guard key's PTTL; guardTtl reads it again, and answers null once the key holds another token or is gone", async () => {
    const client = connectRedis() as ReturnType<typeof connectRedis> & { set(k: string, v: string, px: 'PX', ms: number): Promise<unknown> };
    const namespace = uniquePrefix('fences');
    disposers.push(async () => {
      await deleteKeys(client, namespace);
      await client.quit();
    });
    const source = await createFenceSource({ redis: client, namespace });
    const lock = `${namespace}:lock`;
    await client.set(lock, 'token-1', 'PX', 60_000);
    const guard: FenceGuard = { kind: 'redis-key', key: lock, equals: 'token-1' };
    const begun = await source.begin({ queue: 'q', id: 't' }, guard);
    expect(begun).toMatchObject({ ok: true, fence: 1 });
    const ttl = begun.ok ? begun.guardTtlMs! : -9;
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(60_000);
    expect(await source.guardTtl!(guard)).toBeGreaterThan(0);
    await client.set(lock, 'token-2', 'PX', 60_000);
    expect(await source.guardTtl!(guard)).toBeNull();
    await client.del(lock);
    expect(await source.guardTtl!(guard)).toBeNull();
    // Without a guard there is nothing to time: the fence alone.
    expect(await source.begin({ queue: 'q', id: 't' })).toEqual({ ok: true, fence: 2, storeId: source.storeId });
  });

  test('a Redis that lost its keys (restart without persistence): a source opened before the loss draws under the identity one opened after it created, never the lost one', async () => {
    const client = connectRedis();
    const namespace = uniquePrefix('fences');
    disposers.push(async () => {
      await deleteKeys(client, namespace);
      await client.quit();
    });
    const before = await createFenceSource({ redis: client, namespace });
    const lost = before.storeId;
    expect(await before.begin({ queue: 'q', id: 'j' })).toMatchObject({ ok: true, fence: 1, storeId: lost });
    await deleteKeys(client, namespace);
    const after = await createFenceSource({ redis: client, namespace });
    expect(after.storeId).not.toBe(lost);
    // Both fence job j under the new identity, on one counter: the old process no longer names an entity of its own.
    expect(await before.begin({ queue: 'q', id: 'j' })).toMatchObject({ ok: true, fence: 1, storeId: after.storeId });
    expect(await after.begin({ queue: 'q', id: 'j' })).toMatchObject({ ok: true, fence: 2, storeId: after.storeId });
    expect(before.storeId).toBe(after.storeId);
  });
});

describe.skipIf(REDIS_SKIP !== null)('fence source: redis, the lives of a job id', () => {
  test("every attempt of one life reads the same life; once the job's hash is gone (the job removed), the id's next job is life 2", async () => {
    const client = connectRedis() as ReturnType<typeof connectRedis> & { hset(k: string, f: string, v: string): Promise<unknown> };
    const namespace = uniquePrefix('fences');
    disposers.push(async () => {
      await deleteKeys(client, namespace);
      await client.quit();
    });
    const source = await createFenceSource({ redis: client, namespace });
    const jobHash = `${namespace}:bull:q:7`;
    await client.set(`${jobHash}:lock`, 'token-1');
    await client.hset(jobHash, 'name', 'pay');
    const guard: FenceGuard = { kind: 'redis-key', key: `${jobHash}:lock`, equals: 'token-1', lifeHash: jobHash };
    const life = async () => {
      const r = await source.begin({ queue: 'bull:q', id: '7' }, guard);
      return r.ok ? [r.fence, r.life] : r.reason;
    };
    expect([await life(), await life()]).toEqual([
      [1, 1],
      [2, 1],
    ]);
    await client.del(jobHash);
    await client.hset(jobHash, 'name', 'pay');
    expect([await life(), await life()]).toEqual([
      [3, 2],
      [4, 2],
    ]);
  });
});

describe.skipIf(REDIS_SKIP !== null)("fence source: redis, a job id's keys are forgotten keyTtlMs after its last fence", () => {
  type Client = ReturnType<typeof connectRedis> & { pttl(k: string): Promise<number>; hset(k: string, f: string, v: string): Promise<unknown> };
  const open = async (keyTtlMs?: number | null) => {
    const client = connectRedis() as Client;
    const namespace = uniquePrefix('fences');
    disposers.push(async () => {
      await deleteKeys(client, namespace);
      await client.quit();
    });
    const source = await createFenceSource({ redis: client, namespace, ...(keyTtlMs !== undefined ? { keyTtlMs } : {}) });
    const jobHash = `${namespace}:bull:q:7`;
    await client.set(`${jobHash}:lock`, 'token-1');
    await client.hset(jobHash, 'name', 'pay');
    const guard: FenceGuard = { kind: 'redis-key', key: `${jobHash}:lock`, equals: 'token-1', lifeHash: jobHash };
    // The source's own keys for job 7 of queue bull:q (the fence counter, the lives record), by their place in the namespace.
    const ttls = async () => {
      const [, keys] = await client.scan('0', 'MATCH', `${namespace}:*:bull%3Aq:7`, 'COUNT', 1000);
      return Promise.all(keys.sort().map(async (k) => [k.slice(namespace.length + 1).split(':')[0], await client.pttl(k)] as const));
    };
    return { client, source, guard, ttls };
  };
  const DAY = 86_400_000;

  test('the default keeps each 100 days, renewed by every draw, guarded, with lives, or unguarded', async () => {
    const { source, guard, ttls } = await open();
    expect((await source.begin({ queue: 'bull:q', id: '7' }, guard)).ok).toBe(true);
    const after = await ttls();
    expect(after.map(([k]) => k)).toEqual(['fence', 'lives']);
    for (const [, ttl] of after) expect(ttl).toBeGreaterThan(99 * DAY);
    for (const [, ttl] of after) expect(ttl).toBeLessThanOrEqual(100 * DAY);
    // Unguarded: the counter alone, kept as long.
    expect((await source.begin({ queue: 'bull:q', id: '7' })).ok).toBe(true);
    const [fence] = await ttls();
    expect(fence![1]).toBeGreaterThan(99 * DAY);
  });

  test('a given keyTtlMs is what the keys get; null keeps them for ever (the control: no expiry at all)', async () => {
    const week = await open(7 * DAY);
    await week.source.begin({ queue: 'bull:q', id: '7' }, week.guard);
    for (const [, ttl] of await week.ttls()) expect(ttl).toBeGreaterThan(6 * DAY);
    for (const [, ttl] of await week.ttls()) expect(ttl).toBeLessThanOrEqual(7 * DAY);
    const forever = await open(null);
    await forever.source.begin({ queue: 'bull:q', id: '7' }, forever.guard);
    expect((await forever.ttls()).map(([, ttl]) => ttl)).toEqual([-1, -1]);
  });

  test('a keyTtlMs shorter than a day, or not a whole number, is refused before anything is written', async () => {
    const client = connectRedis();
    disposers.push(() => client.quit());
    for (const bad of [0, 60_000, DAY + 0.5, Number.NaN])
      await expect(createFenceSource({ redis: client, namespace: uniquePrefix('fences'), keyTtlMs: bad })).rejects.toThrow(/keyTtlMs must be/);
  });
});

describe('jobKeys', () => {
  test("a later life of a job id gets its own key prefix; the entity stays the id's", () => {
    const store = 'a'.repeat(32);
    const first = jobKeys(store, { queue: 'q', id: 'a@2' });
    expect(jobKeys(store, { queue: 'q', id: 'a@2', life: 1 })).toEqual(first);
    const second = jobKeys(store, { queue: 'q', id: 'a', life: 2 });
    expect(second).toEqual({ entity: `queue-job:${store}:q:a`, keyPrefix: `queue-job:${store}:q:a@2` });
    // An "@" in an id is encoded, so an id can never spell another id's later life.
    expect(first.keyPrefix).toBe(`queue-job:${store}:q:a%402`);
    expect(() => jobKeys(store, { queue: 'q', id: 'a', life: 0 })).toThrow(/life/);
  });

  const store = 'a'.repeat(32);
  test('a colon in a queue name or job id cannot make two jobs share a key', () => {
    expect(jobKeys(store, { queue: 'a:b', id: 'c' }).keyPrefix).not.toBe(jobKeys(store, { queue: 'a', id: 'b:c' }).keyPrefix);
    expect(jobKeys(store, { queue: 'bull:payments', id: '7' })).toEqual({
      entity: `queue-job:${store}:bull%3Apayments:7`,
      keyPrefix: `queue-job:${store}:bull%3Apayments:7`,
    });
  });
  test('refuses what the gateway would refuse: too long, empty, a bad store id', () => {
    expect(() => jobKeys(store, { queue: 'q', id: 'x'.repeat(100) })).toThrow(/too long/);
    expect(() => jobKeys(store, { queue: '', id: '1' })).toThrow(/queue name/);
    expect(() => jobKeys('2', { queue: 'q', id: '1' })).toThrow(/32 lowercase hex/);
  });
});
