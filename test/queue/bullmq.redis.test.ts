/**
 * fencegate/bullmq end to end: real BullMQ workers in child processes on a
 * real Redis, a real gateway (in this process) in front of a counting
 * h.upstream. W1's lock is lost while it is frozen (SIGSTOP past
 * `lockDuration`), W2 runs the job again as stalled; W1 then wakes up with
 * its charge already on the wire.
 *
 * Within the route's retention the stable Idempotency-Key alone would turn
 * W1's late charge into a replay; the fence is what still stops it once the
 * record is gone. So after W2 paid, the test backdates the gateway's
 * idempotency record past its retention (the row, not the
 * clock), standing for a worker that comes back after a long stall.
 */
import { join } from 'node:path';
import { Queue, Worker, type Job } from 'bullmq';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { LeaseLostError } from '../../src/lease/errors.js';
import { createFenceSource, fencedProcessor, type FenceSource } from '../../src/queue/bullmq.js';
import { ROOT, spawnProc, TS_ARGS, type Proc } from '../helpers/child.js';
import { rejectionRows, until } from '../helpers/gateway.js';
import { expectRefusedExpired, FENCE_SECRET, queueHarness } from './helpers/harness.js';
import { connectRedis, deleteKeys, REDIS_SKIP, uniquePrefix, type TestRedis } from './helpers/redis.js';

const WORKER = join(ROOT, 'test', 'queue', 'helpers', 'bullmq-worker.ts');
const LOCK_MS = 1_000;
const STALLED_MS = 300;

// One client for the suites' own reads and clean-ups (each worker has its own connections).
let redis: TestRedis;
beforeAll(() => {
  if (REDIS_SKIP === null) redis = connectRedis();
});
afterAll(async () => {
  await redis?.quit();
});

describe.skipIf(REDIS_SKIP !== null)('fencegate/bullmq: a take-over of a stalled job', () => {
  const h = queueHarness();

  function startWorker(name: string, config: Record<string, unknown>): Proc {
    return spawnProc(name, [...TS_ARGS, WORKER, JSON.stringify({ lockDuration: LOCK_MS, stalledInterval: STALLED_MS, ...config })], { stdin: true });
  }

  async function scenario(unfenced: boolean) {
    const prefix = uniquePrefix('bull');
    const namespace = uniquePrefix('fences');
    const queueName = 'payments';
    const queue = new Queue(queueName, { connection: connectRedis({ maxRetriesPerRequest: null }) as never, prefix });
    h.cleanups.push(async () => {
      await queue.close();
      await deleteKeys(redis, prefix);
      await deleteKeys(redis, namespace);
    });
    const before = h.upstream.effects;
    const common = { queue: queueName, prefix, namespace, gateway: h.gateway.url, unfenced };
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
    expect(h.gateway.sqlite.db.prepare('UPDATE idempotency_records SET expires_at = 1 WHERE key = ?').run(key).changes).toBe(1);

    w1.send('go');
    w1.resume();
    const w1Outcome = await w1.next((m) => m.msg === 'refused' || m.msg === 'paid');
    return { w1Started, w2Started, w1Outcome, effects: h.upstream.effects - before, key, storeKey: namespace };
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
    expect(rejectionRows(h.gateway.sqlite, 'stale-fence')).toContainEqual(
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
    h.cleanups.push(async () => {
      await deleteKeys(redis, namespace);
      await deleteKeys(redis, qqn);
    });
    const fences = await createFenceSource({ redis, namespace });
    await redis.set(`${qqn}:payments:7:lock`, 'token-of-W2');
    let ran = 0;
    const processor = fencedProcessor(
      async (_job, { fence }) => {
        ran++;
        return fence;
      },
      { fences },
    );
    const job = { id: '7', queueQualifiedName: `${qqn}:payments` };
    await expect(processor(job, 'token-of-W1')).rejects.toBeInstanceOf(LeaseLostError);
    expect(ran).toBe(0);
    expect(await processor(job, 'token-of-W2')).toBe(1);
    expect(ran).toBe(1);
  });
});

/**
 * Signed fences (DESIGN §7) from BullMQ jobs: the JWS's `exp` is the lock end
 * Redis last confirmed (the lock's PTTL when the fence was drawn, then after
 * each renewal the watched worker reports), never "now + lockDuration" at
 * the time of the call. One worker, no take-over: "fence-expired even
 * before a newer owner shows up". Its stalled check is far off, so the job
 * is not moved and run again while the test watches its one attempt.
 */
describe.skipIf(REDIS_SKIP !== null)('fencegate/bullmq: the signed fence expires with the BullMQ lock', () => {
  const GRACE_S = 1;
  const h = queueHarness({ signed: true });

  /** One job, one worker that waits for `call` before it mints and sends its charge. */
  async function start(lockDuration: number, watch: boolean, detached = false) {
    const prefix = uniquePrefix('bull');
    const namespace = uniquePrefix('fences');
    const queue = new Queue('payments', { connection: connectRedis({ maxRetriesPerRequest: null }) as never, prefix });
    h.cleanups.push(async () => {
      await queue.close();
      await deleteKeys(redis, prefix);
      await deleteKeys(redis, namespace);
    });
    await queue.add('pay', { amount: 1200 }, { jobId: 'order-1' });
    const before = h.upstream.effects;
    const config = {
      queue: 'payments',
      prefix,
      namespace,
      gateway: h.gateway.url,
      hold: false,
      unfenced: false,
      lockDuration,
      stalledInterval: 600_000,
      signed: { secret: FENCE_SECRET, graceSeconds: GRACE_S },
      waitForCall: true,
      watch,
      detached,
    };
    const w = spawnProc('W', [...TS_ARGS, WORKER, JSON.stringify(config)], { stdin: true });
    const started = await w.next((m) => m.msg === 'started');
    const startedAt = Date.now();
    const call = async () => {
      w.send('call');
      const outcome = await w.next((m) => m.msg === 'refused' || m.msg === 'paid');
      return { outcome, effects: h.upstream.effects - before };
    };
    return { w, started, startedAt, call, lockKey: `${prefix}:payments:order-1:lock` };
  }

  /** Waits (no assertion on time) until the lock is gone from Redis and its end plus the grace has passed. */
  async function pastLockAndGrace(lockKey: string) {
    await until(async () => (await redis.get(lockKey)) === null, 'the BullMQ lock to expire in Redis');
    const goneAt = Date.now();
    await until(() => Date.now() > goneAt + GRACE_S * 1000 + 1_500, 'the grace to pass');
  }

  // Detached (the job without its Worker): nothing follows the renewals, so the late call is minted
  // and sent, and the gateway's refusal of its exp is what stops it. Followed, the failed renewal on
  // waking stops it before it is sent (the watched test below).
  test('a worker frozen past its lock mints a fence that is already expired: the gateway refuses it (fence-expired) and the upstream is not called', async () => {
    const { w, started, call, lockKey } = await start(2_000, false, true);
    w.pause(); // frozen before the call: no renewals, and the mint happens after the lock is gone
    await pastLockAndGrace(lockKey);
    w.resume();
    expectRefusedExpired(h, await call(), started.entity);
  });

  test('control: the same worker calling within its lock is accepted (201), so the refusal above is the expiry and nothing else', async () => {
    const { call } = await start(30_000, false);
    const { outcome, effects } = await call();
    expect(outcome).toMatchObject({ msg: 'paid', status: 201 });
    expect(effects).toBe(1);
  });

  test.each([
    ['watched, a frozen worker is refused as well once it wakes: its failed renewal (or the gateway) stops the late call, the upstream is not called', true],
    ['unwatched, a frozen worker that follows the Worker its job came from is refused the same way', false],
  ])('%s', async (_name, watch) => {
    const { w, call, lockKey } = await start(2_000, watch);
    w.pause();
    await pastLockAndGrace(lockKey);
    w.resume();
    const { outcome, effects } = await call();
    expect(outcome).toMatchObject({ msg: 'refused', name: 'LeaseLostError', code: 'lease_lost' });
    expect(effects).toBe(0);
  });

  /** A live worker that calls well past its first lock end and the grace; BullMQ renews every LOCK / 2. */
  async function callPastSeveralLocks(watch: boolean, detached: boolean) {
    const LOCK = 3_000;
    const run = await start(LOCK, watch, detached);
    await until(() => Date.now() > run.startedAt + LOCK + GRACE_S * 1000 + 2_000, 'several lock renewals');
    return { ...run, late: await run.call() };
  }

  test.each([
    ['watched, a live worker past several lock durations is accepted: each renewal BullMQ reports moves exp to the lock end Redis confirms', true, false],
    ['without watch, a live worker past several lock durations is accepted as well: the processor follows the Worker its job came from', false, false],
    ["watched, a detached job is accepted past several lock durations: watch is what a processor without the job's Worker needs", true, true],
  ])('%s', async (_name, watch, detached) => {
    const { late } = await callPastSeveralLocks(watch, detached);
    expect(late.outcome).toMatchObject({ msg: 'paid', status: 201 });
    expect(late.effects).toBe(1);
  });

  test('the withdrawn lockDurationMs option is refused rather than ignored; watch needs a source that can read the lock again', async () => {
    const namespace = uniquePrefix('fences');
    h.cleanups.push(() => deleteKeys(redis, namespace));
    const fences = await createFenceSource({ redis, namespace });
    expect(() => fencedProcessor(async () => 1, { fences, lockDurationMs: 2_000 } as never)).toThrow(/lockDurationMs is no longer an option/);
    const blind = fencedProcessor(async () => 1, { fences: { backend: 'redis', storeId: fences.storeId, begin: fences.begin } });
    expect(() => blind.watch({ on: () => undefined })).toThrow(/watch needs a fence source/);
  });

  test('control: a job that does not carry its Worker, unwatched, is refused fence-expired: without renewals exp stays at the lock end begin confirmed, and the error says so', async () => {
    const { w, started, late } = await callPastSeveralLocks(false, true);
    expectRefusedExpired(h, late, started.entity);
    // The handler's error names the expiry; the run's failure (BullMQ's failedReason) also says what to do.
    expect(late.outcome.message).toMatch(/as expired \(fence-expired\)/);
    expect(late.outcome.message).not.toMatch(/newer/);
    expect((await w.next((m) => m.msg === 'failed')).message).toMatch(/as expired \(fence-expired\).*processor\.watch\(worker\)/);
  });
});

/**
 * A BullMQ job id used again after its job was removed (a custom `jobId`
 * such as an order number): the new job is another job, and must not get
 * the old one's Idempotency-Keys, or the gateway replays the old job's
 * stored answer instead of running it. Real BullMQ workers in this process,
 * real Redis, a real gateway.
 */
describe.skipIf(REDIS_SKIP !== null)('fencegate/bullmq: a job id used again after removal', () => {
  const h = queueHarness();

  /**
   * Runs job `order-1` twice, removing it in between; `wrap` may change the
   * fence source, `between` runs after the removal (the same worker and
   * source carry on).
   */
  async function twoLives(
    wrap: (real: FenceSource) => FenceSource = (real) => real,
    between?: (namespace: string) => Promise<unknown>,
    removeOnComplete = false,
  ) {
    const prefix = uniquePrefix('bull');
    const namespace = uniquePrefix('fences');
    const connection = connectRedis({ maxRetriesPerRequest: null });
    const queue = new Queue('payments', { connection: connection as never, prefix });
    const fences = wrap(await createFenceSource({ redis: connection, namespace }));
    const runs: { fence: number; entity: string; keyPrefix: string; status: number; replayed: string | null }[] = [];
    const processor = fencedProcessor<Job, unknown>(
      async (job, { fencedFetch, fence, entity, keyPrefix }) => {
        const res = await fencedFetch(`${h.gateway.url}/payments/charges`, {
          step: 'charge',
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify(job.data),
        });
        runs.push({ fence, entity, keyPrefix, status: res.status, replayed: res.headers.get('idempotent-replayed') });
        return res.status;
      },
      { fences },
    );
    const worker = new Worker('payments', processor as never, { connection: connection as never, prefix, lockDuration: 30_000 });
    h.cleanups.push(async () => {
      await worker.close();
      await queue.close();
      await deleteKeys(redis, prefix);
      await deleteKeys(redis, namespace);
      await connection.quit();
    });
    const before = h.upstream.effects;
    for (let life = 1; life <= 2; life++) {
      const done = new Promise<void>((resolve, reject) => {
        worker.once('completed', () => resolve());
        worker.once('failed', (_job, err) => reject(err));
      });
      await queue.add('pay', { amount: 1200 }, { jobId: 'order-1', removeOnComplete });
      await done;
      // Removed (by removeOnComplete, or here), so the same id can be added again as a new job.
      if (!removeOnComplete) await queue.remove('order-1');
      if (life === 1) await between?.(namespace);
    }
    return { runs, effects: h.upstream.effects - before, namespace };
  }

  test('the second job under the id gets keys of its own: both are charged, neither answer is a replay', async () => {
    const { runs, effects } = await twoLives();
    expect(runs.map((r) => [r.status, r.replayed])).toEqual([
      [201, null],
      [201, null],
    ]);
    expect(runs[1]!.keyPrefix).toBe(`${runs[0]!.keyPrefix}@2`);
    // The fence kept rising across the lives: a stale worker of the first job is still refused.
    expect(runs.map((r) => r.fence)).toEqual([1, 2]);
    expect(effects).toBe(2);
  });

  test('the same with removeOnComplete and the id added again as soon as the first job completed: the marker is random, not a time, so the second job still gets keys of its own', async () => {
    const { runs, effects } = await twoLives(undefined, undefined, true);
    expect(runs.map((r) => [r.status, r.replayed])).toEqual([
      [201, null],
      [201, null],
    ]);
    expect(runs[1]!.keyPrefix).toBe(`${runs[0]!.keyPrefix}@2`);
    expect(effects).toBe(2);
  });

  // The suite's Redis is shared, so the loss is this namespace's keys (the
  // store id, the counters, the lives), which is what a restart without
  // persistence or a flush leaves of them.
  test('after the Redis lost the fence keys (restart without persistence), the running worker takes the new identity: the second job gets keys of its own and the identity a process started after the loss reads', async () => {
    const { runs, effects, namespace } = await twoLives(undefined, (ns) => deleteKeys(redis, ns));
    // Counted from 1 again, and life 1 again, but under a new identity: nothing of the first job's is reused.
    expect(runs.map((r) => [r.status, r.replayed])).toEqual([
      [201, null],
      [201, null],
    ]);
    expect(effects).toBe(2);
    expect(runs.map((r) => r.fence)).toEqual([1, 1]);
    expect(runs[1]!.entity).not.toBe(runs[0]!.entity);
    // A worker process started after the loss fences the job on the same entity.
    const later = await createFenceSource({ redis, namespace });
    expect(runs[1]!.entity).toContain(`queue-job:${later.storeId}:`);
  });

  test("negative control: without the job's life in the guard, the second job gets the first one's keys and the gateway replays the first charge", async () => {
    const { runs, effects } = await twoLives((real) => ({
      backend: real.backend,
      storeId: real.storeId,
      guardTtl: real.guardTtl,
      begin: (job, guard) => real.begin(job, guard?.kind === 'redis-key' ? { kind: 'redis-key', key: guard.key, equals: guard.equals } : guard),
    }));
    expect(runs[1]!.keyPrefix).toBe(runs[0]!.keyPrefix);
    expect(runs.map((r) => [r.status, r.replayed])).toEqual([
      [201, null],
      [201, 'true'],
    ]);
    expect(effects).toBe(1);
  });
});
