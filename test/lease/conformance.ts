/**
 * The JobStore conformance suite: every backend must pass it unchanged.
 * Expiry is reached by moving rows into the past (`backdate`, `expireLease`),
 * never by faking the database clock.
 */
import { afterAll, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import type { ClaimOptions, Job, JobStore, Lease } from '../../src/lease/types.js';
import type { TestDatabase, TestDatabaseFactory } from './helpers/stores.js';

function must<T>(value: T | null | undefined): T {
  expect(value).toBeTruthy();
  return value as T;
}

/**
 * The lease a statement wrote, counted from the heartbeat_at it wrote.
 * SQLite reads its clock once per statement: exactly the lease length.
 * PostgreSQL records heartbeat_at as the statement's start (now()) and counts
 * the lease from the write (clock_timestamp()): the length, or a little more.
 */
function expectLeaseLength(dialect: string, row: Job, ms: number): void {
  const length = row.leaseUntil!.getTime() - row.heartbeatAt!.getTime();
  if (dialect === 'sqlite') expect(length).toBe(ms);
  else expect(length).toBeGreaterThanOrEqual(ms);
}

export function jobStoreConformance(name: string, factory: TestDatabaseFactory): void {
  describe(`JobStore conformance: ${name}`, () => {
    let db: TestDatabase;
    let store: JobStore;
    let key = 0;
    const nextKey = () => `job-${++key}`;

    beforeAll(async () => {
      db = await factory();
      store = await db.open({ leaseMs: 60_000, kinds: { short: { leaseMs: 2_000 } } });
    });
    afterAll(async () => {
      await db?.dispose();
    });
    // Each test starts from an empty table, so "nothing to claim" means it.
    beforeEach(async () => {
      await db.sql('DELETE FROM tool_jobs');
    });

    const claimOne = async (workerId: string, options: { kinds?: string[] } = {}): Promise<Lease> => must((await store.claim({ workerId, ...options })).lease);

    test('enqueue stores a queued job with defaults, a payload hash and the default fence key', async () => {
      const { created, job } = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: { amount: 1200 } });
      expect(created).toBe(true);
      expect(job).toMatchObject({
        kind: 'payment',
        state: 'queued',
        attempt: 0,
        maxAttempts: 3,
        fencingToken: 0,
        ownerId: null,
        payload: { amount: 1200 },
        jobKey: `tool-job:${store.storeId}:${job.id}`,
        fenceKey: `tool-job:${store.storeId}:${job.id}`,
        deadlineAt: null,
      });
      expect(job.payloadSha256).toMatch(/^[0-9a-f]{64}$/);
    });

    test('a second enqueue with the same key returns the existing job, never a second one', async () => {
      const k = nextKey();
      const first = await store.enqueue({ kind: 'payment', idempotencyKey: k, payload: { amount: 1 } });
      const again = await store.enqueue({ kind: 'payment', idempotencyKey: k, payload: { amount: 1 } });
      const other = await store.enqueue({ kind: 'payment', idempotencyKey: k, payload: { amount: 2 } });
      expect(again).toMatchObject({ created: false, samePayload: true, job: { id: first.job.id } });
      expect(other).toMatchObject({ created: false, samePayload: false, job: { id: first.job.id, payload: { amount: 1 } } });
      const rows = await db.sql('SELECT count(*) AS n FROM tool_jobs');
      expect(Number(rows[0]!.n)).toBe(1);
    });

    test('concurrent enqueues with one key create exactly one job', async () => {
      const k = nextKey();
      const results = await Promise.all(Array.from({ length: 10 }, () => store.enqueue({ kind: 'payment', idempotencyKey: k, payload: {} })));
      expect(results.filter((r) => r.created)).toHaveLength(1);
      expect(new Set(results.map((r) => r.job.id)).size).toBe(1);
    });

    test('claim returns nothing when nothing is ready', async () => {
      expect(await store.claim({ workerId: 'w1' })).toEqual({ lease: null, failed: [] });
    });

    test('claim hands out token 1, attempt 1, and a lease of the kind’s length on the database clock', async () => {
      const { job } = await store.enqueue({ kind: 'short', idempotencyKey: nextKey(), payload: { n: 1 } });
      const lease = await claimOne('w1');
      expect(lease).toMatchObject({
        id: job.id,
        kind: 'short',
        ownerId: 'w1',
        fencingToken: 1,
        attempt: 1,
        leaseMs: 2_000,
        payload: { n: 1 },
        jobKey: `tool-job:${store.storeId}:${job.id}`,
        fenceKey: `tool-job:${store.storeId}:${job.id}`,
        previousOwnerId: null,
      });
      const row = must(await store.get(job.id));
      expect(row.state).toBe('running');
      // The kind's 2 s, on the database clock (the store's default is 60 s).
      expectLeaseLength(db.dialect, row, 2_000);
      expect(row.leaseUntil!.getTime() - row.heartbeatAt!.getTime()).toBeLessThan(60_000);
      expect(row.firstClaimedAt).not.toBeNull();
    });

    test('a live lease is never handed out twice', async () => {
      await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      await claimOne('w1');
      expect((await store.claim({ workerId: 'w2' })).lease).toBeNull();
    });

    test('claim takes only the kinds asked for, and the claim’s own lease length wins', async () => {
      await store.enqueue({ kind: 'email', idempotencyKey: nextKey(), payload: {} });
      expect((await store.claim({ workerId: 'w1', kinds: ['payment'] })).lease).toBeNull();
      const lease = must((await store.claim({ workerId: 'w1', kinds: ['payment', 'email'], leaseMs: 5_000 })).lease);
      expect(lease).toMatchObject({ kind: 'email', leaseMs: 5_000 });
      const row = must(await store.get(lease.id));
      expectLeaseLength(db.dialect, row, 5_000);
      expect(row.leaseUntil!.getTime() - row.heartbeatAt!.getTime()).toBeLessThan(60_000);
    });

    test('claim → extend OK: the lease moves forward from the database’s now', async () => {
      await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const lease = await claimOne('w1');
      await db.backdate('lease_until', 30_000, lease.id); // half the lease used up
      const before = must(await store.get(lease.id)).leaseUntil!;
      const res = await store.extend(lease);
      expect(res.ok).toBe(true);
      if (!res.ok) return;
      expect(res.leaseUntil.getTime()).toBeGreaterThan(before.getTime());
      const row = must(await store.get(lease.id));
      expectLeaseLength(db.dialect, row, 60_000);
    });

    test('lease expires → another worker claims with token+1 → the first one’s extend and complete fail, its result is not stored', async () => {
      const { job } = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const w1 = await claimOne('w1');
      await db.expireLease(job.id);
      const w2 = await claimOne('w2');
      expect(w2).toMatchObject({ id: job.id, fencingToken: w1.fencingToken + 1, attempt: 2, previousOwnerId: 'w1' });

      expect(await store.extend(w1)).toEqual({ ok: false, reason: 'lease_lost' });
      expect(await store.complete(w1, { paidBy: 'w1' })).toEqual({ ok: false, reason: 'lease_lost' });
      expect(await store.fail(w1, { code: 'x', message: 'late' }, { retryable: true })).toEqual({ ok: false, reason: 'lease_lost' });
      expect(await store.release(w1)).toEqual({ ok: false, reason: 'lease_lost' });
      expect(must(await store.get(job.id))).toMatchObject({ state: 'running', ownerId: 'w2', result: null });

      expect(await store.complete(w2, { paidBy: 'w2' })).toEqual({ ok: true });
      expect(must(await store.get(job.id))).toMatchObject({ state: 'succeeded', result: { paidBy: 'w2' }, fencingToken: 2 });
      // Done is done: even the last owner cannot write again.
      expect(await store.complete(w2, { paidBy: 'again' })).toEqual({ ok: false, reason: 'lease_lost' });
    });

    test('an expired lease fails extend and complete even before anyone else claims', async () => {
      const { job } = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const w1 = await claimOne('w1');
      await db.expireLease(job.id);
      expect(await store.extend(w1)).toEqual({ ok: false, reason: 'lease_lost' });
      expect(await store.complete(w1, 'late')).toEqual({ ok: false, reason: 'lease_lost' });
      expect(must(await store.get(job.id)).result).toBeNull();
    });

    test('a wrong token or owner is refused even on a live lease', async () => {
      await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const lease = await claimOne('w1');
      expect(await store.extend({ ...lease, fencingToken: lease.fencingToken + 1 })).toEqual({ ok: false, reason: 'lease_lost' });
      expect(await store.complete({ ...lease, ownerId: 'w2' }, 'x')).toEqual({ ok: false, reason: 'lease_lost' });
      expect((await store.extend(lease)).ok).toBe(true);
    });

    test('max attempts → the expired job goes to failed with the reason instead of being handed out', async () => {
      const { job } = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {}, maxAttempts: 2 });
      await claimOne('w1');
      await db.expireLease(job.id);
      await claimOne('w2');
      await db.expireLease(job.id);
      const res = await store.claim({ workerId: 'w3' });
      expect(res.lease).toBeNull();
      expect(res.failed).toEqual([{ id: job.id, kind: 'payment', fencingToken: 2, reason: 'max_attempts', previousOwnerId: 'w2' }]);
      expect(must(await store.get(job.id))).toMatchObject({ state: 'failed', reason: 'max_attempts', attempt: 2 });
      expect((await store.claim({ workerId: 'w3' })).lease).toBeNull();
    });

    test('a passed deadline → failed with reason deadline, queued or running', async () => {
      const queued = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {}, deadlineMs: 60_000 });
      await db.backdate('deadline_at', 120_000, queued.job.id);
      const res = await store.claim({ workerId: 'w1' });
      expect(res).toMatchObject({ lease: null, failed: [{ id: queued.job.id, reason: 'deadline' }] });
      expect(must(await store.get(queued.job.id))).toMatchObject({ state: 'failed', reason: 'deadline' });
    });

    test('claim skips dead jobs and hands out the next live one in the same call', async () => {
      const dead = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {}, deadlineMs: 60_000 });
      await db.backdate('deadline_at', 120_000, dead.job.id);
      const live = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const res = await store.claim({ workerId: 'w1' });
      expect(res.lease?.id).toBe(live.job.id);
      expect(res.failed.map((f) => f.id)).toEqual([dead.job.id]);
    });

    /** The store's completeAndClaim (both backends have it). */
    const completeAndClaim = (lease: Lease, result: unknown, claim: ClaimOptions) => must(store.completeAndClaim).call(store, lease, result, claim);

    test('completeAndClaim stores the result and claims the next job by the claim’s rules: its kinds, its lease length, recovery first', async () => {
      const { job: first } = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const lease = await claimOne('w1');
      const email = await store.enqueue({ kind: 'email', idempotencyKey: nextKey(), payload: {} });
      const queued = await store.enqueue({ kind: 'short', idempotencyKey: nextKey(), payload: { n: 2 } });
      const { job: expired } = await store.enqueue({ kind: 'short', idempotencyKey: nextKey(), payload: { n: 3 } });
      await db.backdate('run_after', 60_000, expired.id); // older than `queued`: claimed by w2 first
      const other = await claimOne('w2', { kinds: ['short'] });
      expect(other.id).toBe(expired.id);
      await db.expireLease(expired.id);

      const res = await completeAndClaim(lease, { paid: true }, { workerId: 'w1', kinds: ['payment', 'short'] });
      expect(res.complete).toEqual({ ok: true });
      expect(res.claim.failed).toEqual([]);
      // The expired job before the fresh one, with token+1 and w2 as its previous owner.
      expect(res.claim.lease).toMatchObject({ id: expired.id, ownerId: 'w1', fencingToken: 2, attempt: 2, previousOwnerId: 'w2', leaseMs: 2_000 });
      expect(must(await store.get(first.id))).toMatchObject({ state: 'succeeded', result: { paid: true } });
      expectLeaseLength(db.dialect, must(await store.get(expired.id)), 2_000);
      expect(must(await store.get(email.job.id)).state).toBe('queued');
      expect(must(await store.get(queued.job.id)).state).toBe('queued');
    });

    test('completeAndClaim with nothing to claim completes and claims nothing; dead jobs on the way are failed and reported', async () => {
      await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const a = await claimOne('w1');
      expect(await completeAndClaim(a, 1, { workerId: 'w1' })).toEqual({ complete: { ok: true }, claim: { lease: null, failed: [] } });

      await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const b = await claimOne('w1');
      const dead = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {}, deadlineMs: 60_000 });
      await db.backdate('deadline_at', 120_000, dead.job.id);
      const live = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const res = await completeAndClaim(b, 2, { workerId: 'w1' });
      expect(res.complete).toEqual({ ok: true });
      expect(res.claim.lease?.id).toBe(live.job.id);
      expect(res.claim.failed).toEqual([{ id: dead.job.id, kind: 'payment', fencingToken: 0, reason: 'deadline', previousOwnerId: null }]);
    });

    test('completeAndClaim: the next job of a shared custom fence key gets a token above the one just completed', async () => {
      await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {}, fenceKey: 'invoice:90' });
      const a = await claimOne('w1');
      await db.expireLease(a.id);
      const a2 = await claimOne('w2');
      expect(a2.fencingToken).toBe(2);
      await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {}, fenceKey: 'invoice:90' });
      const res = await completeAndClaim(a2, 'done', { workerId: 'w2' });
      expect(res.claim.lease).toMatchObject({ fenceKey: 'invoice:90', fencingToken: 3 });
    });

    test('completeAndClaim by a stale lease completes nothing and claims nothing, not even its own expired job', async () => {
      // Taken over: another owner holds the job with token 2.
      const { job } = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const w1 = await claimOne('w1');
      await db.expireLease(job.id);
      const w2 = await claimOne('w2');
      const waiting = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      expect(await completeAndClaim(w1, { paidBy: 'w1' }, { workerId: 'w1' })).toEqual({
        complete: { ok: false, reason: 'lease_lost' },
        claim: { lease: null, failed: [] },
      });
      expect(must(await store.get(job.id))).toMatchObject({ state: 'running', ownerId: 'w2', fencingToken: 2, result: null });
      expect(must(await store.get(waiting.job.id))).toMatchObject({ state: 'queued', attempt: 0, ownerId: null });

      // Expired, not yet taken over: the job itself would be claimable, but not by this call.
      const own = await claimOne('w1', {});
      expect(own.id).toBe(waiting.job.id);
      await db.expireLease(own.id);
      const another = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      expect(await completeAndClaim(own, 'late', { workerId: 'w1' })).toEqual({
        complete: { ok: false, reason: 'lease_lost' },
        claim: { lease: null, failed: [] },
      });
      expect(must(await store.get(own.id))).toMatchObject({ state: 'running', ownerId: 'w1', fencingToken: 1, result: null });
      expect(must(await store.get(another.job.id))).toMatchObject({ state: 'queued', attempt: 0 });

      // A wrong token on a live lease: the same.
      await store.complete(w2, 'w2');
      const live = await claimOne('w3');
      expect(await completeAndClaim({ ...live, fencingToken: live.fencingToken + 1 }, 'forged', { workerId: 'w3' })).toEqual({
        complete: { ok: false, reason: 'lease_lost' },
        claim: { lease: null, failed: [] },
      });
      expect(must(await store.get(live.id))).toMatchObject({ state: 'running', result: null });
    });

    test('completeAndClaim with bad claim options throws before anything is completed', async () => {
      await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const lease = await claimOne('w1');
      await expect(completeAndClaim(lease, 'x', { workerId: 'w1', kinds: [] })).rejects.toThrow(/kinds/);
      expect(must(await store.get(lease.id))).toMatchObject({ state: 'running', result: null });
    });

    test('fail(retryable) requeues after the backoff; the retry gets token+1 and attempt+1', async () => {
      const { job } = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const first = await claimOne('w1');
      const res = await store.fail(first, { code: 'upstream_503', message: 'try later' }, { retryable: true, backoffMs: 60_000 });
      expect(res).toMatchObject({ ok: true, state: 'queued' });
      expect(must(await store.get(job.id))).toMatchObject({
        state: 'queued',
        ownerId: null,
        reason: null,
        error: { code: 'upstream_503', message: 'try later', attempt: 1 },
      });
      expect((await store.claim({ workerId: 'w2' })).lease).toBeNull(); // still backing off
      await db.backdate('run_after', 60_000, job.id);
      const retry = await claimOne('w2');
      expect(retry).toMatchObject({ fencingToken: 2, attempt: 2, previousOwnerId: null });
    });

    test('fail(not retryable) ends the job with its error code as the reason', async () => {
      const { job } = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const lease = await claimOne('w1');
      expect(await store.fail(lease, { code: 'invalid_payload', message: 'amount missing' }, { retryable: false })).toEqual({
        ok: true,
        state: 'failed',
        reason: 'invalid_payload',
      });
      expect(must(await store.get(job.id))).toMatchObject({ state: 'failed', reason: 'invalid_payload', ownerId: 'w1' });
    });

    test('fail(retryable) on the last attempt ends the job: max_attempts', async () => {
      const { job } = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {}, maxAttempts: 1 });
      const lease = await claimOne('w1');
      expect(await store.fail(lease, { code: 'stage_timeout', message: 'too slow' }, { retryable: true })).toEqual({
        ok: true,
        state: 'failed',
        reason: 'max_attempts',
      });
      expect(must(await store.get(job.id))).toMatchObject({ reason: 'max_attempts', error: { code: 'stage_timeout', attempt: 1 } });
    });

    test('fail(retryable) whose retry would start after the deadline ends the job: deadline', async () => {
      await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {}, deadlineMs: 60_000 });
      const lease = await claimOne('w1');
      expect(await store.fail(lease, { code: 'x', message: 'm' }, { retryable: true, backoffMs: 120_000 })).toMatchObject({
        state: 'failed',
        reason: 'deadline',
      });
    });

    test('release gives the job back at once; the attempt still counts', async () => {
      const { job } = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const lease = await claimOne('w1');
      expect(await store.release(lease)).toEqual({ ok: true });
      expect(await claimOne('w2')).toMatchObject({ id: job.id, fencingToken: 2, attempt: 2 });
    });

    test('cancel: a queued job is never claimed, a running one’s owner loses it, a finished one is not cancellable', async () => {
      const queued = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      expect(await store.cancel(queued.job.id)).toEqual({ ok: true });
      expect((await store.claim({ workerId: 'w1' })).lease).toBeNull();
      expect(must(await store.get(queued.job.id))).toMatchObject({ state: 'cancelled', reason: 'cancelled' });

      await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      const lease = await claimOne('w1');
      expect(await store.cancel(lease.id)).toEqual({ ok: true });
      expect(await store.extend(lease)).toEqual({ ok: false, reason: 'lease_lost' });
      expect(await store.complete(lease, 'x')).toEqual({ ok: false, reason: 'lease_lost' });
      expect(await store.cancel(lease.id)).toEqual({ ok: false, reason: 'not_cancellable' });
      expect(await store.cancel(987_654)).toEqual({ ok: false, reason: 'not_cancellable' });
    });

    test('counts by state and kind; get of an unknown id is null', async () => {
      await store.enqueue({ kind: 'a', idempotencyKey: nextKey(), payload: {} });
      await store.enqueue({ kind: 'a', idempotencyKey: nextKey(), payload: {} });
      await store.enqueue({ kind: 'b', idempotencyKey: nextKey(), payload: {} });
      await claimOne('w1', { kinds: ['b'] });
      expect(await store.counts()).toEqual([
        { state: 'queued', kind: 'a', count: 2 },
        { state: 'running', kind: 'b', count: 1 },
      ]);
      expect(await store.get(987_654)).toBeNull();
    });

    test('an expired running job is recovered before fresh queued ones', async () => {
      const old = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      await claimOne('w1');
      await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      await db.expireLease(old.job.id);
      expect((await claimOne('w2')).id).toBe(old.job.id);
    });

    test('jobs sharing a custom fence key get tokens that keep rising across jobs', async () => {
      const a = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {}, fenceKey: 'invoice:77' });
      const la = await claimOne('w1');
      expect(la).toMatchObject({ id: a.job.id, fenceKey: 'invoice:77', fencingToken: 1 });
      await db.expireLease(a.job.id);
      const la2 = await claimOne('w2');
      expect(la2.fencingToken).toBe(2);
      expect(await store.complete(la2, 'done')).toEqual({ ok: true });

      await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {}, fenceKey: 'invoice:77' });
      // A new job for the same entity must present a fence above the last one
      // the gateway accepted for it (2), or it would be refused as stale.
      expect((await claimOne('w3')).fencingToken).toBe(3);
    });

    test('the store has an identity of its own, kept across opens; every job key carries it, a custom fence key only replaces the entity', async () => {
      expect(store.storeId).toMatch(/^[0-9a-f]{32}$/);
      const [row] = await db.sql<{ store_id: string }>('SELECT store_id FROM tool_job_store');
      expect(row!.store_id).toBe(store.storeId);
      expect((await db.open()).storeId).toBe(store.storeId);
      const other = await factory();
      try {
        expect((await other.open()).storeId).not.toBe(store.storeId);
      } finally {
        await other.dispose();
      }

      const { job } = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {}, fenceKey: 'invoice:78' });
      expect(job).toMatchObject({ jobKey: `tool-job:${store.storeId}:${job.id}`, fenceKey: 'invoice:78' });
      expect(await claimOne('w1')).toMatchObject({ jobKey: `tool-job:${store.storeId}:${job.id}`, fenceKey: 'invoice:78' });
      // The identity is written into the row at enqueue, not derived at read time.
      const [stored] = await db.sql<{ store_id: string }>(`SELECT store_id FROM tool_jobs WHERE id = ${job.id}`);
      expect(stored!.store_id).toBe(store.storeId);
    });

    test('a job from before migration 0007 (no store_id) keeps the old keys for its whole life', async () => {
      const { job } = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
      await db.sql(`UPDATE tool_jobs SET store_id = NULL WHERE id = ${job.id}`);
      expect(await store.get(job.id)).toMatchObject({ jobKey: `tool-job:${job.id}`, fenceKey: `tool-job:${job.id}` });
      const lease = await claimOne('w1');
      expect(lease).toMatchObject({ id: job.id, jobKey: `tool-job:${job.id}`, fenceKey: `tool-job:${job.id}` });
      await db.expireLease(job.id);
      expect(await claimOne('w2')).toMatchObject({ fencingToken: 2, jobKey: `tool-job:${job.id}`, fenceKey: `tool-job:${job.id}` });
    });

    test('a store cannot be opened on a database without its identity', async () => {
      await db.sql('DELETE FROM tool_job_store');
      try {
        await expect(db.open()).rejects.toMatchObject({ code: 'store_identity' });
      } finally {
        await db.sql(`INSERT INTO tool_job_store (singleton, store_id) VALUES (${db.dialect === 'sqlite' ? 1 : 'true'}, '${store.storeId}')`);
      }
      expect((await db.open()).storeId).toBe(store.storeId);
    });

    test('bad input is a caller fault and throws', async () => {
      await expect(store.enqueue({ kind: '', idempotencyKey: nextKey(), payload: {} })).rejects.toThrow(/kind/);
      await expect(store.enqueue({ kind: 'a', idempotencyKey: nextKey(), payload: {}, maxAttempts: 0 })).rejects.toThrow(/maxAttempts/);
      await expect(store.enqueue({ kind: 'a', idempotencyKey: nextKey(), payload: {}, fenceKey: 'has space' })).rejects.toThrow(/fenceKey/);
      await expect(store.claim({ workerId: 'w1', kinds: [] })).rejects.toThrow(/kinds/);
    });

    // Negative control (CONTRIBUTING.md convention 7): the scenario below catches a complete()
    // without the ownership condition. It runs once with the real statement
    // and once with the condition removed, and the property only holds for
    // the real one.
    test('negative control: complete without the ownership condition lets a stale result overwrite the new one', async () => {
      const staleOverwrites = async (complete: (lease: Lease, result: unknown) => Promise<unknown>) => {
        const { job } = await store.enqueue({ kind: 'payment', idempotencyKey: nextKey(), payload: {} });
        const w1 = await claimOne('w1');
        await db.expireLease(job.id);
        const w2 = await claimOne('w2');
        expect(await store.complete(w2, { paidBy: 'w2' })).toEqual({ ok: true });
        await complete(w1, { paidBy: 'w1 (stale)' });
        return must(await store.get(job.id)).result;
      };

      expect(await staleOverwrites((lease, result) => store.complete(lease, result))).toEqual({ paidBy: 'w2' });

      const unconditional = async (lease: Lease, result: unknown) => {
        const sql =
          db.dialect === 'sqlite'
            ? "UPDATE tool_jobs SET state = 'succeeded', result = ? WHERE id = ?"
            : "UPDATE tool_jobs SET state = 'succeeded', result = $1::jsonb WHERE id = $2";
        await db.sql(sql, [JSON.stringify(result), lease.id]);
      };
      expect(await staleOverwrites(unconditional)).toEqual({ paidBy: 'w1 (stale)' });
    });
  });
}
