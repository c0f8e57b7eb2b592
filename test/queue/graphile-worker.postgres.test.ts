/**
 * fencegate/graphile-worker end to end: real graphile-worker runners in
 * child processes on the real PostgreSQL (a private schema per test), a real
 * gateway in front of a counting h.upstream.
 *
 * graphile-worker's lock lasts 4 hours. The test does not wait for that: it
 * simulates the expiry honestly in the database, by moving the job row's
 * `locked_at` 5 hours into the past while W1 is frozen (SIGSTOP), and lets
 * W2's own periodic reset (resetLockedAt, its interval shortened) release
 * and re-lock it as it would after 4 real hours. As in the BullMQ test, the
 * gateway's record of W2's charge is then backdated past its retention, so
 * only the fence stands between W1's late charge and a second payment.
 */
import { join } from 'node:path';
import { makeWorkerUtils, runMigrations, type WorkerUtils } from 'graphile-worker';
import { describe, expect, test } from 'vitest';
import { LeaseLostError } from '../../src/lease/errors.js';
import { createFenceSource, fencedTask } from '../../src/queue/graphile-worker.js';
import { ROOT, spawnProc, TS_ARGS, type Proc } from '../helpers/child.js';
import { rejectionRows, until } from '../helpers/gateway.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { expectRefusedExpired, FENCE_SECRET, queueHarness, type QueueHarness } from './helpers/harness.js';

const WORKER = join(ROOT, 'test', 'queue', 'helpers', 'graphile-worker.ts');

/** A private schema for the fence tables and one beside it for graphile-worker's own. */
async function setUpSchemas(h: QueueHarness): Promise<{ db: TestSchema; workerSchema: string; utils: WorkerUtils }> {
  const db = await createTestSchema('fgq');
  const workerSchema = `${db.schema}_gw`;
  await createFenceSource({ postgres: db.pool });
  await runMigrations({ pgPool: db.pool, schema: workerSchema });
  const utils = await makeWorkerUtils({ pgPool: db.pool, schema: workerSchema });
  h.cleanups.push(async () => {
    await utils.release();
    await db.pool.query(`DROP SCHEMA IF EXISTS "${workerSchema}" CASCADE`);
    await db.drop();
  });
  return { db, workerSchema, utils };
}

describe.skipIf(!POSTGRES_URL)('fencegate/graphile-worker: a take-over after the lock expired', () => {
  const h = queueHarness();

  const setUp = () => setUpSchemas(h);

  function startWorker(name: string, config: Record<string, unknown>): Proc {
    return spawnProc(name, [...TS_ARGS, WORKER, JSON.stringify(config)], { stdin: true });
  }

  async function scenario(unfenced: boolean) {
    const { db, workerSchema, utils } = await setUp();
    const common = { url: db.url, workerSchema, gateway: h.gateway.url, unfenced };
    const before = h.upstream.effects;
    const job = await utils.addJob('pay', { amount: 1200 });

    const w1 = startWorker('W1', { ...common, hold: true });
    const w1Started = await w1.next((m) => m.msg === 'started');
    await w1.next((m) => m.msg === 'sending');
    w1.pause();
    // The simulated expiry: W1's lock is now 5 h old, past graphile-worker's 4 h.
    const backdated = await db.pool.query(
      `UPDATE "${workerSchema}"._private_jobs SET locked_at = now() - interval '5 hours' WHERE id = $1 AND locked_at IS NOT NULL`,
      [job.id],
    );
    expect(backdated.rowCount).toBe(1);

    const w2 = startWorker('W2', { ...common, hold: false });
    const w2Started = await w2.next((m) => m.msg === 'started');
    expect(await w2.next((m) => m.msg === 'paid')).toMatchObject({ status: 201, replayed: null });
    await w2.next((m) => m.msg === 'completed');

    const key = `${w2Started.entity}:charge`;
    expect(h.gateway.sqlite.db.prepare('UPDATE idempotency_records SET expires_at = 1 WHERE key = ?').run(key).changes).toBe(1);

    w1.send('go');
    w1.resume();
    const w1Outcome = await w1.next((m) => m.msg === 'refused' || m.msg === 'paid');
    return { w1Started, w2Started, w1Outcome, effects: h.upstream.effects - before, key, job };
  }

  test('the worker whose lock expired cannot make a second payment: its late charge is refused as stale', async () => {
    const { w1Started, w2Started, w1Outcome, effects, key, job } = await scenario(false);
    expect(w1Started).toMatchObject({ jobId: String(job.id), fence: 1, attempts: 1 });
    // graphile-worker's own counter rose with the take-over too (same UPDATE as the lock).
    expect(w2Started).toMatchObject({ jobId: String(job.id), fence: 2, attempts: 2, entity: w1Started.entity });
    expect(w2Started.entity).toMatch(/^queue-job:[0-9a-f]{32}:fgq_[0-9a-f]{12}_gw:\d+$/);
    expect(w1Outcome).toMatchObject({ msg: 'refused', name: 'LeaseLostError', code: 'lease_lost', aborted: true });
    expect(effects).toBe(1);
    expect(rejectionRows(h.gateway.sqlite, 'stale-fence')).toContainEqual(
      expect.objectContaining({ entity: w1Started.entity, presented_fence: 1, current_fence: 2, idempotency_key: key }),
    );
  });

  test('negative control: with every attempt presenting the same fence, the same take-over pays twice', async () => {
    const { w1Started, w2Started, w1Outcome, effects } = await scenario(true);
    expect([w1Started.fence, w2Started.fence]).toEqual([1, 1]);
    expect(w1Outcome).toMatchObject({ msg: 'paid', status: 201 });
    expect(effects).toBe(2);
  });

  test('a task run for a job this worker does not hold draws no fence and sends nothing', async () => {
    const { db, workerSchema, utils } = await setUp();
    const fences = await createFenceSource({ postgres: db.pool, migrate: false });
    const job = await utils.addJob('pay', { amount: 1 });
    let ran = false;
    const task = fencedTask(
      async () => {
        ran = true;
      },
      { fences, workerSchema },
    );
    // The job is not locked at all, so no worker id matches the share-locked check.
    await expect(task({}, { job: { id: job.id, locked_by: 'worker-not-holding-it' } })).rejects.toBeInstanceOf(LeaseLostError);
    expect(ran).toBe(false);
    expect((await db.pool.query('SELECT count(*)::int AS n FROM fencegate_queue_fences')).rows[0].n).toBe(0);
    // Control: the same call as the holder (the row locked by it) draws fence 1.
    await db.pool.query(`UPDATE "${workerSchema}"._private_jobs SET locked_by = 'holder', locked_at = now() WHERE id = $1`, [job.id]);
    await task({}, { job: { id: job.id, locked_by: 'holder' } });
    expect(ran).toBe(true);
    expect((await db.pool.query('SELECT fence::int AS fence FROM fencegate_queue_fences')).rows).toEqual([{ fence: 1 }]);
  });
});

/**
 * Signed fences (DESIGN §7) from graphile-worker tasks: nothing renews its
 * lock, which lasts 4 h from the `locked_at` get_job wrote on the database's
 * clock, so the JWS's `exp` is `locked_at + lockMs`, never "now + 4 h" at the
 * time of the call. The test cannot wait 4 h: the task's `lockMs` is set to
 * 2 s, standing for graphile-worker's 4 h (the adapter takes any value up to
 * it), and the worker is frozen past that before its call.
 */
describe.skipIf(!POSTGRES_URL)('fencegate/graphile-worker: the signed fence expires with the lock', () => {
  const GRACE_S = 1;
  const h = queueHarness({ signed: true });

  async function start(lockMs: number | undefined) {
    const { db, workerSchema, utils } = await setUpSchemas(h);
    await utils.addJob('pay', { amount: 1200 });
    const before = h.upstream.effects;
    const config = {
      url: db.url,
      workerSchema,
      gateway: h.gateway.url,
      hold: false,
      unfenced: false,
      signed: { secret: FENCE_SECRET, graceSeconds: GRACE_S },
      waitForCall: true,
      lockMs,
    };
    const w = spawnProc('W', [...TS_ARGS, WORKER, JSON.stringify(config)], { stdin: true });
    const started = await w.next((m) => m.msg === 'started');
    const call = async () => {
      w.send('call');
      const outcome = await w.next((m) => m.msg === 'refused' || m.msg === 'paid');
      return { outcome, effects: h.upstream.effects - before };
    };
    return { w, started, call };
  }

  test('a worker frozen past its lock (locked_at + lockMs) mints an expired fence: the gateway refuses it (fence-expired) and the upstream is not called', async () => {
    const LOCK = 2_000;
    const { w, started, call } = await start(LOCK);
    w.pause();
    const lockEnd = new Date(started.lockedAt).getTime() + LOCK;
    expect(Number.isFinite(lockEnd)).toBe(true);
    await until(() => Date.now() > lockEnd + GRACE_S * 1000 + 2_000, 'the lock end and the grace to pass');
    w.resume();
    expectRefusedExpired(h, await call(), started.entity);
  });

  test("control: with graphile-worker's own 4 h lock the same frozen worker is accepted (201): its lock has not ended", async () => {
    const { w, started, call } = await start(undefined);
    w.pause();
    await until(() => Date.now() > new Date(started.lockedAt).getTime() + 2_000 + GRACE_S * 1000 + 2_000, 'as long a freeze as above');
    w.resume();
    const { outcome, effects } = await call();
    expect(outcome).toMatchObject({ msg: 'paid', status: 201 });
    expect(effects).toBe(1);
  });

  test("lockMs beyond graphile-worker's 4 h, and a signed task without locked_at, are refused before anything runs", async () => {
    const db = await createTestSchema('fgq');
    h.cleanups.push(() => db.drop());
    const fences = await createFenceSource({ postgres: db.pool });
    expect(() => fencedTask(async () => {}, { fences, lockMs: 5 * 3_600_000 })).toThrow(/lockMs must be/);
    let ran = false;
    const task = fencedTask(
      async () => {
        ran = true;
      },
      { fences, fenceSigner: () => 'x' },
    );
    await expect(task({}, { job: { id: 1, locked_by: 'w' } })).rejects.toThrow(/locked_at/);
    expect(ran).toBe(false);
  });
});
