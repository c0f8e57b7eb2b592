/**
 * fencegate/bullmq end to end: real BullMQ workers in child processes on a
 * real Redis, a real gateway (in this process) in front of a counting
 * upstream. W1's lock is lost while it is frozen (SIGSTOP past
 * `lockDuration`), W2 runs the job again as stalled; W1 then wakes up with
 * its charge already on the wire.
 *
 * Within the route's retention the stable Idempotency-Key alone would turn
 * W1's late charge into a replay; the fence is what still stops it once the
 * record is gone. So after W2 paid, the test backdates the gateway's
 * idempotency record past its retention (STYLE habit 2: the row, not the
 * clock), standing for a worker that comes back after a long stall.
 */
import { join } from 'node:path';
import { Queue } from 'bullmq';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { LeaseLostError } from '../../src/lease/errors.js';
import { createFenceSource, fencedProcessor } from '../../src/queue/bullmq.js';
import { killAll, ROOT, spawnProc, TS_ARGS, type Proc } from '../helpers/child.js';
import { paymentsRoute, rejectionRows, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { connectRedis, deleteKeys, REDIS_SKIP, uniquePrefix, type TestRedis } from './helpers/redis.js';

const WORKER = join(ROOT, 'test', 'queue', 'helpers', 'bullmq-worker.ts');
const LOCK_MS = 1_000;
const STALLED_MS = 300;

describe.skipIf(REDIS_SKIP !== null)('fencegate/bullmq: a take-over of a stalled job', () => {
  let redis: TestRedis;
  let upstream: FakeUpstream;
  let gateway: TestGateway;
  const cleanups: (() => Promise<unknown>)[] = [];

  beforeAll(async () => {
    redis = connectRedis();
    upstream = await startUpstream();
    gateway = await startTestGateway({ routes: [paymentsRoute(upstream.url)] });
  });
  afterEach(async () => {
    await killAll();
    for (const c of cleanups.splice(0)) await c();
  });
  afterAll(async () => {
    await gateway?.close();
    await upstream?.close();
    await redis?.quit();
  });

  function startWorker(name: string, config: Record<string, unknown>): Proc {
    return spawnProc(name, [...TS_ARGS, WORKER, JSON.stringify({ lockDuration: LOCK_MS, stalledInterval: STALLED_MS, ...config })], { stdin: true });
  }

  async function scenario(unfenced: boolean) {
    const prefix = uniquePrefix('bull');
    const namespace = uniquePrefix('fences');
    const queueName = 'payments';
    const queue = new Queue(queueName, { connection: connectRedis({ maxRetriesPerRequest: null }) as never, prefix });
    cleanups.push(async () => {
      await queue.close();
      await deleteKeys(redis, prefix);
      await deleteKeys(redis, namespace);
    });
    const before = upstream.effects;
    const common = { queue: queueName, prefix, namespace, gateway: gateway.url, unfenced };
    await queue.add('pay', { amount: 1200 }, { jobId: 'order-1' });

    const w1 = startWorker('W1', { ...common, hold: true });
    const w1Started = await w1.next((m) => m.msg === 'started');
    await w1.next((m) => m.msg === 'sending');
    w1.pause(); // frozen with its charge on the wire: no lock renewals from here on

    // W1 keeps the 1 s lock that W2's stalled check finds expired; W2's own
    // lock is far longer than its run, so a stalled box cannot let it lapse
    // and have the job taken over (or failed as stalled) a second time.
    const w2 = startWorker('W2', { ...common, hold: false, lockDuration: 10_000 });
    const w2Started = await w2.next((m) => m.msg === 'started');
    const w2Paid = await w2.next((m) => m.msg === 'paid');
    await w2.next((m) => m.msg === 'completed');
    expect(w2Paid).toMatchObject({ status: 201, replayed: null });

    // The record of W2's charge is past its retention (DESIGN §2 G2 limit).
    const key = `${w2Started.entity}:charge`;
    expect(gateway.sqlite.db.prepare('UPDATE idempotency_records SET expires_at = 1 WHERE key = ?').run(key).changes).toBe(1);

    w1.send('go');
    w1.resume();
    const w1Outcome = await w1.next((m) => m.msg === 'refused' || m.msg === 'paid');
    return { w1Started, w2Started, w1Outcome, effects: upstream.effects - before, key, storeKey: namespace };
  }

  test('the worker whose lock was lost cannot make a second payment: its late charge is refused as stale', async () => {
    const { w1Started, w2Started, w1Outcome, effects, key } = await scenario(false);
    expect(w1Started).toMatchObject({ fence: 1, jobId: 'order-1' });
    expect(w2Started).toMatchObject({ fence: 2, jobId: 'order-1', entity: w1Started.entity });
    expect(w2Started.entity).toMatch(/^queue-job:[0-9a-f]{32}:fgt-bull-[0-9a-f]{10}%3Apayments:order-1$/);

    // The queue's own counters across the take-over: attemptsMade did not
    // move (it counts failures), so it could not tell W1 from W2.
    expect(w1Started).toMatchObject({ attemptsMade: 0, attemptsStarted: 1, stalledCounter: 0 });
    expect(w2Started).toMatchObject({ attemptsMade: 0, attemptsStarted: 2, stalledCounter: 1 });

    expect(w1Outcome).toMatchObject({ msg: 'refused', name: 'LeaseLostError', code: 'lease_lost', aborted: true });
    expect(effects).toBe(1);
    expect(rejectionRows(gateway.sqlite, 'stale-fence')).toContainEqual(
      expect.objectContaining({ entity: w1Started.entity, presented_fence: 1, current_fence: 2, idempotency_key: key }),
    );
  });

  test('negative control: with every attempt presenting the same fence, the same take-over pays twice', async () => {
    const { w1Started, w2Started, w1Outcome, effects } = await scenario(true);
    expect(w1Started.fence).toBe(1);
    expect(w2Started.fence).toBe(1);
    expect(w1Outcome).toMatchObject({ msg: 'paid', status: 201 });
    expect(effects).toBe(2);
  });

  test('a run whose BullMQ lock is held by another token draws no fence and runs nothing; the holder draws one', async () => {
    // (The take-over tests above prove the lock key matches real BullMQ: with
    // a wrong key every guarded begin there would have been refused.)
    const namespace = uniquePrefix('fences');
    const qqn = uniquePrefix('bull');
    cleanups.push(async () => {
      await deleteKeys(redis, namespace);
      await deleteKeys(redis, qqn);
    });
    const fences = await createFenceSource({ redis, namespace });
    await redis.set(`${qqn}:payments:7:lock`, 'token-of-W2');
    let ran = 0;
    const processor = fencedProcessor(async (_job, { fence }) => {
      ran++;
      return fence;
    }, { fences });
    const job = { id: '7', queueQualifiedName: `${qqn}:payments` };
    await expect(processor(job, 'token-of-W1')).rejects.toBeInstanceOf(LeaseLostError);
    expect(ran).toBe(0);
    expect(await processor(job, 'token-of-W2')).toBe(1);
    expect(ran).toBe(1);
  });
});
