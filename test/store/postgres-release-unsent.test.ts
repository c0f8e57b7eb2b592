import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createPostgresStore, type PostgresGatewayStore } from '../../src/store/postgres/index.js';
import type { Admission, AdmitInput } from '../../src/store/types.js';
import { FaultProxy } from '../faults/toolkit/tcp-proxy.js';
import { createTestSchema, holdEntity, POSTGRES_URL, rejectionReasons, until, type TestSchema } from '../helpers/postgres.js';
import { admitInput } from './helpers/inputs.js';

/**
 * An admission whose answer was lost (DESIGN §8.2): the statement committed,
 * then the connection died before its answer reached the gateway, which
 * answers 503 and sends nothing. Whatever it committed under the request's
 * owner token is released, so the key's retry is forwarded, not told
 * `idempotency-in-progress` and later `outcome-unknown`. The connection is
 * cut by the fault suite's TCP proxy (test/faults/toolkit/tcp-proxy.ts) in
 * front of the real server: `resetNext` resets it at the first bytes of the
 * answer (PostgreSQL sends a statement's answer once it committed), `cut`
 * resets every connection and refuses new ones until `restore`.
 */

let schema: TestSchema;
let proxy: FaultProxy;
let store: PostgresGatewayStore;

const fresh = (over: Partial<AdmitInput> = {}) =>
  admitInput({
    key: `k-${randomUUID()}`,
    entity: `e-${randomUUID()}`,
    ownerToken: `o-${randomUUID()}`,
    fence: 7n,
    audit: { requestId: `r-${randomUUID()}`, clientRequestId: null, caller: null, method: 'POST', path: '/x', payloadSha256: '0' },
    ...over,
  });
/** The same request again (the client's retry after its 503): same key and payload, a new owner. */
const retryOf = (c: AdmitInput): AdmitInput => ({ ...c, ownerToken: `o-${randomUUID()}`, audit: { ...c.audit, requestId: `r-${randomUUID()}` } });

async function stateOf(c: AdmitInput) {
  const rec = await schema.pool.query<{ state: string; owner_token: string }>(
    'SELECT state, owner_token FROM idempotency_records WHERE scope = $1 AND key = $2',
    [c.scope, c.key],
  );
  const ent = await schema.pool.query<{ fence: string | null; inflight_owner: string | null }>(
    'SELECT fence, inflight_owner FROM fence_entities WHERE entity = $1',
    [c.entity],
  );
  return {
    record: rec.rows[0]?.state ?? null,
    owner: rec.rows[0]?.owner_token ?? null,
    fence: ent.rows[0]?.fence ?? null,
    slot: ent.rows[0]?.inflight_owner ?? null,
  };
}

const NONE = { released: 0, nothing: 0, gaveUp: 0, notNeeded: 0, overCap: 0, failedAttempts: 0 };

/** The store's admission without the release around it: what a lost answer left before the release existed (the negative control). */
const unreleased = (s: PostgresGatewayStore) => (s as unknown as { admission: (i: AdmitInput) => Promise<Admission> }).admission;

describe.skipIf(!POSTGRES_URL)('PostgreSQL: an admission whose answer was lost is released', () => {
  beforeAll(async () => {
    schema = await createTestSchema('fg_unsent');
    const target = new URL(POSTGRES_URL!);
    proxy = await FaultProxy.start({ target: { host: target.hostname, port: Number(target.port || 5432) }, name: 'postgres' });
    store = await createPostgresStore({ connectionString: proxy.wrapUrl(schema.url), poolSize: 4, listen: false });
  });
  afterAll(async () => {
    await store?.close();
    await proxy?.close();
    await schema?.drop();
  });
  beforeEach(async () => {
    await store.unsent.idle();
    Object.assign(store.unsent.stats, { released: 0, nothing: 0, gaveUp: 0, notNeeded: 0, overCap: 0, failedAttempts: 0 });
    store.unsent.maxPending = 256;
  });

  it('a lone admission that committed: its record and slot are released, the fence stays, the retry is forwarded', async () => {
    const c = fresh();
    proxy.resetNext(1);
    await expect(store.admit(c)).rejects.toThrow();
    await store.unsent.idle();
    expect(store.unsent.stats).toEqual({ ...NONE, released: 1, nothing: 0 });
    expect(await stateOf(c)).toEqual({ record: null, owner: null, fence: '7', slot: null });
    expect(await store.admit(retryOf(c))).toEqual({ outcome: 'forward', takeover: false });
    // A release is no refusal: nothing in the rejection log.
    expect(await rejectionReasons(schema, c.audit.requestId)).toEqual([]);
  });

  it('negative control: without the release, the lost answer leaves the record in_progress and the retry is refused', async () => {
    const c = fresh();
    proxy.resetNext(1);
    await expect(unreleased(store)(c)).rejects.toThrow();
    expect(await stateOf(c)).toEqual({ record: 'in_progress', owner: c.ownerToken, fence: '7', slot: c.ownerToken });
    const retry = await store.admit(retryOf(c));
    expect(retry.outcome).toBe('idempotency-in-progress');
    expect(store.unsent.stats).toEqual({ ...NONE, released: 0, nothing: 0 });
  });

  it('a group that committed: every element is released', async () => {
    const cs = Array.from({ length: 5 }, () => fresh());
    proxy.resetNext(1);
    const results = await Promise.allSettled(cs.map((c) => store.admit(c)));
    expect(results.map((r) => r.status)).toEqual(cs.map(() => 'rejected'));
    await store.unsent.idle();
    expect(store.unsent.stats).toEqual({ ...NONE, released: 5, nothing: 0 });
    for (const c of cs) expect(await stateOf(c)).toEqual({ record: null, owner: null, fence: '7', slot: null });
  });

  it('an admission refused in-progress whose answer was lost holds nothing: the first owner keeps its record and slot', async () => {
    const first = fresh();
    expect(await store.admit(first)).toEqual({ outcome: 'forward', takeover: false });
    const second = retryOf(first);
    proxy.resetNext(1);
    await expect(store.admit(second)).rejects.toThrow();
    await store.unsent.idle();
    expect(store.unsent.stats).toEqual({ ...NONE, released: 0, nothing: 1 });
    expect(await stateOf(first)).toEqual({ record: 'in_progress', owner: first.ownerToken, fence: '7', slot: first.ownerToken });
  });

  it('the database away for a while: the release is tried again until it lands', async () => {
    const c = fresh();
    proxy.resetNext(1);
    const failed = store.admit(c);
    await expect(failed).rejects.toThrow();
    proxy.cut();
    setTimeout(() => proxy.restore(), 700);
    await store.unsent.idle();
    expect(store.unsent.stats).toMatchObject({ released: 1, nothing: 0, gaveUp: 0 });
    expect(store.unsent.stats.failedAttempts).toBeGreaterThan(0);
    expect(await stateOf(c)).toEqual({ record: null, owner: null, fence: '7', slot: null });
  });

  it('a statement that never reached the server: nothing to release, nothing changed', async () => {
    const c = fresh();
    proxy.cut();
    await expect(store.admit(c)).rejects.toThrow();
    proxy.restore();
    await store.unsent.idle();
    expect(store.unsent.stats).toEqual({ ...NONE, released: 0, nothing: 1 });
    expect(await stateOf(c)).toEqual({ record: null, owner: null, fence: null, slot: null });
    expect(await store.admit(retryOf(c))).toEqual({ outcome: 'forward', takeover: false });
  });

  it('key only (no entity) and entity only (no key): each is released, the absent side is not touched', async () => {
    const keyOnly = fresh({ entity: null, fence: null, mode: 'concurrent' });
    const entityOnly = fresh({ key: null, fence: null });
    for (const c of [keyOnly, entityOnly]) {
      proxy.resetNext(1);
      await expect(store.admit(c)).rejects.toThrow();
      await store.unsent.idle();
    }
    expect(store.unsent.stats).toEqual({ ...NONE, released: 2, nothing: 0 });
    expect(await stateOf(keyOnly)).toMatchObject({ record: null });
    expect(await stateOf(entityOnly)).toMatchObject({ slot: null });
    expect(await store.admit(retryOf(entityOnly))).toEqual({ outcome: 'forward', takeover: false });
  });

  it('the database away for longer than the lock (and 1.25 s): the release gives up, the record is left to its lock', async () => {
    const c = fresh({ lockMs: 100 });
    proxy.resetNext(1);
    await expect(store.admit(c)).rejects.toThrow();
    // Away until the release gave up (its 1.25 s at least), however slow the box.
    proxy.cut();
    await store.unsent.idle();
    proxy.restore();
    expect(store.unsent.stats).toMatchObject({ released: 0, nothing: 0, gaveUp: 1 });
    expect(await stateOf(c)).toEqual({ record: 'in_progress', owner: c.ownerToken, fence: '7', slot: c.ownerToken });
    // Its lock ran out: the retry is refused outcome-unknown, as before the release existed.
    expect((await store.admit(retryOf(c))).outcome).toBe('outcome-unknown');
  });

  it('close() while a release waits out the outage: close does not wait for it, it gives up without a statement', async () => {
    const own = await createPostgresStore({ connectionString: proxy.wrapUrl(schema.url), poolSize: 2, listen: false });
    const c = fresh({ lockMs: 5_000 });
    proxy.resetNext(1);
    await expect(own.admit(c)).rejects.toThrow();
    proxy.cut();
    await until(() => own.unsent.stats.failedAttempts > 0, 'a failed release attempt');
    const t = performance.now();
    await own.close();
    await own.unsent.idle();
    expect(performance.now() - t).toBeLessThan(2_500);
    expect(own.unsent.stats).toMatchObject({ released: 0, nothing: 0, gaveUp: 1 });
    proxy.restore();
    // Left to its lock.
    expect(await stateOf(c)).toMatchObject({ record: 'in_progress', owner: c.ownerToken });
  });

  it('a failure that proves nothing was written starts no release: a server error (rolled back), a refused connect', async () => {
    // fencegate_admit raises (timestamp out of range) after it raised the fence: the statement rolls back whole.
    const faulty = fresh({ retentionMs: 1e17 });
    await expect(store.admit(faulty)).rejects.toMatchObject({ code: '22008' });
    expect(await stateOf(faulty)).toEqual({ record: null, owner: null, fence: null, slot: null });
    // A store whose server stopped listening: its next connect is refused.
    const target = new URL(POSTGRES_URL!);
    const gone = await FaultProxy.start({ target: { host: target.hostname, port: Number(target.port || 5432) }, name: 'gone' });
    const nowhere = await createPostgresStore({ connectionString: gone.wrapUrl(schema.url), poolSize: 1, listen: false });
    try {
      await gone.close();
      await until(() => (nowhere.pool as unknown as { totalCount: number }).totalCount === 0, 'the pool dropping its closed connection');
      await expect(nowhere.admit(fresh())).rejects.toMatchObject({ code: 'ECONNREFUSED' });
      expect(nowhere.unsent.stats).toEqual({ ...NONE, notNeeded: 1 });
    } finally {
      await nowhere.close();
    }
    await store.unsent.idle();
    expect(store.unsent.stats).toEqual({ ...NONE, notNeeded: 1 });
  });

  it('a faulty element of a group (its subtransaction rolled back) starts no release; the others are forwarded', async () => {
    const cs = [fresh(), fresh({ retentionMs: 1e17 }), fresh()];
    const settled = await Promise.allSettled(cs.map((c) => store.admit(c)));
    expect(settled.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect((settled[1] as PromiseRejectedResult).reason).toMatchObject({ code: '22008' });
    await store.unsent.idle();
    expect(store.unsent.stats).toEqual({ ...NONE, notNeeded: 1 });
    expect(await stateOf(cs[1]!)).toEqual({ record: null, owner: null, fence: null, slot: null });
  });

  it('at most maxPending releases wait at once: past it, a failed admission is left to its lock', async () => {
    store.unsent.maxPending = 3;
    proxy.cut();
    const cs = Array.from({ length: 10 }, () => fresh());
    const results = await Promise.allSettled(cs.map((c) => store.admit(c)));
    proxy.restore();
    expect(results.every((r) => r.status === 'rejected')).toBe(true);
    await store.unsent.idle();
    expect(store.unsent.stats).toMatchObject({ released: 0, nothing: 3, overCap: 7 });
  });

  it('limit: a statement blocked on a row lock when the connection is cut commits after the release found nothing', async () => {
    const c = fresh();
    const held = await holdEntity(schema, c.entity!);
    const failed = store.admit(c);
    failed.catch(() => {});
    await until(async () => (await held.waiters()) > 0, 'the admission waiting for the entity row');
    // A network cut: the gateway's side of the connection dies, the backend keeps waiting for the lock.
    proxy.cut();
    setTimeout(() => proxy.restore(), 50);
    await expect(failed).rejects.toThrow();
    await store.unsent.idle();
    expect(store.unsent.stats).toMatchObject({ released: 0, nothing: 1 });
    await held.release();
    await until(async () => (await stateOf(c)).record !== null, 'the orphaned admission committing');
    // Never forwarded, yet held under its owner until its lock runs out (then outcome-unknown).
    expect(await stateOf(c)).toEqual({ record: 'in_progress', owner: c.ownerToken, fence: '7', slot: c.ownerToken });
    expect((await store.admit(retryOf(c))).outcome).toBe('idempotency-in-progress');
  });

  it('takeover (onUnknown: retry) then lost answer: the record goes back to outcome_unknown, its fingerprint still refuses another payload', async () => {
    // R0 was forwarded; its lock ran out with no finish: its outcome is unknown.
    const r0 = fresh({ lockMs: 50, onUnknown: 'retry' });
    expect(await store.admit(r0)).toEqual({ outcome: 'forward', takeover: false });
    await new Promise((r) => setTimeout(r, 80));
    const r1 = retryOf(r0);
    proxy.resetNext(1);
    await expect(store.admit(r1)).rejects.toThrow();
    await store.unsent.idle();
    expect(store.unsent.stats).toMatchObject({ released: 1 });
    expect(await stateOf(r0)).toEqual({ record: 'outcome_unknown', owner: r1.ownerToken, fence: '7', slot: null });
    // Deleting it (what a route without takeovers gets) would forward this one.
    expect((await store.admit({ ...retryOf(r0), fingerprint: 'another payload' })).outcome).toBe('idempotency-key-reused');
    expect(await store.admit(retryOf(r0))).toEqual({ outcome: 'forward', takeover: true });
  });

  it('a fresh record on an onUnknown: retry route is deleted all the same: the retry is forwarded as new, not as a takeover', async () => {
    const c = fresh({ onUnknown: 'retry' });
    proxy.resetNext(1);
    await expect(store.admit(c)).rejects.toThrow();
    await store.unsent.idle();
    expect(store.unsent.stats).toEqual({ ...NONE, released: 1 });
    expect(await stateOf(c)).toEqual({ record: null, owner: null, fence: '7', slot: null });
    expect(await store.admit(retryOf(c))).toEqual({ outcome: 'forward', takeover: false });
  });

  it('control for the takeover case: the admission-expired path (finish unknown) keeps refusing another payload', async () => {
    const r0 = fresh({ lockMs: 50, onUnknown: 'retry' });
    expect(await store.admit(r0)).toEqual({ outcome: 'forward', takeover: false });
    await new Promise((r) => setTimeout(r, 80));
    const r1 = retryOf(r0);
    expect(await store.admit(r1)).toEqual({ outcome: 'forward', takeover: true });
    await store.finish({ scope: r1.scope, key: r1.key, entity: r1.entity, ownerToken: r1.ownerToken, audit: r1.audit, outcome: 'unknown' });
    const other = { ...retryOf(r0), fingerprint: 'another payload' };
    expect((await store.admit(other)).outcome).toBe('idempotency-key-reused');
  });
});
