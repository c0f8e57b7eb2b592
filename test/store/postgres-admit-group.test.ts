import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAdmit, type AdmitGroupOptions } from '../../src/store/postgres/admit.js';
import type { RoundTripGroup } from '../../src/store/postgres/finish-group.js';
import { FUNCTIONS_DIR } from '../../src/store/postgres/functions.js';
import { createPostgresStore, type PostgresGatewayStore } from '../../src/store/postgres/index.js';
import { poolQuery, qualifier, type PgContext } from '../../src/store/postgres/query.js';
import type { Admission, AdmitInput } from '../../src/store/types.js';
import { createTestSchema, holdEntity as holdRow, rejectionReasons, otherSession, POSTGRES_URL, until, type TestSchema } from '../helpers/postgres.js';
import { admitInput } from './helpers/inputs.js';

/**
 * Group commit of the PostgreSQL admission (DESIGN §8.2): what is specific
 * to grouping. The whole store contract runs against the grouped admission
 * in postgres.test.ts and admission-conformance (conformance) and
 * test/replicas.
 */
let schema: TestSchema;
let store: PostgresGatewayStore;

const groupOf = (s: PostgresGatewayStore) => (s as unknown as { admission: { group: RoundTripGroup<AdmitInput, Admission> } }).admission.group;
const fresh = (over: Partial<AdmitInput> = {}) =>
  admitInput({ key: `k-${randomUUID()}`, entity: `e-${randomUUID()}`, ownerToken: `o-${randomUUID()}`, ...over });
/** Another request for the same key and payload (a retry), from another owner. */
const retryOf = (c: AdmitInput): AdmitInput => ({ ...c, ownerToken: `o-${randomUUID()}`, fence: null, entity: null, mode: 'concurrent' });
/** An admission fencegate_admit raises on after it raised the fence and took the slot: its record's expiry is past timestamptz's range. */
const faulty = (c: AdmitInput): AdmitInput => ({ ...c, retentionMs: 1e17 });

/** The schema's pool as a store context; `rewrite` changes each statement's text (the controls' functions). */
function context(rewrite: (text: string) => string = (t) => t, seen?: string[]): PgContext {
  const base = poolQuery(schema.pool as never, () => false);
  return {
    query: (text, values, prepared) => {
      seen?.push(text);
      return base(rewrite(text), values, prepared);
    },
    table: qualifier(null),
  };
}
const admitVia = (o: AdmitGroupOptions = {}, rewrite?: (text: string) => string, seen?: string[]) => createAdmit(context(rewrite, seen), o);

async function stateOf(c: AdmitInput) {
  const rec = await schema.pool.query<{ state: string; owner_token: string }>(
    'SELECT state, owner_token FROM idempotency_records WHERE scope = $1 AND key = $2',
    [c.scope, c.key],
  );
  const ent = await schema.pool.query<{ fence: string | null; inflight_owner: string | null }>(
    'SELECT fence, inflight_owner FROM fence_entities WHERE entity = $1',
    [c.entity],
  );
  return { record: rec.rows[0]?.state ?? null, fence: ent.rows[0]?.fence ?? null, slot: ent.rows[0]?.inflight_owner ?? null };
}
const rejectionsOf = (requestId: string) => rejectionReasons(schema, requestId);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const holdEntity = (entity: string) => holdRow(schema, entity);

describe.skipIf(!POSTGRES_URL)('PostgreSQL admission group commit', () => {
  beforeAll(async () => {
    schema = await createTestSchema('fg_agroup');
    store = await createPostgresStore({ connectionString: schema.url, poolSize: 8 });
  });
  afterAll(async () => {
    await store?.close();
    await schema?.drop();
  });

  it('admissions that arrive together go as one statement; each caller hears after the commit', async () => {
    const admit = admitVia({ budgetMs: null }); // no budget: a loaded box must not defer elements to run alone
    const cmds = Array.from({ length: 30 }, () => fresh());
    const before = { ...admit.group.stats };
    const answers = await Promise.all(cmds.map((c) => admit(c)));
    expect(answers.every((a) => a.outcome === 'forward')).toBe(true);
    const g = admit.group.stats;
    expect(g.elements - before.elements).toBe(30);
    expect(g.roundTrips - before.roundTrips).toBeLessThanOrEqual(2); // not 30 round trips and commits
    expect(g.grouped - before.grouped).toBeGreaterThanOrEqual(29);
    // Answered after COMMIT: another connection sees every record and slot.
    for (const c of cmds) expect(await stateOf(c)).toEqual({ record: 'in_progress', fence: '1', slot: c.ownerToken });
  });

  it('observeGroups hears each statement of admissions and of finishes (fencegate_store_group_size); a store not observed hears nothing', async () => {
    const own = await createPostgresStore({ connectionString: schema.url, poolSize: 4 });
    const sizes: number[] = [];
    own.observeGroups((size, syncMs) => {
      expect(syncMs).toBeNull();
      sizes.push(size);
    });
    const cmds = Array.from({ length: 20 }, () => fresh());
    const finishes = (own as unknown as { finishing: { group: RoundTripGroup<unknown, unknown> } }).finishing.group;
    await Promise.all(cmds.map((c) => own.admit(c)));
    await Promise.all(
      cmds.map((c) =>
        own.finish({
          scope: c.scope,
          key: c.key,
          entity: c.entity,
          ownerToken: c.ownerToken,
          outcome: 'completed',
          response: { status: 201, headers: [], body: new Uint8Array(0) },
          retentionMs: 60_000,
          audit: c.audit,
        }),
      ),
    );
    const a = groupOf(own).stats;
    const f = finishes.stats;
    await own.close();
    // Every round trip observed once, its size its elements: 40 decisions in far fewer statements.
    expect(sizes.length).toBe(a.roundTrips + f.roundTrips);
    expect(sizes.reduce((x, y) => x + y, 0)).toBe(40);
    expect(sizes.length).toBeLessThan(40);
    // Control: the shared store of this file was never observed, and its groups told no one.
    const before = sizes.length;
    await store.admit(fresh());
    expect(sizes.length).toBe(before);
  });

  it('the group-size observer counts what each statement committed: an element left alone counts once, in its own run', async () => {
    const [a, b] = [fresh(), fresh()];
    const held = await holdEntity(b.entity!);
    const admit = admitVia({ budgetMs: null });
    const sizes: number[] = [];
    admit.group.observer = (n) => sizes.push(n);
    const answers = Promise.all([admit(a), admit(b)]);
    await until(async () => admit.group.stats.deferred >= 1 && (await held.waiters()) >= 1, "B's re-run waiting for the row");
    await held.release();
    await answers;
    // The group decided A (1), B's run alone decided B (1): two decisions, not the group's 2 plus B's 1.
    expect(sizes).toEqual([1, 1]);
    expect(admit.group.stats).toMatchObject({ roundTrips: 2, elements: 2, deferred: 1 });
  });

  it('a lone admission is the plain fencegate_admit statement', async () => {
    const seen: string[] = [];
    const admit = admitVia({}, undefined, seen);
    await expect(admit(fresh())).resolves.toEqual({ outcome: 'forward', takeover: false });
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatch(/fencegate_admit\(\$1, /);
    expect(admit.group.stats).toMatchObject({ roundTrips: 1, grouped: 0 });
  });

  it('text the database cannot hold (U+0000, the escape character) goes through the arrays intact', async () => {
    const odd = (s: string) => `${s}\u0000\uE000"{},\\ '`;
    const c = fresh({ scope: odd('r'), key: odd(`k-${randomUUID()}`), entity: odd(`e-${randomUUID()}`) });
    const admit = admitVia();
    const [a, b] = await Promise.all([admit(c), admit(retryOf(c))]);
    expect(admit.group.stats.grouped).toBe(2);
    expect(a).toEqual({ outcome: 'forward', takeover: false });
    expect(b).toMatchObject({ outcome: 'idempotency-in-progress' });
    expect(await store.getEntity(c.entity!)).toMatchObject({ entity: c.entity, fence: '1' });
  });

  /** One group: A and B for one entity (serial), C and D for one key, E raises the fence F then G presents a lower one. */
  function sameEntityAndKey() {
    const entity = `e-${randomUUID()}`;
    const key = `k-${randomUUID()}`;
    const fenced = `e-${randomUUID()}`;
    const a = fresh({ entity });
    const b = fresh({ entity });
    const c = fresh({ key, entity: null, fence: null, mode: 'concurrent' });
    const d = { ...c, ownerToken: `o-${randomUUID()}` };
    const e = fresh({ entity: fenced, fence: 5n, mode: 'concurrent' });
    const g = fresh({ entity: fenced, fence: 3n, mode: 'concurrent' });
    return [a, b, c, d, e, g];
  }
  const inOrder = [
    { outcome: 'forward', takeover: false },
    { outcome: 'entity-busy' },
    { outcome: 'forward', takeover: false },
    { outcome: 'idempotency-in-progress' },
    { outcome: 'forward', takeover: false },
    { outcome: 'stale-fence', currentFence: 5n },
  ];

  it('elements of one entity or key are decided in arrival order: the later one sees the earlier slot, record and fence', async () => {
    const admit = admitVia({ budgetMs: null }); // no budget: a loaded box must not defer more than the lock does
    const answers = await Promise.all(sameEntityAndKey().map((c) => admit(c)));
    expect(admit.group.stats).toMatchObject({ roundTrips: 1, grouped: 6, deferred: 0 });
    expect(answers).toMatchObject(inOrder);
  });

  it('negative control: a group function that decides its elements last to first gives the other answers, and the check sees it', async () => {
    const shipped = readFileSync(join(FUNCTIONS_DIR, 'group_admit.sql'), 'utf8');
    const reversed = shipped
      .replace('FOR i IN 1 .. coalesce(array_length(p_scope, 1), 0) LOOP', 'FOR i IN REVERSE coalesce(array_length(p_scope, 1), 0) .. 1 LOOP')
      .replace('FUNCTION fencegate_admit_many(', 'FUNCTION admit_many_reversed(');
    expect(reversed).toContain('IN REVERSE');
    await schema.pool.query(reversed);
    const admit = admitVia({ budgetMs: null }, (t) => t.replace('fencegate_admit_many(', 'admit_many_reversed('));
    const answers = await Promise.all(sameEntityAndKey().map((c) => admit(c)));
    expect(admit.group.stats.grouped).toBe(6);
    expect(() => expect(answers).toMatchObject(inOrder)).toThrow();
    expect(answers.map((a) => a.outcome)).toEqual(['entity-busy', 'forward', 'idempotency-in-progress', 'forward', 'forward', 'forward']);
  });

  it('an admission that raises fails alone; the others of its group commit, its own writes (fence, slot) roll back', async () => {
    const cmds = Array.from({ length: 5 }, () => fresh({ fence: 7n }));
    const admit = admitVia();
    const settled = await Promise.allSettled(cmds.map((c, i) => admit(i === 2 ? faulty(c) : c)));
    expect(admit.group.stats.grouped).toBe(5); // they did share the statement
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'rejected', 'fulfilled', 'fulfilled']);
    const err = (settled[2] as PromiseRejectedResult).reason as Error & { code?: string };
    expect(err.message).toMatch(/out of range/);
    expect(err.code).toMatch(/^22/);
    for (const [i, c] of cmds.entries()) {
      expect(await stateOf(c)).toEqual(i === 2 ? { record: null, fence: null, slot: null } : { record: 'in_progress', fence: '7', slot: c.ownerToken });
    }
    // Alone, it fails as it always did; and the same command without the fault is admitted.
    await expect(admit(faulty(cmds[2]!))).rejects.toThrow(/out of range/);
    await expect(admit(cmds[2]!)).resolves.toEqual({ outcome: 'forward', takeover: false });
  });

  it('negative control: without the subtransaction per element, one fault fails its whole group and the check sees it', async () => {
    const shipped = readFileSync(join(FUNCTIONS_DIR, 'group_admit.sql'), 'utf8');
    const unguarded = shipped
      .replace(/EXCEPTION\s+WHEN lock_not_available[\s\S]*?END;/, 'END;')
      .replace('FUNCTION fencegate_admit_many(', 'FUNCTION admit_many_unguarded(');
    expect(unguarded).not.toContain('WHEN OTHERS');
    await schema.pool.query(unguarded);
    const admit = admitVia({ budgetMs: null }, (t) => t.replace('fencegate_admit_many(', 'admit_many_unguarded('));
    const cmds = Array.from({ length: 5 }, () => fresh({ fence: 7n }));
    const settled = await Promise.allSettled(cmds.map((c, i) => admit(i === 2 ? faulty(c) : c)));
    expect(admit.group.stats.grouped).toBe(5);
    expect(settled.every((s) => s.status === 'rejected')).toBe(true);
    for (const c of cmds) expect(await stateOf(c)).toEqual({ record: null, fence: null, slot: null });
  });

  it("a refusal's rejection row is in its element's subtransaction: committed with the group, rolled back with its element", async () => {
    // fencegate_admit, then a fault after it decided (and logged): a test-only wrapper.
    const shipped = readFileSync(join(FUNCTIONS_DIR, 'group_admit.sql'), 'utf8');
    await schema.pool.query(`CREATE OR REPLACE FUNCTION admit_then_fail(
        p_scope text, p_key text, p_entity text, p_fence bigint, p_fingerprint text,
        p_serial boolean, p_owner text, p_lock_ms bigint, p_retention_ms bigint, p_retry_unknown boolean,
        p_caller text, p_method text, p_path text, p_payload_sha256 text, p_request_id text,
        p_client_request_id text, p_log_entity text, p_log_key text, p_tool text,
        OUT outcome text, OUT current_fence bigint, OUT retry_after_ms bigint, OUT takeover boolean,
        OUT status integer, OUT headers jsonb, OUT body bytea)
      LANGUAGE plpgsql AS $$
      BEGIN
        SELECT * INTO outcome, current_fence, retry_after_ms, takeover, status, headers, body
          FROM fencegate_admit(p_scope, p_key, p_entity, p_fence, p_fingerprint, p_serial, p_owner, p_lock_ms, p_retention_ms,
            p_retry_unknown, p_caller, p_method, p_path, p_payload_sha256, p_request_id, p_client_request_id, p_log_entity, p_log_key, p_tool);
        IF p_request_id LIKE 'boom-%' THEN RAISE EXCEPTION 'a fault after the decision'; END IF;
      END $$`);
    const wrapped = shipped.replace('FROM fencegate_admit(', 'FROM admit_then_fail(').replace('FUNCTION fencegate_admit_many(', 'FUNCTION admit_many_boom(');
    await schema.pool.query(wrapped);
    const admit = admitVia({ budgetMs: null }, (t) => t.replace('fencegate_admit_many(', 'admit_many_boom('));
    const entity = `e-${randomUUID()}`;
    await expect(admit(fresh({ entity, fence: 9n }))).resolves.toMatchObject({ outcome: 'forward' });
    const kept = fresh({ entity, fence: 2n, audit: { ...fresh().audit, requestId: `kept-${randomUUID()}` } });
    const boom = fresh({ entity, fence: 3n, audit: { ...fresh().audit, requestId: `boom-${randomUUID()}` } });
    const settled = await Promise.allSettled([admit(kept), admit(boom)]);
    expect(admit.group.stats.grouped).toBe(2);
    expect(settled[0]).toEqual({ status: 'fulfilled', value: { outcome: 'stale-fence', currentFence: 9n } });
    expect(settled[1]).toMatchObject({ status: 'rejected', reason: { message: 'a fault after the decision' } });
    expect(await rejectionsOf(kept.audit.requestId)).toEqual(['stale-fence']);
    expect(await rejectionsOf(boom.audit.requestId)).toEqual([]);
  });

  it("clock: an element that meets another session's row lock is left to run alone; the others commit at once, their locks whole", async () => {
    // A lock far longer than the test: the retry below must meet it still
    // held however long a loaded box takes to get there (the control shows
    // what a spent one looks like).
    const a = fresh({ lockMs: 10_000 });
    const b = fresh();
    const held = await holdEntity(b.entity!);
    const admit = admitVia({ budgetMs: null }); // no budget: a loaded box must not defer more than the lock does
    let bAnswered = false;
    const answers = [admit(a), admit(b).finally(() => (bAnswered = true))];
    try {
      // A is answered while B's entity is still held elsewhere: A's group did not wait for it.
      await expect(answers[0]).resolves.toEqual({ outcome: 'forward', takeover: false });
      expect(bAnswered).toBe(false);
      expect(admit.group.stats).toMatchObject({ grouped: 2, deferred: 1 });
      expect(await stateOf(a)).toMatchObject({ record: 'in_progress', slot: a.ownerToken });
      // A's record lock is live: a retry is told to wait, not taken over as outcome-unknown.
      await expect(store.admit(retryOf(a))).resolves.toMatchObject({ outcome: 'idempotency-in-progress' });
    } finally {
      await held.release();
    }
    // B ran alone once the row was free, through the plain statement.
    await expect(answers[1]).resolves.toEqual({ outcome: 'forward', takeover: false });
    expect(await stateOf(b)).toMatchObject({ record: 'in_progress', slot: b.ownerToken });
  });

  it('negative control: a group that waits for the row lock commits A with its lock already spent (G3)', async () => {
    const a = fresh({ lockMs: 1_000 });
    const b = fresh();
    const held = await holdEntity(b.entity!);
    const admit = admitVia({ lockTimeoutMs: 0, budgetMs: null });
    let aAnswered = false;
    const answers = Promise.all([admit(a).finally(() => (aAnswered = true)), admit(b)]);
    try {
      await sleep(1_500); // longer than A's 1 s lock
      expect(aAnswered).toBe(false); // A waits for B's row lock, in B's group
    } finally {
      await held.release();
    }
    expect(await answers).toEqual([
      { outcome: 'forward', takeover: false },
      { outcome: 'forward', takeover: false },
    ]);
    expect(admit.group.stats).toMatchObject({ grouped: 2, deferred: 0 });
    // A's lock had expired when it committed: its retry finds the request's outcome unknown.
    await expect(store.admit(retryOf(a))).resolves.toEqual({ outcome: 'outcome-unknown' });
  });

  it('an element after the group spent its time budget runs alone; those of one entity still in arrival order', async () => {
    const admit = admitVia({ budgetMs: 0 });
    const [a, b] = [fresh(), fresh()];
    const b2 = { ...fresh(), entity: b.entity };
    const answers = await Promise.all([a, b, b2].map((c) => admit(c)));
    expect(admit.group.stats).toMatchObject({ grouped: 3, deferred: 3 });
    expect(answers).toMatchObject([{ outcome: 'forward' }, { outcome: 'forward' }, { outcome: 'entity-busy' }]);
  });

  /**
   * B's key is being inserted by another session (not committed): B waits
   * for it at its record insert, after it took its entity's slot, and is left
   * alone, which rolls its slot back. B2, of the same entity and another key,
   * comes next in the group and would find the entity free.
   */
  async function aloneThenSameEntity(admit: ReturnType<typeof admitVia>) {
    const b = fresh();
    const b2 = { ...fresh(), entity: b.entity };
    const other = await otherSession(schema);
    try {
      await other.client.query(
        `INSERT INTO idempotency_records (scope, key, fingerprint, entity, fence, state, owner_token, locked_until, created_at, expires_at)
         VALUES ($1, $2, 'other', NULL, NULL, 'in_progress', 'other', now() + interval '1 minute', now(), now() + interval '1 hour')`,
        [b.scope, b.key],
      );
      let bDone = false;
      const answers = Promise.all([admit(b).finally(() => (bDone = true)), admit(b2)]);
      // The group has left B alone, and B's statement alone waits for the
      // insert (or, without the order rule, was already told entity-busy).
      await until(
        async () => admit.group.stats.deferred >= 1 && (bDone || (await other.waiters()) >= 1),
        "B's re-run waiting for the other insert, or answered",
      );
      await other.client.query('ROLLBACK'); // the other insert was a fault: B's key is free again
      return await answers;
    } finally {
      await other.client.end();
    }
  }

  it("once an entity's element is left alone, a later one of that entity is too: decided after it, in arrival order", async () => {
    const admit = admitVia({ budgetMs: null }); // no budget: a loaded box must not defer more than the lock does
    expect(await aloneThenSameEntity(admit)).toMatchObject([{ outcome: 'forward' }, { outcome: 'entity-busy' }]);
    expect(admit.group.stats).toMatchObject({ grouped: 2, deferred: 2 });
  });

  it('negative control: without that rule, the later one is decided in the group, before the earlier one', async () => {
    const shipped = readFileSync(join(FUNCTIONS_DIR, 'group_admit.sql'), 'utf8');
    const unordered = shipped
      .replace('OR p_entity[i] = ANY (v_entities) OR v_tag = ANY (v_keys)', '')
      .replace('FUNCTION fencegate_admit_many(', 'FUNCTION admit_many_unordered(');
    expect(unordered).not.toContain('= ANY (v_entities)');
    await schema.pool.query(unordered);
    const admit = admitVia({ budgetMs: null }, (t) => t.replace('fencegate_admit_many(', 'admit_many_unordered('));
    expect(await aloneThenSameEntity(admit)).toMatchObject([{ outcome: 'entity-busy' }, { outcome: 'forward' }]);
    expect(admit.group.stats).toMatchObject({ grouped: 2, deferred: 1 });
  });
});

describe.skipIf(!POSTGRES_URL)('PostgreSQL admission group: close', () => {
  beforeAll(async () => {
    schema = await createTestSchema('fg_agroup_c');
    store = await createPostgresStore({ connectionString: schema.url, poolSize: 4 });
  });
  afterAll(async () => {
    await store?.close();
    await schema?.drop();
  });

  /**
   * Two admissions in one group, the second meeting a held row: it runs
   * alone while close() is called. On the caller's pool, which close() does
   * not end (ending the store's own pool would wait for the query anyway).
   */
  async function closeWhileAlone(drain: boolean) {
    const s = await createPostgresStore({ pool: schema.pool, migrate: false, listen: false });
    if (!drain) groupOf(s).idle = () => Promise.resolve();
    const [a, b] = [fresh(), fresh()];
    const held = await holdEntity(b.entity!);
    const events: string[] = [];
    const answers = [s.admit(a), s.admit(b)].map((p, i) =>
      p.then(
        (x) => (events.push(`answer ${i}`), x),
        (e: Error) => (events.push(`fail ${i}`), e),
      ),
    );
    await answers[0];
    await until(async () => groupOf(s).stats.deferred >= 1 && (await held.waiters()) >= 1, "B's statement alone out, waiting for the row");
    const closed = s.close().then(() => events.push('closed'));
    if (drain) {
      // A close() that did not wait for B would be done within this window
      // (the control's close is); this one must still be waiting at its end.
      await sleep(200);
    } else {
      // The control's point is a close that does not wait for B: let it
      // finish, however slow the box, before B's row is freed.
      await Promise.race([closed, sleep(10_000)]);
    }
    await held.release();
    await closed;
    await Promise.all(answers);
    return { events, b: await answers[1] };
  }

  it('close() waits for the admissions left to run alone: answered before the store closed', async () => {
    const { events, b } = await closeWhileAlone(true);
    expect(events).toEqual(['answer 0', 'answer 1', 'closed']);
    expect(b).toEqual({ outcome: 'forward', takeover: false });
  });

  it('negative control: a close() that does not wait for the group closes first', async () => {
    const { events } = await closeWhileAlone(false);
    expect(events.indexOf('closed')).toBeLessThan(events.findIndex((e) => e.endsWith(' 1')));
  });
});
