/**
 * Job stores never share keys or fence entities (DESIGN §3, §6): two job
 * databases behind ONE real gateway (in front of a recording upstream that is
 * not idempotent) both have a job 1, 2 and 3. With the store's identity in
 * every key and default entity, each job pays once and nobody sees anybody
 * else's answer. The negative control runs the same scenario on rows without
 * the identity (the old `tool-job:<id>` format, as rows from before migration
 * 0007 have): replays of the other store's charge, 422, and stale fences.
 *
 * Then the upgrade: a job an older worker claimed before migration 0007 keeps
 * its old entity, so the new worker that takes it over fences the old one.
 */
import { afterEach, beforeEach, describe, expect, test, vi } from 'vitest';
import type { LeaseEvent } from '../../src/lease/events.js';
import type { FencedFetch } from '../../src/lease/fenced-fetch.js';
import { runWorker } from '../../src/lease/runner/run-worker.js';
import type { LeaseWorker } from '../../src/lease/runner/types.js';
import { createPostgresJobStore } from '../../src/lease/postgres/store.js';
import { createSqliteJobStore } from '../../src/lease/sqlite/store.js';
import type { JobStore } from '../../src/lease/types.js';
import { loadMigrations } from '../../src/store/migrations.js';
import { migratePostgres } from '../../src/store/postgres/migrate.js';
import { migrateSqlite } from '../../src/store/sqlite/migrate.js';
import { openSqlite } from '../../src/db/sqlite-open.js';
import { command, paymentsRoute, rejectionRows, startTestGateway, tempDir, type TestGateway } from '../helpers/gateway.js';
import { createTestSchema } from '../helpers/postgres.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { TS_EXEC_ARGV } from './helpers/node.js';
import { BACKENDS, type TestDatabase } from './helpers/stores.js';

interface Paid {
  status: number;
  replayed: string | null;
  body: { effect?: number; entity?: string; key?: string; type?: string };
}

describe('job stores behind one gateway', () => {
  let upstream: FakeUpstream;
  let gateway: TestGateway;
  const workers: LeaseWorker[] = [];
  const cleanups: (() => Promise<void> | void)[] = [];

  // A fresh gateway and upstream per test: the old-format keys of one test
  // must not meet another test's.
  beforeEach(async () => {
    upstream = await startUpstream();
    gateway = await startTestGateway({ routes: [paymentsRoute(upstream.url)] });
  });
  afterEach(async () => {
    await Promise.all(workers.splice(0).map((w) => w.stop({ release: true })));
    for (const c of cleanups.splice(0).reverse()) await c();
    await gateway?.close();
    await upstream?.close();
  });

  /** A worker whose handler pays the job's payload through the gateway and returns what it got. */
  async function startWorker(store: JobStore, workerId: string) {
    const pay = async ({ job, fencedFetch }: { job: { payload: unknown }; fencedFetch: FencedFetch }): Promise<Paid> => {
      const res = await fencedFetch(`${gateway.url}/payments/charges`, {
        step: 'charge',
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(job.payload),
      });
      return { status: res.status, replayed: res.headers.get('idempotent-replayed'), body: (await res.json()) as Paid['body'] };
    };
    const worker = await runWorker({
      store,
      workerId,
      // Long enough that a shared disk's fsync stall does not end a lease
      // mid-test (a re-claim would raise the fence the tests check); no test
      // here waits for a lease to run out, they expire it (expireLease).
      leaseMs: 5_000,
      heartbeatMs: 300,
      maxMissedHeartbeats: 3,
      jitterMs: 50,
      pollIntervalMs: 25,
      threadExecArgv: TS_EXEC_ARGV,
      handlers: { pay, 'pay-again': pay },
    });
    workers.push(worker);
    const events: LeaseEvent[] = [];
    worker.events.onAny((e) => events.push(e));
    return { worker, events };
  }

  /** Waits until each of `ids` had its first attempt settled (committed or rejected), then stops the worker. */
  async function firstOutcomes(w: { worker: LeaseWorker; events: LeaseEvent[] }, ids: number[]) {
    const settled = (id: number) => w.events.find((e) => e.jobId === id && (e.type === 'result_committed' || e.type === 'result_rejected'));
    await vi.waitFor(() => expect(ids.every((id) => settled(id) !== undefined)).toBe(true), { timeout: 20_000, interval: 20 });
    await w.worker.stop({ release: true });
    return ids.map((id) => settled(id)!);
  }

  /**
   * Both stores get jobs 1, 2, 3: job 1 with the same payload in both (the
   * old keys would replay A's charge to B), job 2 with different payloads
   * (the old keys would be refused with 422), job 3 taken over once in A
   * before it pays, so A's fence for it is 2 when B presents 1 (the old
   * entity would be refused as stale).
   */
  async function scenario(pair: [TestDatabase, TestDatabase], { withStoreId }: { withStoreId: boolean }) {
    const [a, b] = await Promise.all(pair.map((d) => d.open()));
    expect(a!.storeId).not.toBe(b!.storeId);
    for (const [i, store] of [a!, b!].entries()) {
      const jobs = [
        await store.enqueue({ kind: 'pay', idempotencyKey: `order-1`, payload: { amount: 1200 } }),
        await store.enqueue({ kind: 'pay', idempotencyKey: `order-2`, payload: { amount: i === 0 ? 500 : 900 } }),
        await store.enqueue({ kind: 'pay-again', idempotencyKey: `order-3`, payload: { amount: 300 } }),
      ];
      expect(jobs.map((j) => j.job.id)).toEqual([1, 2, 3]);
    }
    if (!withStoreId) for (const d of pair) await d.sql('UPDATE tool_jobs SET store_id = NULL');
    const takeover = await a!.claim({ workerId: 'A-gone', kinds: ['pay-again'] });
    expect(takeover.lease).toMatchObject({ id: 3, fencingToken: 1 });
    await pair[0].expireLease(3);

    const before = upstream.effects;
    const wa = await startWorker(a!, 'worker-A');
    const outA = await firstOutcomes(wa, [1, 2, 3]);
    const wb = await startWorker(b!, 'worker-B');
    const outB = await firstOutcomes(wb, [1, 2, 3]);
    const jobsA = await Promise.all([1, 2, 3].map((id) => a!.get(id)));
    const jobsB = await Promise.all([1, 2, 3].map((id) => b!.get(id)));
    return { a: a!, b: b!, outA, outB, jobsA, jobsB, effects: upstream.effects - before, calls: upstream.calls.slice(before) };
  }

  for (const backend of BACKENDS) {
    const pairOf = async (): Promise<[TestDatabase, TestDatabase]> => {
      const pair: [TestDatabase, TestDatabase] = [await backend.factory(), await backend.factory()];
      cleanups.push(() => Promise.all(pair.map((d) => d.dispose())).then(() => undefined));
      return pair;
    };

    test.skipIf(backend.skip)(`${backend.name}: job N of each store pays once, on its own key and entity; no 422, no replay, no stale fence`, async () => {
      const rejectionsBefore = rejectionRows(gateway.sqlite).length;
      const r = await scenario(await pairOf(), { withStoreId: true });
      expect([...r.outA, ...r.outB].map((e) => e.type)).toEqual(Array(6).fill('result_committed'));
      expect(r.effects).toBe(6);
      for (const [store, jobs] of [
        [r.a, r.jobsA],
        [r.b, r.jobsB],
      ] as const) {
        for (const job of jobs) {
          expect(job).toMatchObject({ state: 'succeeded', jobKey: `tool-job:${store.storeId}:${job!.id}`, fenceKey: `tool-job:${store.storeId}:${job!.id}` });
          expect(job!.result).toMatchObject({ status: 201, replayed: null, body: { entity: job!.jobKey, key: `${job!.jobKey}:charge` } });
        }
      }
      // Six payments, six keys, six entities, six answers: B was never answered with A's charge.
      expect(new Set(r.calls.map((c) => c.key)).size).toBe(6);
      expect(new Set(r.calls.map((c) => c.entity)).size).toBe(6);
      expect(new Set([...r.jobsA, ...r.jobsB].map((j) => (j!.result as Paid).body.effect)).size).toBe(6);
      expect(rejectionRows(gateway.sqlite).slice(rejectionsBefore)).toEqual([]);
    });

    test.skipIf(backend.skip)(`${backend.name}: negative control: without the store id the same jobs collide (replay, 422, stale fence)`, async () => {
      const rejectionsBefore = rejectionRows(gateway.sqlite).length;
      const r = await scenario(await pairOf(), { withStoreId: false });
      expect(r.jobsB.map((j) => j!.jobKey)).toEqual(['tool-job:1', 'tool-job:2', 'tool-job:3']);
      // Only A's three payments reached the upstream: B's three orders were never paid.
      expect(r.effects).toBe(3);
      const [b1, b2] = r.jobsB.map((j) => j!.result as Paid);
      // Job 1: B got A's charge replayed, as if it had paid.
      expect(b1).toMatchObject({ status: 201, replayed: 'true', body: { effect: (r.jobsA[0]!.result as Paid).body.effect } });
      // Job 2: another payload under A's key.
      expect(b2!.status).toBe(422);
      // Job 3: A's fence for the shared entity was already 2.
      expect(r.outB[2]).toMatchObject({ type: 'result_rejected', reason: 'lease_lost' });
      expect(rejectionRows(gateway.sqlite).slice(rejectionsBefore)).toEqual([
        expect.objectContaining({ reason: 'idempotency-key-reused', idempotency_key: 'tool-job:2:charge' }),
        expect.objectContaining({ reason: 'stale-fence', entity: 'tool-job:3', presented_fence: 1, current_fence: 2 }),
      ]);
    });
  }

  /** A database migrated up to (not including) 0007, as the previous release left it, and a store on it after the upgrade. */
  interface OldDatabase {
    /** Runs SQL on the old schema (`?` or `$1` params by dialect). */
    sql(text: string): Promise<void>;
    /** Opens a store of this release: applies 0007. */
    upgrade(): Promise<JobStore>;
    dispose(): Promise<void>;
  }

  const oldDatabases: { name: string; skip: boolean; open: () => Promise<OldDatabase> }[] = [
    {
      name: 'sqlite',
      skip: false,
      async open() {
        const tmp = tempDir('fencegate-upgrade-');
        const path = `${tmp.dir}/jobs.db`;
        const raw = openSqlite(path);
        migrateSqlite(
          raw,
          loadMigrations('sqlite').filter((m) => m.name < '0007'),
        );
        let store: JobStore | undefined;
        return {
          async sql(text) {
            raw.exec(text);
          },
          async upgrade() {
            store = createSqliteJobStore({ path });
            return store;
          },
          async dispose() {
            await store?.close();
            raw.close();
            tmp.cleanup();
          },
        };
      },
    },
    {
      name: 'postgres',
      skip: BACKENDS.find((b) => b.name === 'postgres')!.skip,
      async open() {
        const schema = await createTestSchema('lease_upgrade');
        await migratePostgres(
          schema.pool,
          loadMigrations('postgres').filter((m) => m.name < '0007'),
        );
        let store: JobStore | undefined;
        return {
          async sql(text) {
            await schema.pool.query(text);
          },
          async upgrade() {
            store = await createPostgresJobStore({ pool: schema.pool, connectionString: schema.url });
            return store;
          },
          async dispose() {
            await store?.close();
            await schema.drop();
          },
        };
      },
    },
  ];

  /**
   * The previous release enqueued job 1 and an older worker claimed it
   * (token 1, entity tool-job:1), then paused; its lease ran out. The
   * database is upgraded, a worker of this release takes the job over and
   * pays, then the old worker wakes and sends what the previous release sent.
   * `rederive` is the design this release avoids: the job's entity derived
   * afresh from the store id, so the old and the new owner are fenced on two
   * different entities.
   */
  async function upgradeScenario(backend: (typeof oldDatabases)[number], { rederive }: { rederive: boolean }) {
    const old = await backend.open();
    cleanups.push(() => old.dispose());
    const now = backend.name === 'sqlite' ? "CAST(unixepoch('subsec') * 1000 AS INTEGER)" : 'now()';
    const past = backend.name === 'sqlite' ? `${now} - 3600000` : "now() - interval '1 hour'";
    await old.sql(
      `INSERT INTO tool_jobs (kind, idempotency_key, payload, payload_sha256, max_attempts, created_at, run_after,
                              state, owner_id, fencing_token, attempt, lease_until, first_claimed_at, heartbeat_at)
       VALUES ('pay', 'order-1', '{"amount":1200}', 'old', 3, ${now}, ${now}, 'running', 'old-worker', 1, 1, ${past}, ${now}, ${now})`,
    );

    const store = await old.upgrade();
    expect(store.storeId).toMatch(/^[0-9a-f]{32}$/);
    expect(await store.get(1)).toMatchObject({ jobKey: 'tool-job:1', fenceKey: 'tool-job:1' });
    // A job enqueued after the upgrade carries the store's identity.
    const fresh = await store.enqueue({ kind: 'pay', idempotencyKey: 'order-2', payload: { amount: 10 } });
    expect(fresh.job.jobKey).toBe(`tool-job:${store.storeId}:2`);
    if (rederive) await old.sql(`UPDATE tool_jobs SET store_id = '${store.storeId}' WHERE id = 1`);

    const before = upstream.effects;
    const rejectionsBefore = rejectionRows(gateway.sqlite).length;
    const w = await startWorker(store, 'new-worker');
    await w.worker.events.waitFor('result_committed', (e) => e.jobId === 1);
    await w.worker.stop({ release: true });
    const taken = (await store.get(1))!;
    expect(taken).toMatchObject({ state: 'succeeded', fencingToken: 2, previousOwnerId: 'old-worker' });
    const late = await command(gateway.url, '/payments/charges', { fence: 1, entity: 'tool-job:1', key: 'tool-job:1:charge', body: '{"amount":1200}' });
    return {
      late: late.status,
      payments: upstream.calls.slice(before).filter((c) => c.body.toString() === '{"amount":1200}').length,
      entity: (taken.result as Paid).body.entity,
      rejections: rejectionRows(gateway.sqlite).slice(rejectionsBefore),
    };
  }

  for (const backend of oldDatabases) {
    test.skipIf(backend.skip)(
      `${backend.name}: upgrade: a job an older worker claimed before migration 0007 keeps its entity, so the new owner fences the old one`,
      async () => {
        const r = await upgradeScenario(backend, { rederive: false });
        expect(r).toMatchObject({ late: 409, payments: 1, entity: 'tool-job:1' });
        expect(r.rejections).toEqual([expect.objectContaining({ reason: 'stale-fence', entity: 'tool-job:1', presented_fence: 1, current_fence: 2 })]);
      },
    );

    test.skipIf(backend.skip)(`${backend.name}: negative control: an entity derived afresh at the upgrade lets the old owner pay a second time`, async () => {
      const r = await upgradeScenario(backend, { rederive: true });
      expect(r).toMatchObject({ late: 201, payments: 2, rejections: [] });
      expect(r.entity).not.toBe('tool-job:1');
    });
  }
});
