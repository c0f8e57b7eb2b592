/**
 * The runner against a real database (both backends): the heartbeat thread
 * opens its own connection from the store's descriptor, exactly as in
 * production. Tests wait on the runner's events, not on sleeps; the only
 * waiting on time is the scenario itself (a slow handler, a blocked thread).
 */
import { createHash } from 'node:crypto';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { z } from 'zod';
import { JobError, LeaseError, LeaseLostError, OwnershipUnknownError } from '../../src/lease/errors.js';
import type { LeaseEvent } from '../../src/lease/events.js';
import { runWorker } from '../../src/lease/runner/run-worker.js';
import type { RunWorkerOptions } from '../../src/lease/runner/options.js';
import type { LeaseWorker } from '../../src/lease/runner/types.js';
import type { JobStore } from '../../src/lease/types.js';
import { killAll as killAllChildren, spawnChild } from '../helpers/child.js';
import { startFakeGateway, type FakeGateway } from './helpers/fake-gateway.js';
import { TS_EXEC_ARGV } from './helpers/node.js';
import type { TestDatabase, TestDatabaseFactory } from './helpers/stores.js';

/** Blocks this thread's event loop without burning a core (like a stuck native call). */
function blockEventLoop(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Resolves once `check` returns a value; for database state that only time (the lease) changes. */
async function eventually<T>(check: () => Promise<T | null | undefined>, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error('condition not reached in time');
    await sleep(25);
  }
}

function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, opened };
}

/**
 * The suite's default: a lease that never runs out while a test looks (a
 * shared disk stalls an fsync for seconds, and a lapsed lease re-claims the
 * job with the next token, which the tests check). No test waits for it to
 * end: those that need a lease gone expire it in the database
 * (`db.expireLease`) or set a short lease of their own. 5000 > 3 × 80 + 50.
 */
const TIMING = { leaseMs: 5_000, heartbeatMs: 80, maxMissedHeartbeats: 3, jitterMs: 50 } as const;
/**
 * For the tests whose point is a lease lost for one reason only (the stall)
 * or kept across a blocked event loop: short enough to wait for, three times
 * a 500 ms lease that a CI run's stalled fsyncs ended (46% iowait), and time
 * to miss three beats of 150 ms.
 */
const STALL_PROOF = { leaseMs: 1_500, heartbeatMs: 150 } as const;
/** For the tests that watch heartbeats keep a lease across several lease lengths: longer than the stalls seen. */
const BEATING = { leaseMs: 4_000, heartbeatMs: 300 } as const;

/**
 * `all`: every test. `store-dependent`: only those whose outcome depends on
 * the backend (the heartbeat thread's own connection, leases, retries through
 * the store, a killed process); the runner-only behaviour (validation,
 * headers, the gateway story, stop) is the same on every backend and runs once.
 */
export function runnerSuite(name: string, factory: TestDatabaseFactory, scope: 'all' | 'store-dependent' = 'all'): void {
  // Not registered at all in 'store-dependent' scope (they are not skipped:
  // they run in the 'all' suite).
  const runnerOnly = scope === 'all' ? test : ((() => {}) as unknown as typeof test);
  describe(`runWorker on ${name}`, () => {
    let db: TestDatabase;
    let store: JobStore;
    let gateway: FakeGateway;
    const workers: LeaseWorker[] = [];
    let n = 0;
    const unique = (prefix: string) => `${prefix}-${++n}`;

    beforeAll(async () => {
      db = await factory();
      store = await db.open();
      gateway = await startFakeGateway();
    });
    afterEach(async () => {
      await Promise.all(workers.splice(0).map((w) => w.stop({ release: true })));
    });
    afterAll(async () => {
      await killAllChildren();
      await gateway?.close();
      await db?.dispose();
    });

    async function start(options: Partial<RunWorkerOptions> & Pick<RunWorkerOptions, 'handlers'>) {
      const worker = await runWorker({
        store,
        workerId: unique('worker'),
        ...TIMING,
        pollIntervalMs: 25,
        threadExecArgv: TS_EXEC_ARGV,
        ...options,
      });
      workers.push(worker);
      const events: LeaseEvent[] = [];
      worker.events.onAny((e) => events.push(e));
      return { worker, events };
    }

    test('the heartbeat keeps a slow handler’s lease alive for 3× the lease length', async () => {
      const { leaseMs } = BEATING;
      const kind = unique('slow');
      const { job } = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {} });
      const { worker, events } = await start({
        ...BEATING,
        handlers: {
          [kind]: async () => {
            await sleep(3 * leaseMs);
            return { done: true };
          },
        },
      });
      await worker.events.waitFor('heartbeat_ok', (e) => e.jobId === job.id);
      const { running, minLeaseLeftMs, maxHeartbeatAgeMs } = worker.metrics().gauges[kind]!;
      expect(running).toBe(1);
      expect(minLeaseLeftMs).toBeGreaterThan(0);
      expect(minLeaseLeftMs).toBeLessThanOrEqual(leaseMs);
      expect(maxHeartbeatAgeMs).toBeLessThan(leaseMs);
      await worker.events.waitFor('result_committed', (e) => e.jobId === job.id);
      expect(worker.metrics().gauges[kind]).toBeUndefined(); // nothing running any more
      expect(await store.get(job.id)).toMatchObject({ state: 'succeeded', attempt: 1, fencingToken: 1, result: { done: true } });
      expect(events.filter((e) => e.type === 'heartbeat_ok').length).toBeGreaterThanOrEqual(10);
      // A beat may fail on a loaded machine; what matters is that none was lost.
      expect(events.filter((e) => e.type === 'heartbeat_lost')).toEqual([]);
    });

    test('a short event-loop block (longer than the lease, shorter than the allowed stall) keeps the lease', async () => {
      // Each try is a new job. A try whose lease ran out counts as the
      // machine's only with evidence from the store's side: a beat that
      // failed, or one that took a third of the lease to answer (an fsync
      // held up by a shared disk). Without it the test fails at once: a
      // heartbeat thread that stops beating while the loop is blocked (the
      // bug this test is for) loses the lease with every beat answered fast.
      const tries: unknown[] = [];
      for (let attempt = 1; attempt <= 3; attempt++) {
        const kind = unique('block');
        const { job } = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {} });
        const { worker, events } = await start({
          ...STALL_PROOF,
          kinds: { [kind]: { maxStallMs: 4 * STALL_PROOF.leaseMs } },
          handlers: {
            [kind]: () => {
              // Two lease lengths with this thread frozen: only the heartbeat
              // thread can have kept the lease, or the commit below is refused.
              blockEventLoop(2 * STALL_PROOF.leaseMs);
              return 'survived';
            },
          },
        });
        // The first try's end: committed, or refused because the lease was lost.
        const settled = new AbortController();
        const first = (e: { jobId: number; fencingToken: number }) => e.jobId === job.id && e.fencingToken === 1;
        await Promise.race([
          worker.events.waitFor('result_committed', first, settled.signal),
          worker.events.waitFor('result_rejected', first, settled.signal),
        ]).finally(() => settled.abort());
        const row = await store.get(job.id);
        if (row?.state === 'succeeded' && row.fencingToken === 1 && row.result === 'survived') return;
        const mine = events.filter((e) => 'jobId' in e && e.jobId === job.id && 'fencingToken' in e && e.fencingToken === 1);
        const latencies = mine.flatMap((e) => (e.type === 'heartbeat_ok' ? [Math.round(e.latencyMs)] : []));
        const fellBehind = mine.some((e) => e.type === 'heartbeat_failed') || latencies.some((ms) => ms > STALL_PROOF.leaseMs / 3);
        const lost = mine.find((e) => e.type === 'heartbeat_lost');
        const seen = {
          attempt,
          row: { state: row?.state, fencingToken: row?.fencingToken },
          lost: lost?.type === 'heartbeat_lost' ? lost.cause : null,
          latencies,
          events: mine.map((e) => e.type),
        };
        expect(fellBehind, JSON.stringify(seen)).toBe(true);
        tries.push(seen);
        await worker.stop({ release: true });
      }
      expect.fail(`the lease was lost in every try: ${JSON.stringify(tries)}`);
    }, 90_000);

    test('a handler stalled past the allowed stall loses its lease, its completion is refused, the next owner gets token+1', async () => {
      const kind = unique('stall');
      const { job } = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {} });
      const { worker, events } = await start({
        ...STALL_PROOF,
        kinds: { [kind]: { maxStallMs: 200 } },
        handlers: {
          [kind]: ({ job: j }) => {
            // Past the allowed stall (200 ms) plus a whole lease: heartbeats
            // stopped, and the lease ran out in the database.
            if (j.attempt === 1) blockEventLoop(200 + 3 * STALL_PROOF.leaseMs);
            return `attempt ${j.attempt}`;
          },
        },
      });
      const rejected = await worker.events.waitFor('result_rejected', (e) => e.jobId === job.id);
      expect(rejected).toMatchObject({ reason: 'lease_lost', fencingToken: 1 });
      expect(events.some((e) => e.type === 'heartbeat_lost' && e.cause === 'stalled' && e.fencingToken === 1)).toBe(true);

      // The job is claimable again (here by the same worker, a new attempt) with token+1.
      const next = await worker.events.waitFor('job_claimed', (e) => e.jobId === job.id && e.fencingToken === 2);
      expect(next).toMatchObject({ attempt: 2, previousOwnerId: worker.workerId });
      await worker.events.waitFor('result_committed', (e) => e.jobId === job.id);
      expect(await store.get(job.id)).toMatchObject({ state: 'succeeded', fencingToken: 2, result: 'attempt 2' });
    });

    test('a handler past its kind’s maximum run time is aborted with stage_timeout although its heartbeats succeed', async () => {
      const kind = unique('modal');
      const { job } = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {}, maxAttempts: 1 });
      let abortReason: unknown;
      const { worker, events } = await start({
        ...BEATING,
        kinds: { [kind]: { maxRunMs: 3_000 } },
        handlers: {
          // A browser waiting forever on a modal: alive, heartbeating, stuck.
          [kind]: ({ signal }) =>
            new Promise((_, reject) =>
              signal.addEventListener('abort', () => {
                abortReason = signal.reason;
                reject(signal.reason);
              }),
            ),
        },
      });
      const failed = await worker.events.waitFor('job_failed', (e) => e.jobId === job.id);
      expect(failed).toMatchObject({ errorCode: 'stage_timeout', terminal: true, reason: 'max_attempts' });
      expect(abortReason).toBeInstanceOf(LeaseError);
      expect((abortReason as LeaseError).code).toBe('stage_timeout');
      const before = events.slice(0, events.indexOf(failed));
      expect(before.filter((e) => e.type === 'heartbeat_ok').length).toBeGreaterThanOrEqual(3);
      // A beat may fail on a loaded machine (PostgreSQL's statement timeout); none was lost, and ownership never in doubt.
      expect(before.filter((e) => e.type === 'heartbeat_lost' || e.type === 'ownership_unknown')).toEqual([]);
      expect(await store.get(job.id)).toMatchObject({ state: 'failed', reason: 'max_attempts', error: { code: 'stage_timeout', attempt: 1 } });
    });

    test('zero rows on a heartbeat (the job was cancelled) aborts the handler and nothing is committed', async () => {
      const kind = unique('cancel');
      const { job } = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {} });
      let reason: unknown;
      const { worker } = await start({
        handlers: {
          [kind]: ({ signal }) =>
            new Promise((resolve) =>
              signal.addEventListener('abort', () => {
                reason = signal.reason;
                resolve('finished anyway'); // even a value returned now must not be stored
              }),
            ),
        },
      });
      await worker.events.waitFor('job_claimed', (e) => e.jobId === job.id);
      expect(await store.cancel(job.id)).toEqual({ ok: true });
      const lost = await worker.events.waitFor('heartbeat_lost', (e) => e.jobId === job.id);
      expect(lost.cause).toBe('zero_rows');
      expect(await worker.events.waitFor('result_rejected', (e) => e.jobId === job.id)).toMatchObject({ reason: 'lease_lost' });
      expect(reason).toBeInstanceOf(LeaseLostError);
      expect(await store.get(job.id)).toMatchObject({ state: 'cancelled', result: null });
    });

    test('database unreachable → ownership unknown: no new request starts; at the conservative deadline the lease is given up', async () => {
      const kind = unique('unreachable');
      const { job } = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: { amount: 5 } });
      const unknown = gate();
      const lockReleased = gate();
      let refusal: unknown;
      let abortReason: unknown;
      const { worker, events } = await start({
        // A long lease and a short extend timeout: three missed beats (ownership
        // unknown) come well before the lease end (lost), whatever the load.
        leaseMs: 2_000,
        heartbeatMs: 100,
        heartbeatTimeoutMs: 150,
        handlers: {
          [kind]: async ({ fencedFetch, signal }) => {
            await unknown.opened;
            try {
              await fencedFetch(`${gateway.url}/payments/charges`, { step: 'charge', method: 'POST', body: '{}' });
            } catch (err) {
              refusal = err;
            }
            await new Promise((resolve) => signal.addEventListener('abort', resolve));
            abortReason = signal.reason;
            await lockReleased.opened;
            throw signal.reason;
          },
        },
      });
      await worker.events.waitFor('heartbeat_ok', (e) => e.jobId === job.id);
      // Listening before the lock is asked for: a lock granted late (behind a
      // commit held up by the disk) may come after the beats have already failed.
      const unknownSeen = worker.events.waitFor('ownership_unknown', (e) => e.jobId === job.id);
      const unlock = await db.lockWrites();
      try {
        const unknownEvent = await unknownSeen;
        expect(unknownEvent.consecutiveFailures).toBeGreaterThanOrEqual(TIMING.maxMissedHeartbeats);
        expect(unknownEvent.inFlight).toEqual([]); // the handler had not sent anything yet
        unknown.open();
        const lost = await worker.events.waitFor('heartbeat_lost', (e) => e.jobId === job.id);
        expect(lost.cause).toBe('unconfirmed');
      } finally {
        await unlock();
        lockReleased.open();
      }
      expect(await worker.events.waitFor('result_rejected', (e) => e.jobId === job.id)).toMatchObject({ reason: 'lease_lost' });
      expect(refusal).toBeInstanceOf(OwnershipUnknownError);
      expect(abortReason).toBeInstanceOf(LeaseLostError);
      expect(events.filter((e) => e.type === 'heartbeat_failed').length).toBeGreaterThanOrEqual(TIMING.maxMissedHeartbeats);
      expect(gateway.requests.filter((r) => r.headers['x-fence-entity'] === job.jobKey)).toEqual([]);
      expect(events.some((e) => e.type === 'tool_request_started')).toBe(false);
    });

    test('ownership_unknown names the last confirmed lease end and the request in flight (its idempotency key and request id)', async () => {
      const kind = unique('unknown-fields');
      const { job } = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {} });
      const path = `/payments/${kind}`;
      gateway.answerLate(path, 5_000); // on the wire while the database goes away
      const { worker, events } = await start({
        leaseMs: 2_000,
        heartbeatMs: 100,
        heartbeatTimeoutMs: 150,
        handlers: {
          [kind]: async ({ fencedFetch }) => (await fencedFetch(`${gateway.url}${path}`, { step: 'charge', method: 'POST', body: '{}' })).status,
        },
      });
      const started = await worker.events.waitFor('tool_request_started', (e) => e.jobId === job.id);
      await worker.events.waitFor('heartbeat_ok', (e) => e.jobId === job.id);
      const unknownSeen = worker.events.waitFor('ownership_unknown', (e) => e.jobId === job.id); // before the lock, as above
      const unlock = await db.lockWrites();
      try {
        const unknown = await unknownSeen;
        const sent = gateway.requests.find((r) => r.path === path)!;
        expect(unknown.inFlight).toEqual([
          { step: 'charge', idempotencyKey: `${job.jobKey}:charge`, requestId: started.requestId, startedAt: expect.any(Date) },
        ]);
        expect(sent.headers).toMatchObject({ 'idempotency-key': `${job.jobKey}:charge`, 'x-request-id': started.requestId });
        // The lease end of the last extend that succeeded, as the database gave it.
        const lastOk = events.filter((e) => e.type === 'heartbeat_ok' && e.jobId === job.id).at(-1) as { leaseUntil: Date };
        expect(unknown.lastConfirmedLeaseUntil).toEqual(lastOk.leaseUntil);
        // Never later than the row (what safety needs); the row may be later:
        // an extend whose commit outlasted its timeout counts as failed here
        // but committed (PostgreSQL does not cancel a COMMIT waiting on fsync).
        expect((await store.get(job.id))!.leaseUntil!.getTime()).toBeGreaterThanOrEqual(unknown.lastConfirmedLeaseUntil.getTime());
      } finally {
        await unlock();
      }
    });

    /**
     * The suite's store behind a wrapper that counts the calls the runner
     * makes; `combined: false` hides completeAndClaim (a store without it).
     * `hold` delays the answer of each completeAndClaim (after the database
     * answered) until it resolves; `sent` is called when the answer is held.
     * For the negative controls: `hide` keeps the lease a completeAndClaim
     * claimed from the runner (so it never starts), `noRelease` makes
     * release() answer ok without giving the job back.
     */
    function counting(options: { combined?: boolean; hold?: Promise<void>; sent?: () => void; hide?: boolean; noRelease?: boolean } = {}) {
      const calls = { claim: 0, complete: 0, completeAndClaim: 0 };
      const claimedTogether: number[] = [];
      const wrapped: JobStore = {
        ...store,
        claim: (o) => (calls.claim++, store.claim(o)),
        complete: (l, r) => (calls.complete++, store.complete(l, r)),
        completeAndClaim: async (l, r, c) => {
          calls.completeAndClaim++;
          const both = await store.completeAndClaim!(l, r, c);
          if (both.claim.lease) claimedTogether.push(both.claim.lease.id);
          options.sent?.();
          await options.hold;
          return options.hide ? { ...both, claim: { ...both.claim, lease: null } } : both;
        },
        release: async (l) => (options.noRelease ? { ok: true } : store.release(l)),
      };
      if (options.combined === false) delete wrapped.completeAndClaim;
      return { store: wrapped, calls, claimedTogether };
    }

    test('a slot whose job succeeded claims its next job in the same store call; a store without completeAndClaim gets complete and claim', async () => {
      const run = async (combined: boolean) => {
        const kind = unique('chain');
        const jobs = [];
        for (let i = 0; i < 5; i++) jobs.push((await store.enqueue({ kind, idempotencyKey: unique('k'), payload: { i } })).job);
        const c = counting({ combined });
        const { worker } = await start({ store: c.store, concurrency: 1, handlers: { [kind]: ({ job }) => job.payload } });
        for (const job of jobs) await worker.events.waitFor('result_committed', (e) => e.jobId === job.id);
        await worker.stop();
        for (const job of jobs) expect(await store.get(job.id)).toMatchObject({ state: 'succeeded', attempt: 1, fencingToken: 1 });
        return c;
      };
      // One slot: the lane claims the first job; each commit claims the next (the last one's finds none).
      const together = await run(true);
      expect(together.calls).toMatchObject({ complete: 0, completeAndClaim: 5 });
      expect(together.claimedTogether).toHaveLength(4);
      // Negative control: without the combined operation, every job costs a complete and a claim.
      const apart = await run(false);
      expect(apart.calls).toMatchObject({ complete: 5, completeAndClaim: 0 });
      expect(apart.calls.claim).toBeGreaterThanOrEqual(5);
    });

    test('a job claimed with the previous one’s complete is watched by the heartbeat thread like any other', async () => {
      const run = async (hide: boolean) => {
        const kind = unique('chain-beat');
        const first = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: { slow: false } });
        const second = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: { slow: true } });
        const finish = gate();
        const c = counting({ hide });
        const { worker, events } = await start({
          ...BEATING,
          store: c.store,
          concurrency: 1,
          handlers: { [kind]: async ({ job }) => ((job.payload as { slow: boolean }).slow ? (await finish.opened, 'slow') : 'quick') },
        });
        await worker.events.waitFor('result_committed', (e) => e.jobId === first.job.id);
        expect(c.claimedTogether).toEqual([second.job.id]);
        if (hide) {
          // The slot is free: the lane claims a witness, claimed after the
          // second job. Once the witness has had two heartbeats, the thread
          // has beaten for every lease it was given since.
          const witness = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: { slow: true } });
          for (let i = 0; i < 2; i++) await worker.events.waitFor('heartbeat_ok', (e) => e.jobId === witness.job.id);
          finish.open();
          await worker.events.waitFor('result_committed', (e) => e.jobId === witness.job.id);
        } else {
          await worker.events.waitFor('heartbeat_ok', (e) => e.jobId === second.job.id);
          finish.open();
          await worker.events.waitFor('result_committed', (e) => e.jobId === second.job.id);
          expect(await store.get(second.job.id)).toMatchObject({ state: 'succeeded', attempt: 1, result: 'slow' });
        }
        expect(events.filter((e) => e.type === 'heartbeat_lost')).toEqual([]);
        expect(await store.get(first.job.id)).toMatchObject({ state: 'succeeded', result: 'quick' });
        // Token 1: the lease claimed with the first job's complete (not a
        // later claim of the job, once a hidden lease ran out).
        return events.filter((e) => e.type === 'heartbeat_ok' && e.jobId === second.job.id && e.fencingToken === 1).length;
      };
      expect(await run(false)).toBeGreaterThan(0);
      // Negative control: the same claim kept from the runner (never started)
      // has no heartbeat, however many a job claimed after it had.
      expect(await run(true)).toBe(0);
    });

    test('stop() while a complete-and-claim is out: the job it claimed goes back before stop resolves, and never starts', async () => {
      const run = async (noRelease: boolean) => {
        const kind = unique('chain-stop');
        const first = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {} });
        const second = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {} });
        const hold = gate();
        const sent = gate();
        const c = counting({ hold: hold.opened, sent: sent.open, noRelease });
        const { worker, events } = await start({ store: c.store, concurrency: 1, handlers: { [kind]: () => 'ok' } });
        await sent.opened;
        // The database answered: the first job succeeded, the second is claimed by this worker.
        expect(c.claimedTogether).toEqual([second.job.id]);
        const stopped = worker.stop();
        hold.open();
        await stopped;
        expect(await store.get(first.job.id)).toMatchObject({ state: 'succeeded' });
        expect(events.some((e) => e.type === 'job_claimed' && e.jobId === second.job.id)).toBe(false);
        expect(events.some((e) => e.type === 'result_committed' && e.jobId === first.job.id)).toBe(true);
        return store.get(second.job.id);
      };
      expect(await run(false)).toMatchObject({ state: 'queued', ownerId: null, attempt: 1 });
      // Negative control: a release that gives nothing back leaves it running, as the check would see.
      expect(await run(true)).toMatchObject({ state: 'running', attempt: 1 });
    });

    test('a stopping worker completes alone: a slot that finishes after stop() claims nothing', async () => {
      const kind = unique('chain-stopping');
      const first = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {} });
      const second = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {} });
      const finish = gate();
      const c = counting();
      const { worker } = await start({
        store: c.store,
        concurrency: 1,
        handlers: { [kind]: async () => (await finish.opened, 'ok') },
      });
      await worker.events.waitFor('job_claimed', (e) => e.jobId === first.job.id);
      const stopped = worker.stop();
      finish.open();
      await stopped;
      expect(c.calls).toMatchObject({ complete: 1, completeAndClaim: 0 });
      expect(await store.get(first.job.id)).toMatchObject({ state: 'succeeded' });
      expect(await store.get(second.job.id)).toMatchObject({ state: 'queued', attempt: 0 });
    });

    test('a retryable failure is retried after the backoff with token+1; the result of the retry is committed', async () => {
      const kind = unique('retry');
      const { job } = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {} });
      const { worker, events } = await start({
        retry: { baseMs: 50, maxMs: 50 },
        handlers: {
          [kind]: ({ job: j }) => {
            if (j.attempt === 1) throw new Error('upstream said 503');
            return { attempt: j.attempt, token: j.fencingToken };
          },
        },
      });
      await worker.events.waitFor('result_committed', (e) => e.jobId === job.id);
      const failed = events.find((e) => e.type === 'job_failed');
      expect(failed).toMatchObject({ terminal: false, errorCode: 'handler_error', fencingToken: 1 });
      expect(await store.get(job.id)).toMatchObject({
        state: 'succeeded',
        attempt: 2,
        fencingToken: 2,
        result: { attempt: 2, token: 2 },
        error: { code: 'handler_error', attempt: 1 },
      });
    });

    runnerOnly('validation errors are never retried: a schema mismatch or a JobError(retryable: false) ends the job', async () => {
      const kind = unique('strict');
      const bad = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: { amount: 'twelve' } });
      const refused = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: { amount: -5 } });
      let calls = 0;
      const { worker } = await start({
        handlers: {
          [kind]: {
            schema: z.object({ amount: z.number() }),
            run: ({ job }) => {
              calls++;
              if (job.payload.amount < 0) throw new JobError('negative_amount', 'amount must be positive', { retryable: false });
              return 'ok';
            },
          },
        },
      });
      const a = await worker.events.waitFor('job_failed', (e) => e.jobId === bad.job.id);
      const b = await worker.events.waitFor('job_failed', (e) => e.jobId === refused.job.id);
      expect(a).toMatchObject({ terminal: true, reason: 'invalid_payload' });
      expect(b).toMatchObject({ terminal: true, reason: 'negative_amount' });
      expect(calls).toBe(1);
      expect(await store.get(bad.job.id)).toMatchObject({ state: 'failed', attempt: 1 });
    });

    runnerOnly('fencedFetch sends the fence, the entity and a stable idempotency key; events carry hashes, never the payload', async () => {
      const kind = unique('pay');
      const payload = { card: '4111-1111-1111-1111', amount: 1200 };
      const { job } = await store.enqueue({ kind, idempotencyKey: unique('k'), payload });
      const { worker, events } = await start({
        handlers: {
          [kind]: async ({ job: j, fencedFetch }) => {
            const res = await fencedFetch(`${gateway.url}/payments/charges?trace=1`, {
              step: 'charge',
              method: 'POST',
              headers: { 'content-type': 'application/json' },
              body: JSON.stringify({ amount: (j.payload as typeof payload).amount }),
            });
            return res.json();
          },
        },
      });
      await worker.events.waitFor('result_committed', (e) => e.jobId === job.id);
      const sent = gateway.requests.find((r) => r.headers['x-fence-entity'] === job.jobKey)!;
      expect(sent.headers).toMatchObject({
        'x-execution-fence': '1',
        'idempotency-key': `${job.jobKey}:charge`,
      });
      const started = events.find((e) => e.type === 'tool_request_started');
      expect(started).toMatchObject({ step: 'charge', method: 'POST', url: `${gateway.url}/payments/charges` });
      expect(sent.headers['x-request-id']).toBe((started as { requestId: string }).requestId);

      const claimed = events.find((e) => e.type === 'job_claimed')!;
      const sha = createHash('sha256').update(JSON.stringify(payload)).digest('hex');
      expect(claimed).toMatchObject({ payloadSha256: sha });
      expect(JSON.stringify(events)).not.toContain('4111');
      expect(worker.metrics().counters[kind]).toMatchObject({ claimed: 1, toolRequests: 1, committed: 1 });
    });

    runnerOnly('the gateway’s stale-fence answer is lease loss: a late request is refused, the old owner commits nothing, the upstream paid once', async () => {
      const kind = unique('story');
      const { job } = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: { amount: 1200 } });
      // W1's request leaves while its lease is fine, then hangs on the wire
      // (a slow proxy, a retransmit): nothing can recall it, so it ignores
      // the abort, and lands after W2 has paid.
      const onTheWire = gate();
      const land = gate();
      const slowWire: typeof fetch = async (input, init) => {
        onTheWire.open();
        await land.opened;
        return fetch(input, { ...init, signal: null });
      };
      let w1Error: unknown;
      const w1 = await start({
        workerId: 'W1',
        fetch: slowWire,
        handlers: {
          [kind]: async ({ fencedFetch }) => {
            try {
              return await fencedFetch(`${gateway.url}/payments/charges`, { step: 'charge', method: 'POST', body: '{"amount":1200}' });
            } catch (err) {
              w1Error = err;
              throw err;
            }
          },
        },
      });
      await onTheWire.opened;

      // W1's lease runs out; W2 claims with fence 2 and pays.
      await db.expireLease(job.id);
      const w2 = await start({
        workerId: 'W2',
        handlers: {
          [kind]: async ({ fencedFetch }) =>
            (await fencedFetch(`${gateway.url}/payments/charges`, { step: 'charge', method: 'POST', body: '{"amount":1200}' })).json(),
        },
      });
      await w2.worker.events.waitFor('result_committed', (e) => e.jobId === job.id);

      // W1's request lands: the gateway refuses fence 1, never forwards it.
      land.open();
      await w1.worker.events.waitFor('result_rejected', (e) => e.jobId === job.id && e.fencingToken === 1);
      expect(w1Error).toBeInstanceOf(LeaseLostError);
      const forEntity = (r: { headers: Record<string, unknown> }) => r.headers['x-fence-entity'] === job.jobKey;
      expect(gateway.requests.filter(forEntity).map((r) => r.headers['x-execution-fence'])).toEqual(['2', '1']);
      expect(gateway.upstream.filter((u) => u.entity === job.jobKey)).toEqual([expect.objectContaining({ fence: 2, key: `${job.jobKey}:charge` })]);
      expect(w1.events.some((e) => e.type === 'result_committed')).toBe(false);
      expect(await store.get(job.id)).toMatchObject({ state: 'succeeded', fencingToken: 2, result: { payment: expect.any(String), fence: 2 } });
    });

    test('a tool timeout is outcome unknown: the retry reuses the idempotency key and gets the first answer back', async () => {
      const kind = unique('timeout');
      const { job } = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {} });
      const path = `/payments/${kind}`;
      gateway.answerLate(path, 1_500); // the payment happens, the answer comes after the client gave up
      const { worker, events } = await start({
        retry: { baseMs: 50, maxMs: 50 },
        handlers: {
          [kind]: async ({ fencedFetch }) => {
            const res = await fencedFetch(`${gateway.url}${path}`, { step: 'charge', method: 'POST', body: '{}', timeoutMs: 200 });
            return { replayed: res.headers.get('idempotent-replayed'), ...((await res.json()) as object) };
          },
        },
      });
      await worker.events.waitFor('result_committed', (e) => e.jobId === job.id);
      expect(events.find((e) => e.type === 'job_failed')).toMatchObject({ errorCode: 'outcome_unknown', terminal: false, fencingToken: 1 });
      const sent = gateway.requests.filter((r) => r.path === path);
      expect(sent.map((r) => [r.headers['idempotency-key'], r.headers['x-execution-fence']])).toEqual([
        [`${job.jobKey}:charge`, '1'],
        [`${job.jobKey}:charge`, '2'],
      ]);
      expect(gateway.upstream.filter((u) => u.path === path)).toHaveLength(1); // paid once
      expect(await store.get(job.id)).toMatchObject({ state: 'succeeded', attempt: 2, result: { replayed: 'true', fence: 1 } });
    });

    runnerOnly('a heartbeat thread that cannot open its store fails the start with a clear error', async () => {
      await expect(start({ handlers: { never: () => 'x' }, threadStore: { sqlite: '/nonexistent-dir/for/sure/jobs.db' } })).rejects.toMatchObject({
        code: 'heartbeat_thread',
      });
    });

    runnerOnly('stop() waits for running jobs and is idempotent; stop({ release: true }) gives jobs back at once', async () => {
      const kind = unique('stop');
      const first = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {} });
      const finish = gate();
      const a = await start({ handlers: { [kind]: async () => (await finish.opened, 'finished') } });
      await a.worker.events.waitFor('job_claimed', (e) => e.jobId === first.job.id);
      const stopping = a.worker.stop();
      expect(a.worker.stop()).toBe(stopping);
      let stopped = false;
      void stopping.then(() => (stopped = true));
      await sleep(3 * TIMING.heartbeatMs); // heartbeats go on while it waits
      expect(stopped).toBe(false);
      finish.open();
      await stopping;
      expect(await a.worker.closed).toBeUndefined();
      expect(await store.get(first.job.id)).toMatchObject({ state: 'succeeded', result: 'finished' });

      const second = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {} });
      let reason: unknown;
      const b = await start({
        handlers: { [kind]: ({ signal }) => new Promise((_, reject) => signal.addEventListener('abort', () => reject((reason = signal.reason)))) },
      });
      await b.worker.events.waitFor('job_claimed', (e) => e.jobId === second.job.id);
      await b.worker.stop({ release: true });
      expect((reason as LeaseError).code).toBe('worker_stopping');
      expect(await store.get(second.job.id)).toMatchObject({ state: 'queued', attempt: 1, ownerId: null });
      expect((await store.claim({ workerId: 'next', kinds: [kind] })).lease).toMatchObject({ id: second.job.id, fencingToken: 2 });
    });

    test('a worker process killed with SIGKILL has its job re-claimed with token+1 after the lease', async () => {
      const kind = unique('killed');
      const { job } = await store.enqueue({ kind, idempotencyKey: unique('k'), payload: {} });
      const child = spawnChild('worker-child.ts', [JSON.stringify(db.descriptor), 'doomed', kind]);
      const started = await child.next<{ id: number; token: number }>((m) => m.type === 'started');
      expect(started).toMatchObject({ id: job.id, token: 1 });
      await child.next((m) => m.type === 'heartbeat_ok'); // its heartbeats were keeping the lease
      expect(await child.kill('SIGKILL')).toBe('SIGKILL');

      // Nobody can take it while the lease the dead worker last extended lives …
      expect((await store.claim({ workerId: 'rescuer', kinds: [kind] })).lease).toBeNull();
      // … and right after it runs out (database time), the next claim gets it with token+1.
      const lease = await eventually(async () => (await store.claim({ workerId: 'rescuer', kinds: [kind] })).lease, 20_000);
      expect(lease).toMatchObject({ id: job.id, fencingToken: 2, attempt: 2, previousOwnerId: 'doomed' });
    });
  });
}
