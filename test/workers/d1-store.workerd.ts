/**
 * The D1 store against a real local D1 inside workerd, through the
 * `GatewayStore` interface only (plus SQL to backdate rows: expiry is reached
 * by moving database times, never by faking the clock). Each test uses its
 * own entity and key names, so tests share one database safely.
 */
import { env } from 'cloudflare:workers';
import { describe, expect, it } from 'vitest';
import { createD1Store, type D1DatabaseLike, type D1PreparedStatementLike } from '../../src/store/d1/index.js';
import type { AdmitInput, FinishInput } from '../../src/store/types.js';
import type { RouteConfig } from '../../src/config/schema.js';
import { admitWithWaits } from '../../src/http/pipeline/admit.js';
import type { Inbound } from '../../src/http/inbound.js';

const db = env.DB;
const store = createD1Store({ db, pollMs: 20 });
const MAX = 9223372036854775807n;

let n = 0;
/** A name unique to this test run. */
const uniq = (what: string) => `${what}-${Date.now().toString(36)}-${++n}`;

function input(over: Partial<AdmitInput> = {}): AdmitInput {
  return {
    scope: 'payments',
    key: uniq('key'),
    entity: uniq('ent'),
    fence: 1n,
    fingerprint: 'fp-1',
    mode: 'serial',
    ownerToken: crypto.randomUUID(),
    lockMs: 10_000,
    retentionMs: 86_400_000,
    onUnknown: 'reject',
    audit: { requestId: uniq('req'), clientRequestId: null, caller: null, method: 'POST', path: '/payments/x', payloadSha256: 'ab'.repeat(32) },
    ...over,
  };
}

function finishOf(i: AdmitInput, over: Partial<FinishInput> = {}): FinishInput {
  const body = new Uint8Array([0, 1, 2, 254, 255, 10, 13]);
  return {
    scope: i.scope,
    key: i.key,
    entity: i.entity,
    ownerToken: i.ownerToken,
    audit: i.audit,
    outcome: 'completed',
    response: {
      status: 201,
      headers: [
        ['content-type', 'application/octet-stream'],
        ['etag', '"x"'],
      ],
      body,
    },
    retentionMs: i.retentionMs,
    ...over,
  } as FinishInput;
}

const sql = (q: string, ...values: unknown[]) =>
  db
    .prepare(q)
    .bind(...values)
    .run();
const rows = async (q: string, ...values: unknown[]) =>
  (
    await db
      .prepare(q)
      .bind(...values)
      .all()
  ).results ?? [];
const rejectionsFor = async (entity: string) => (await store.listRejections({ entity, limit: 100 })).items;

describe('fence (DESIGN §3.5 a)', () => {
  it('raises the fence, accepts an equal one, refuses a lower one and logs it in the same batch', async () => {
    const first = input({ fence: 5n, mode: 'concurrent' });
    expect(await store.admit(first)).toEqual({ outcome: 'forward', takeover: false });
    const equal = input({ entity: first.entity, fence: 5n, mode: 'concurrent' });
    expect((await store.admit(equal)).outcome).toBe('forward');
    const stale = input({ entity: first.entity, fence: 4n, mode: 'concurrent' });
    expect(await store.admit(stale)).toEqual({ outcome: 'stale-fence', currentFence: 5n });

    const [r] = await rejectionsFor(first.entity!);
    expect(r).toMatchObject({ reason: 'stale-fence', presentedFence: '4', currentFence: '5', idempotencyKey: stale.key, requestId: stale.audit.requestId });
    expect(await store.getRecords(stale.key!)).toEqual([]);
    expect((await store.getEntity(first.entity!))?.fence).toBe('5');
  });

  it('keeps 64-bit fences exact (2^63-1 round-trips; 2^63-2 is stale against it)', async () => {
    const top = input({ fence: MAX, mode: 'concurrent' });
    expect((await store.admit(top)).outcome).toBe('forward');
    expect((await store.getEntity(top.entity!))?.fence).toBe(MAX.toString());
    // As doubles these two are equal: only exact integers tell them apart.
    expect(await store.admit(input({ entity: top.entity, fence: MAX - 1n, mode: 'concurrent' }))).toEqual({ outcome: 'stale-fence', currentFence: MAX });
    const [r] = await rejectionsFor(top.entity!);
    expect(r).toMatchObject({ presentedFence: (MAX - 1n).toString(), currentFence: MAX.toString() });
  });

  it('checks the fence first: a stale fence is refused even when its key has a stored response', async () => {
    const w1 = input({ fence: 1n });
    await store.admit(w1);
    await store.finish(finishOf(w1));
    await store.admit(input({ entity: w1.entity, fence: 2n, mode: 'concurrent' }));
    expect(await store.admit({ ...w1, ownerToken: crypto.randomUUID() })).toEqual({ outcome: 'stale-fence', currentFence: 2n });
  });
});

describe('idempotency records (DESIGN §3.5 b–g)', () => {
  it('replays a completed record byte for byte', async () => {
    const i = input();
    await store.admit(i);
    expect(await store.finish(finishOf(i))).toEqual({ recorded: true });
    const again = await store.admit({ ...i, ownerToken: crypto.randomUUID() });
    expect(again.outcome).toBe('replay');
    if (again.outcome !== 'replay') return;
    expect(again.response.status).toBe(201);
    expect(again.response.headers).toEqual([
      ['content-type', 'application/octet-stream'],
      ['etag', '"x"'],
    ]);
    expect([...again.response.body]).toEqual([0, 1, 2, 254, 255, 10, 13]);
  });

  it('a newer owner reusing a completed key gets the replay (how W2 learns W1 paid)', async () => {
    const w1 = input({ fence: 41n });
    await store.admit(w1);
    await store.finish(finishOf(w1));
    const w2 = await store.admit({ ...w1, fence: 42n, ownerToken: crypto.randomUUID() });
    expect(w2.outcome).toBe('replay');
    expect((await store.getEntity(w1.entity!))?.fence).toBe('42');
  });

  it('refuses the same key with another fingerprint (422) and logs it', async () => {
    const i = input();
    await store.admit(i);
    await store.finish(finishOf(i));
    expect(await store.admit({ ...i, fingerprint: 'fp-other', ownerToken: crypto.randomUUID() })).toEqual({ outcome: 'idempotency-key-reused' });
    expect((await rejectionsFor(i.entity!)).map((r) => r.reason)).toEqual(['idempotency-key-reused']);
  });

  it('answers in-progress while the lock lives, with the time left', async () => {
    const i = input({ mode: 'concurrent', lockMs: 8_000 });
    await store.admit(i);
    const again = await store.admit({ ...i, ownerToken: crypto.randomUUID() });
    expect(again.outcome).toBe('idempotency-in-progress');
    if (again.outcome === 'idempotency-in-progress') {
      expect(again.retryAfterMs).toBeGreaterThan(6_000);
      expect(again.retryAfterMs).toBeLessThanOrEqual(8_000);
    }
  });

  it('turns an in_progress record with an expired lock into outcome_unknown, logged (gateway died)', async () => {
    const i = input({ mode: 'concurrent' });
    await store.admit(i);
    await sql('UPDATE idempotency_records SET locked_until = locked_until - 60000 WHERE key = ?', i.key);
    expect(await store.admit({ ...i, ownerToken: crypto.randomUUID() })).toEqual({ outcome: 'outcome-unknown' });
    expect((await store.getRecords(i.key!))[0]?.state).toBe('outcome_unknown');
    expect((await rejectionsFor(i.entity!)).map((r) => r.reason)).toEqual(['outcome-unknown']);
    // And stays so: never re-sent blindly.
    expect(await store.admit({ ...i, ownerToken: crypto.randomUUID() })).toEqual({ outcome: 'outcome-unknown' });
  });

  it("onUnknown retry: takes the record over; the old owner's late finish is logged and discarded", async () => {
    const old = input({ mode: 'concurrent', onUnknown: 'retry' });
    await store.admit(old);
    await store.finish(finishOf(old, { outcome: 'unknown' }));
    const fresh = { ...old, ownerToken: crypto.randomUUID(), fence: 2n };
    expect(await store.admit(fresh)).toEqual({ outcome: 'forward', takeover: true });
    const rec = (await store.getRecords(old.key!))[0]!;
    expect(rec).toMatchObject({ state: 'in_progress', fence: '2' });

    expect(await store.finish(finishOf(old))).toEqual({ recorded: false });
    expect((await rejectionsFor(old.entity!)).map((r) => r.reason)).toEqual(['late-finish']);
    expect(await store.finish(finishOf(fresh))).toEqual({ recorded: true });
    expect((await store.admit({ ...old, ownerToken: crypto.randomUUID(), fence: 2n })).outcome).toBe('replay');
  });

  it('onUnknown retry also takes over an in_progress record whose lock expired', async () => {
    const old = input({ mode: 'concurrent', onUnknown: 'retry' });
    await store.admit(old);
    await sql('UPDATE idempotency_records SET locked_until = locked_until - 60000 WHERE key = ?', old.key);
    expect(await store.admit({ ...old, ownerToken: crypto.randomUUID() })).toEqual({ outcome: 'forward', takeover: true });
    expect(await rejectionsFor(old.entity!)).toEqual([]);
  });

  it('a late finish of a record only marked outcome_unknown (nobody took it over) completes it', async () => {
    const i = input({ mode: 'concurrent' });
    await store.admit(i);
    await sql('UPDATE idempotency_records SET locked_until = locked_until - 60000 WHERE key = ?', i.key);
    await store.admit({ ...i, ownerToken: crypto.randomUUID() }); // marks it outcome_unknown
    expect(await store.finish(finishOf(i))).toEqual({ recorded: true });
    expect((await store.admit({ ...i, ownerToken: crypto.randomUUID() })).outcome).toBe('replay');
  });

  it('released: the record is deleted, a retry with the same key forwards again', async () => {
    const i = input();
    await store.admit(i);
    expect(await store.finish(finishOf(i, { outcome: 'released' }))).toEqual({ recorded: true });
    expect(await store.getRecords(i.key!)).toEqual([]);
    expect((await store.admit({ ...i, ownerToken: crypto.randomUUID() })).outcome).toBe('forward');
  });

  it('treats an expired completed record as absent', async () => {
    const i = input();
    await store.admit(i);
    await store.finish(finishOf(i));
    await sql('UPDATE idempotency_records SET expires_at = expires_at - 90000000 WHERE key = ?', i.key);
    expect(await store.admit({ ...i, fingerprint: 'fp-2', ownerToken: crypto.randomUUID() })).toEqual({ outcome: 'forward', takeover: false });
    expect((await store.getRecords(i.key!))[0]).toMatchObject({ state: 'in_progress', fingerprint: 'fp-2' });
  });

  it('a finish by an owner that never held the record logs late-finish', async () => {
    const i = input({ mode: 'concurrent' });
    expect(await store.finish(finishOf(i))).toEqual({ recorded: false });
    const [r] = await rejectionsFor(i.entity!);
    expect(r).toMatchObject({ reason: 'late-finish', idempotencyKey: i.key, presentedFence: null });
  });
});

describe('serial mode (DESIGN §3.5 h)', () => {
  it('one request in flight per entity; the slot is taken before the record, so busy leaves none', async () => {
    const a = input({ lockMs: 5_000 });
    const b = input({ entity: a.entity, fence: 1n });
    expect((await store.admit(a)).outcome).toBe('forward');
    const busy = await store.admit(b);
    expect(busy.outcome).toBe('entity-busy');
    if (busy.outcome === 'entity-busy') expect(busy.retryAfterMs).toBeGreaterThan(3_000);
    expect(await store.getRecords(b.key!)).toEqual([]);
    expect((await store.getEntity(a.entity!))?.inflight).not.toBeNull();

    await store.finish(finishOf(a));
    expect((await store.getEntity(a.entity!))?.inflight).toBeNull();
    expect((await store.admit(b)).outcome).toBe('forward');
  });

  it('entity-busy still raises the fence and still marks a dead record outcome_unknown (as SQLite does)', async () => {
    const holder = input({ fence: 1n });
    await store.admit(holder);
    const dead = input({ entity: holder.entity, mode: 'concurrent', fence: 1n });
    await store.admit(dead);
    await sql('UPDATE idempotency_records SET locked_until = locked_until - 60000 WHERE key = ?', dead.key);
    const retry = await store.admit({ ...dead, fence: 3n, mode: 'serial', onUnknown: 'retry', ownerToken: crypto.randomUUID() });
    expect(retry.outcome).toBe('entity-busy');
    expect((await store.getEntity(holder.entity!))?.fence).toBe('3');
    expect((await store.getRecords(dead.key!))[0]?.state).toBe('outcome_unknown');
  });

  it('takes over the expired slot of a dead gateway', async () => {
    const a = input();
    await store.admit(a);
    await sql('UPDATE fence_entities SET inflight_until = inflight_until - 60000 WHERE entity = ?', a.entity);
    expect((await store.admit(input({ entity: a.entity }))).outcome).toBe('forward');
    // The dead owner's finish no longer frees the new owner's slot.
    await store.finish(finishOf(a));
    expect((await store.getEntity(a.entity!))?.inflight).not.toBeNull();
  });

  it('serialises an entity without fences (fence: null creates the slot row)', async () => {
    const a = input({ fence: null });
    expect((await store.admit(a)).outcome).toBe('forward');
    expect(await store.getEntity(a.entity!)).toMatchObject({ fence: null });
    expect((await store.admit(input({ entity: a.entity, fence: null }))).outcome).toBe('entity-busy');
  });

  it('concurrent mode lets several requests of one entity through', async () => {
    const a = input({ mode: 'concurrent' });
    await store.admit(a);
    expect((await store.admit(input({ entity: a.entity, mode: 'concurrent' }))).outcome).toBe('forward');
  });

  it('keyless, entity-less requests forward without writing anything', async () => {
    expect(await store.admit(input({ key: null, entity: null, fence: null }))).toEqual({ outcome: 'forward', takeover: false });
  });
});

describe('atomicity under real parallelism', () => {
  it('20 parallel admissions of one key: exactly one forwards', async () => {
    const base = input({ mode: 'concurrent' });
    const results = await Promise.all(Array.from({ length: 20 }, () => store.admit({ ...base, ownerToken: crypto.randomUUID() })));
    expect(results.filter((r) => r.outcome === 'forward')).toHaveLength(1);
    expect(results.filter((r) => r.outcome === 'idempotency-in-progress')).toHaveLength(19);
  });

  it('20 parallel serial admissions of one entity: exactly one takes the slot', async () => {
    const entity = uniq('ent');
    const results = await Promise.all(Array.from({ length: 20 }, () => store.admit(input({ entity }))));
    expect(results.filter((r) => r.outcome === 'forward')).toHaveLength(1);
    expect(results.filter((r) => r.outcome === 'entity-busy')).toHaveLength(19);
  });

  it('shuffled fences in parallel: the entity ends at the highest, every refusal logged', async () => {
    const entity = uniq('ent');
    const fences = [7n, 3n, 9n, 1n, 8n, 2n, 6n, 4n, 5n, 10n];
    const results = await Promise.all(fences.map((fence) => store.admit(input({ entity, fence, mode: 'concurrent' }))));
    expect((await store.getEntity(entity))?.fence).toBe('10');
    const stale = results.filter((r) => r.outcome === 'stale-fence').length;
    expect((await rejectionsFor(entity)).length).toBe(stale);
  });

  it('a batch that fails leaves no trace: no fence raised, no record, no scratch row', async () => {
    // Negative control of the all-or-nothing claim: the same admission with
    // one failing statement appended to its batch.
    const failing: D1DatabaseLike = {
      prepare: (q) => db.prepare(q),
      batch: (steps: D1PreparedStatementLike[]) => db.batch([...steps, db.prepare('SELECT no_such_column FROM admission_scratch')]),
    };
    const broken = createD1Store({ db: failing });
    const i = input({ fence: 7n });
    await expect(broken.admit(i)).rejects.toThrow();
    expect(await store.getEntity(i.entity!)).toBeNull();
    expect(await store.getRecords(i.key!)).toEqual([]);
    expect(await rows('SELECT * FROM admission_scratch')).toEqual([]);
  });

  it('negative control: without the fence the stale request would be forwarded', async () => {
    const a = input({ fence: 5n, mode: 'concurrent' });
    await store.admit(a);
    const admitWithoutFence = (i: AdmitInput) => store.admit({ ...i, fence: null });
    expect((await admitWithoutFence(input({ entity: a.entity, fence: 4n, mode: 'concurrent' }))).outcome).toBe('forward');
    expect((await store.admit(input({ entity: a.entity, fence: 4n, mode: 'concurrent' }))).outcome).toBe('stale-fence');
  });
});

describe('waiting, audit and sweeping', () => {
  // A finish runs in another request than its waiters; a waiter it resolved
  // would wait on no I/O of its own, which workerd cancels as hung (500).
  it('waitForChange is one poll on a timer of the caller: a finish in this isolate does not resolve it, and it is bounded', async () => {
    const b = input();
    await store.admit(b);
    // A poll far beyond the test: only a wake-up from the finish, or the abort, ends this wait.
    const slow = createD1Store({ db, pollMs: 600_000 });
    const stop = new AbortController();
    let settled = false;
    const polled = slow.waitForChange(`e:${b.entity}`, 600_000, stop.signal).then(() => (settled = true));
    await slow.finish(finishOf(b));
    await new Promise<void>((r) => setTimeout(r, 0));
    expect(settled).toBe(false);
    stop.abort();
    await polled;

    const a = input();
    await store.admit(a);
    const started = Date.now();
    const waiting = store.waitForChange(`e:${a.entity}`, 5_000);
    await store.finish(finishOf(a));
    await waiting;
    expect(Date.now() - started).toBeLessThan(2_000);

    const t0 = Date.now();
    await store.waitForChange('e:nobody', 5_000); // pollMs 20: a poll, not the whole timeout
    expect(Date.now() - t0).toBeLessThan(1_000);
    const ac = new AbortController();
    ac.abort();
    await store.waitForChange('e:nobody', 5_000, ac.signal);
  });

  // D1 allows 50 queries per invocation on the Free plan: a request polling
  // past them would fail its own finish after the upstream call.
  it('one request polls at most maxPolls times (all its waits together), however long it waits; the polls slow down as it waits', async () => {
    const holder = input();
    expect((await store.admit(holder)).outcome).toBe('forward');
    let batches = 0;
    const counted: D1DatabaseLike = { prepare: (q) => db.prepare(q), batch: (st) => (batches++, db.batch(st)) };
    const route = { serialWaitMs: 1_500, maxWaitMs: 0 } as RouteConfig;
    const waitFor = async (polling: ReturnType<typeof createD1Store>) => {
      batches = 0;
      const req = { headers: new Headers(), signal: new AbortController().signal } as unknown as Inbound;
      const { admission } = await admitWithWaits(polling, input({ entity: holder.entity }), route, req);
      expect(admission.outcome).toBe('entity-busy');
      return batches;
    };
    // The cap: 5 polls, then one admission at the wait's end.
    expect(await waitFor(createD1Store({ db: counted, pollMs: 20, maxPolls: 5 }))).toBeLessThanOrEqual(6);
    // Control: under the default cap the 1.5 s wait polls more than that, yet
    // fewer than every 20 ms (75): the interval grows with the time waited.
    const free = await waitFor(createD1Store({ db: counted, pollMs: 20 }));
    expect(free).toBeGreaterThan(6);
    expect(free).toBeLessThan(40);
    await store.finish(finishOf(holder));
  });

  it('records rejections decided before admission, and pages them newest first', async () => {
    const entity = uniq('ent');
    for (const reason of ['invalid-fence-signature', 'fence-expired', 'unauthorized'] as const) {
      await store.recordRejection({ reason, entity, presentedFence: MAX, currentFence: null, idempotencyKey: null, audit: input().audit });
    }
    const p1 = await store.listRejections({ entity, limit: 2 });
    expect(p1.items.map((r) => r.reason)).toEqual(['unauthorized', 'fence-expired']);
    expect(p1.items[0]!.presentedFence).toBe(MAX.toString());
    const p2 = await store.listRejections({ entity, limit: 2, cursor: p1.nextCursor! });
    expect(p2.items.map((r) => r.reason)).toEqual(['invalid-fence-signature']);
    expect(p2.nextCursor).toBeNull();
    expect((await store.listRejections({ entity, reason: 'fence-expired', limit: 10 })).items).toHaveLength(1);
    expect((await store.listRejections({ entity, since: new Date(Date.now() + 3_600_000), limit: 10 })).items).toHaveLength(0);
  });

  it('sweeps expired records, dead in_progress records and old rejections', async () => {
    const done = input({ mode: 'concurrent' });
    await store.admit(done);
    await store.finish(finishOf(done));
    await sql('UPDATE idempotency_records SET expires_at = expires_at - 90000000 WHERE key = ?', done.key);
    const dead = input({ mode: 'concurrent' });
    await store.admit(dead);
    await sql('UPDATE idempotency_records SET locked_until = locked_until - 60000 WHERE key = ?', dead.key);
    await store.recordRejection({
      reason: 'unauthorized',
      entity: dead.entity,
      presentedFence: null,
      currentFence: null,
      idempotencyKey: null,
      audit: dead.audit,
    });
    await sql('UPDATE rejections SET at = at - 90000000 WHERE entity = ?', dead.entity);

    const swept = await store.sweep({ rejectionRetentionMs: 3_600_000 });
    expect(swept.expiredRecords).toBeGreaterThanOrEqual(1);
    expect(swept.unknownRecords).toBeGreaterThanOrEqual(1);
    expect(swept.oldRejections).toBeGreaterThanOrEqual(1);
    expect(await store.getRecords(done.key!)).toEqual([]);
    expect((await store.getRecords(dead.key!))[0]?.state).toBe('outcome_unknown');
    expect(await rejectionsFor(dead.entity!)).toEqual([]);
  });

  it('close is idempotent', async () => {
    const s = createD1Store({ db });
    await s.close();
    await s.close();
  });
});

describe('audit: fence history, detail, outcome_unknown resolution', () => {
  it('writes a fence_history row per accepted rise, in the admission batch; none for stale or equal fences', async () => {
    const entity = uniq('ent');
    for (const fence of [1n, 1n, 5n, 3n, MAX]) await store.admit(input({ entity, fence, mode: 'concurrent', audit: { ...input().audit, caller: 'w1' } }));
    const page1 = await store.getFenceHistory!(entity, { limit: 2 });
    expect(page1.items.map((r) => r.fence)).toEqual([MAX.toString(), '5']);
    expect(page1.items[0]).toMatchObject({ caller: 'w1' });
    const page2 = await store.getFenceHistory!(entity, { limit: 2, cursor: page1.nextCursor! });
    expect(page2).toMatchObject({ items: [{ fence: '1' }], nextCursor: null });
  });

  it('keeps the rejection detail and turns an empty payload hash into null', async () => {
    const entity = uniq('ent');
    await store.recordRejection({
      reason: 'unauthorized',
      entity,
      presentedFence: null,
      currentFence: null,
      idempotencyKey: null,
      audit: { ...input().audit, payloadSha256: '' },
      detail: 'expired',
    });
    const [r] = await rejectionsFor(entity);
    expect(r).toMatchObject({ detail: 'expired', payloadSha256: null });
  });

  it('resolves an outcome_unknown record once (completed or released), logs the operator action, refuses other states', async () => {
    const done = input({ mode: 'concurrent', fence: 9n });
    await store.admit(done);
    await store.finish(finishOf(done, { outcome: 'unknown' }));
    const before = await store.auditStats();
    expect(before.outcomeUnknown).toBeGreaterThanOrEqual(1);
    const listed = await store.listRecords!({ state: 'outcome_unknown', limit: 1000 });
    expect(listed.items.some((r) => r.key === done.key && r.fence === '9')).toBe(true);

    const body = new TextEncoder().encode('{"id":"ch_1"}');
    const resolved = await store.resolveRecord!({
      scope: done.scope,
      key: done.key!,
      resolution: { outcome: 'completed', response: { status: 201, headers: [['content-type', 'application/json']], body }, retentionMs: 60_000 },
      operator: 'ops',
      note: 'checked upstream',
      requestId: 'r-1',
    });
    expect(resolved).toMatchObject({
      ok: true,
      action: { action: 'resolve-completed', key: done.key, fence: '9', status: 201, operator: 'ops', note: 'checked upstream' },
    });
    const replay = await store.admit({ ...done, ownerToken: crypto.randomUUID() });
    expect(replay.outcome).toBe('replay');
    // Not the operator's any more: completed.
    const again = await store.resolveRecord!({
      scope: done.scope,
      key: done.key!,
      resolution: { outcome: 'released' },
      operator: 'ops',
      note: null,
      requestId: 'r-2',
    });
    expect(again).toEqual({ ok: false, reason: 'not-outcome-unknown', state: 'completed' });
    expect(
      await store.resolveRecord!({ scope: 'payments', key: uniq('none'), resolution: { outcome: 'released' }, operator: null, note: null, requestId: 'r-3' }),
    ).toEqual({ ok: false, reason: 'not-found' });

    const gone = input({ mode: 'concurrent' });
    await store.admit(gone);
    await store.finish(finishOf(gone, { outcome: 'unknown' }));
    expect(
      await store.resolveRecord!({ scope: gone.scope, key: gone.key!, resolution: { outcome: 'released' }, operator: null, note: null, requestId: 'r-4' }),
    ).toMatchObject({ ok: true, action: { action: 'resolve-released' } });
    expect(await store.getRecords(gone.key!)).toEqual([]);

    const actions = await store.listOperatorActions!({ limit: 1 });
    expect(actions.items[0]).toMatchObject({ action: 'resolve-released', key: gone.key });
    const older = await store.listOperatorActions!({ limit: 1, cursor: actions.nextCursor! });
    expect(older.items[0]).toMatchObject({ action: 'resolve-completed', key: done.key });
  });

  it('pages outcome_unknown records newest first with an opaque cursor', async () => {
    const keys: string[] = [];
    for (let i = 0; i < 3; i++) {
      const c = input({ mode: 'concurrent', scope: `audit\u0000scope-${uniq('s')}` });
      await store.admit(c);
      await store.finish(finishOf(c, { outcome: 'unknown' }));
      keys.push(c.key!);
    }
    const seen: { key: string; at: number }[] = [];
    let cursor: string | undefined;
    do {
      const page = await store.listRecords!({ state: 'outcome_unknown', limit: 2, cursor });
      seen.push(...page.items.map((r) => ({ key: r.key, at: r.createdAt.getTime() })));
      cursor = page.nextCursor ?? undefined;
    } while (cursor !== undefined);
    // No gaps, no repeats, newest first.
    expect(new Set(seen.map((r) => r.key)).size).toBe(seen.length);
    expect(keys.every((k) => seen.some((r) => r.key === k))).toBe(true);
    expect(seen.every((r, i) => i === 0 || seen[i - 1]!.at >= r.at)).toBe(true);
  });
});

describe('list reads sort by the number, not its text (ids and fences across a digit boundary)', () => {
  /**
   * The next ids of `table` made to cross a power of ten (…9994 to …0005 for
   * 12 rows): a placeholder row at that id, deleted again (AUTOINCREMENT
   * keeps counting from it). Sorted as text, '999999' would come before
   * '1000005'; ids that never cross a boundary would not show the fault.
   */
  async function crossBoundary(table: 'rejections' | 'operator_actions', placeholder: string): Promise<void> {
    const [r] = (await rows(`SELECT coalesce(max(id), 0) AS m FROM ${table}`)) as { m: number }[];
    const id = 10 ** String(r!.m + 7).length - 7;
    await sql(placeholder, id);
    await sql(`DELETE FROM ${table} WHERE id = ?`, id);
  }
  const numericDescending = (ids: string[]) => ids.every((id, i) => i === 0 || BigInt(ids[i - 1]!) > BigInt(id));

  it('listRejections: 12 rows newest first by id, pages included', async () => {
    await crossBoundary('rejections', "INSERT INTO rejections (id, at, reason) VALUES (?, 0, 'placeholder')");
    const entity = uniq('ent');
    for (let i = 0; i < 12; i++) {
      await store.recordRejection({ reason: 'stale-fence', entity, presentedFence: BigInt(i), currentFence: null, idempotencyKey: null, audit: input().audit });
    }
    const all = await rejectionsFor(entity);
    expect(all.map((r) => r.presentedFence)).toEqual(Array.from({ length: 12 }, (_, i) => String(11 - i)));
    expect(numericDescending(all.map((r) => r.id))).toBe(true);
    expect(all[0]!.id.length).toBeGreaterThan(all[11]!.id.length); // the boundary is inside the page
    const paged: string[] = [];
    let cursor: string | undefined;
    do {
      const page = await store.listRejections({ entity, limit: 5, cursor });
      paged.push(...page.items.map((r) => r.id));
      cursor = page.nextCursor ?? undefined;
    } while (cursor !== undefined);
    expect(paged).toEqual(all.map((r) => r.id));
  });

  it('listOperatorActions: 12 resolutions newest first by id', async () => {
    await crossBoundary(
      'operator_actions',
      "INSERT INTO operator_actions (id, at, action, scope, key) VALUES (?, 0, 'resolve-released', 'placeholder', 'placeholder')",
    );
    const keys: string[] = [];
    for (let i = 0; i < 12; i++) {
      const c = input({ mode: 'concurrent' });
      await store.admit(c);
      await store.finish(finishOf(c, { outcome: 'unknown' }));
      expect(
        await store.resolveRecord!({ scope: c.scope, key: c.key!, resolution: { outcome: 'released' }, operator: 'ops', note: null, requestId: uniq('r') }),
      ).toMatchObject({ ok: true });
      keys.push(c.key!);
    }
    const page = await store.listOperatorActions!({ limit: 12 });
    expect(page.items.map((a) => a.key)).toEqual([...keys].reverse());
    expect(numericDescending(page.items.map((a) => a.id))).toBe(true);
    expect(page.items[0]!.id.length).toBeGreaterThan(page.items[11]!.id.length);
  });

  it('getFenceHistory: 12 rises (1 to 12), highest fence first', async () => {
    const entity = uniq('ent');
    for (let fence = 1n; fence <= 12n; fence++) expect((await store.admit(input({ entity, fence, mode: 'concurrent' }))).outcome).toBe('forward');
    const page = await store.getFenceHistory!(entity, { limit: 100 });
    expect(page.items.map((r) => r.fence)).toEqual(Array.from({ length: 12 }, (_, i) => String(12 - i)));
  });
});
