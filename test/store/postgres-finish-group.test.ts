import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createFinish } from '../../src/store/postgres/finish.js';
import type { RoundTripGroup } from '../../src/store/postgres/finish-group.js';
import { FUNCTIONS_DIR } from '../../src/store/postgres/functions.js';
import { createPostgresStore, type PostgresGatewayStore } from '../../src/store/postgres/index.js';
import { poolQuery, qualifier, type PgContext } from '../../src/store/postgres/query.js';
import { entityTopic, recordTopic, type AdmitInput, type FinishInput } from '../../src/store/types.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { admitInput } from './helpers/inputs.js';

/**
 * Group commit of the PostgreSQL finish (DESIGN §8): what is specific to
 * grouping. The whole store contract runs against the grouped finish in
 * postgres.test.ts (conformance) and test/replicas.
 */
let schema: TestSchema;
let store: PostgresGatewayStore;
let replica: PostgresGatewayStore;

const groupOf = (s: PostgresGatewayStore) => (s as unknown as { finishing: { group: RoundTripGroup<FinishInput, boolean> } }).finishing.group;
const fresh = (over: Partial<AdmitInput> = {}) =>
  admitInput({ key: `k-${randomUUID()}`, entity: `e-${randomUUID()}`, ownerToken: `o-${randomUUID()}`, ...over });
const completed = (c: AdmitInput, over: Partial<FinishInput> = {}): FinishInput =>
  ({
    scope: c.scope,
    key: c.key,
    entity: c.entity,
    ownerToken: c.ownerToken,
    audit: c.audit,
    outcome: 'completed',
    response: { status: 201, headers: [['content-type', 'application/json']], body: new Uint8Array([7, 0, 9]) },
    retentionMs: c.retentionMs,
    ...over,
  }) as FinishInput;
/** A finish that fencegate_finish refuses by raising, after it freed the entity's slot (finish.sql). */
const faulty = (c: AdmitInput): FinishInput => ({ ...completed(c), outcome: 'bogus' }) as unknown as FinishInput;

async function admitted(n: number): Promise<AdmitInput[]> {
  const cmds = Array.from({ length: n }, () => fresh());
  const answers = await Promise.all(cmds.map((c) => store.admit(c)));
  expect(answers.every((a) => a.outcome === 'forward')).toBe(true);
  return cmds;
}

async function stateOf(c: AdmitInput) {
  const rec = await schema.pool.query<{ state: string }>('SELECT state FROM idempotency_records WHERE scope = $1 AND key = $2', [c.scope, c.key]);
  const ent = await schema.pool.query<{ inflight_owner: string | null }>('SELECT inflight_owner FROM fence_entities WHERE entity = $1', [c.entity]);
  return { record: rec.rows[0]?.state ?? null, slot: ent.rows[0]?.inflight_owner ?? null };
}

describe.skipIf(!POSTGRES_URL)('PostgreSQL finish group commit', () => {
  beforeAll(async () => {
    schema = await createTestSchema('fg_fgroup');
    store = await createPostgresStore({ connectionString: schema.url, poolSize: 8 });
    // Polling once a minute: only a NOTIFY can wake this replica's waiters in time.
    replica = await createPostgresStore({ connectionString: schema.url, poolSize: 4, pollMs: 60_000, migrate: false });
  });
  afterAll(async () => {
    await store?.close();
    await replica?.close();
    await schema?.drop();
  });

  it('finishes that arrive together go as one statement; each caller hears after the commit', async () => {
    const cmds = await admitted(30);
    const before = { ...groupOf(store).stats };
    const results = await Promise.all(cmds.map((c) => store.finish(completed(c))));
    expect(results.every((r) => r.recorded)).toBe(true);
    const g = groupOf(store).stats;
    expect(g.elements - before.elements).toBe(30);
    expect(g.roundTrips - before.roundTrips).toBeLessThanOrEqual(2); // not 30 round trips and commits
    expect(g.grouped - before.grouped).toBeGreaterThanOrEqual(29);
    // Answered after COMMIT: another connection sees every one settled.
    for (const c of cmds) expect(await stateOf(c)).toEqual({ record: 'completed', slot: null });
    // The stored answer went through the arrays intact (bytea with a 0 byte, headers).
    const replay = await store.admit({ ...cmds[0]!, ownerToken: `o-${randomUUID()}` });
    expect(replay).toMatchObject({
      outcome: 'replay',
      response: { status: 201, headers: [['content-type', 'application/json']], body: new Uint8Array([7, 0, 9]) },
    });
  });

  it('a lone finish takes the one-element statement', async () => {
    const [c] = await admitted(1);
    const before = { ...groupOf(store).stats };
    await expect(store.finish(completed(c!))).resolves.toEqual({ recorded: true });
    expect(groupOf(store).stats.roundTrips - before.roundTrips).toBe(1);
    expect(groupOf(store).stats.grouped).toBe(before.grouped);
  });

  it('a finish that throws fails alone; the others of its group commit, its own writes roll back', async () => {
    const cmds = await admitted(5);
    const before = { ...groupOf(store).stats };
    const calls = cmds.map((c, i) => store.finish(i === 2 ? faulty(c) : completed(c)));
    const settled = await Promise.allSettled(calls);
    expect(groupOf(store).stats.grouped - before.grouped).toBe(5); // they did share the statement
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'rejected', 'fulfilled', 'fulfilled']);
    const err = (settled[2] as PromiseRejectedResult).reason as Error & { code?: string };
    expect(err.message).toMatch(/unknown outcome bogus/);
    expect(err.code).toBe('P0001');
    for (const [i, c] of cmds.entries()) {
      // The faulty one had freed its entity's slot before raising: rolled back with it.
      expect(await stateOf(c)).toEqual(i === 2 ? { record: 'in_progress', slot: c.ownerToken } : { record: 'completed', slot: null });
    }
    // Its owner can still finish it properly.
    await expect(store.finish(completed(cmds[2]!))).resolves.toEqual({ recorded: true });
  });

  it('command-log rows ride on the group: one per committed element, none for the element that failed (DESIGN §4.1 commands)', async () => {
    const cmds = await admitted(5);
    const withRow = (f: FinishInput, c: AdmitInput): FinishInput => ({
      ...f,
      command: {
        route: 'payments',
        scope: c.scope,
        entity: c.entity,
        fence: c.fence,
        idempotencyKey: c.key,
        outcome: 'completed',
        decision: 'forwarded',
        status: 201,
        upstreamMs: 3,
        audit: c.audit,
      },
    });
    const before = { ...groupOf(store).stats };
    const settled = await Promise.allSettled(cmds.map((c, i) => store.finish(withRow(i === 2 ? faulty(c) : completed(c), c))));
    expect(groupOf(store).stats.grouped - before.grouped).toBe(5);
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'rejected', 'fulfilled', 'fulfilled']);
    const rows = async (c: AdmitInput) => (await store.listCommands({ key: c.key!, limit: 10 })).items.map((r) => [r.outcome, r.status, r.requestId]);
    for (const [i, c] of cmds.entries()) expect(await rows(c)).toEqual(i === 2 ? [] : [['completed', 201, c.audit.requestId]]);
    // The failed element's owner finishes it alone: its row comes with that finish.
    await store.finish(withRow(completed(cmds[2]!), cmds[2]!));
    expect(await rows(cmds[2]!)).toEqual([['completed', 201, cmds[2]!.audit.requestId]]);
  });

  it('a schema without the commands table (a replica started before the migration) still finishes, alone and grouped; only the rows are missing', async () => {
    const s = await createTestSchema('fg_fgroup_nocmd');
    const st = await createPostgresStore({ connectionString: s.url, poolSize: 4 });
    try {
      await s.pool.query('DROP TABLE commands');
      const cmds = Array.from({ length: 4 }, () => fresh());
      for (const c of cmds) expect((await st.admit(c)).outcome).toBe('forward');
      const row = (c: AdmitInput): FinishInput => ({
        ...completed(c),
        command: {
          route: 'payments',
          scope: c.scope,
          entity: c.entity,
          fence: c.fence,
          idempotencyKey: c.key,
          outcome: 'completed',
          decision: 'forwarded',
          status: 201,
          upstreamMs: 1,
          audit: c.audit,
        },
      });
      await expect(st.finish(row(cmds[0]!))).resolves.toEqual({ recorded: true });
      const rest = await Promise.all(cmds.slice(1).map((c) => st.finish(row(c))));
      expect(rest.every((r) => r.recorded)).toBe(true);
      for (const c of cmds) {
        const rec = await s.pool.query<{ state: string }>('SELECT state FROM idempotency_records WHERE key = $1', [c.key]);
        expect(rec.rows[0]?.state).toBe('completed');
      }
    } finally {
      await st.close();
      await s.drop();
    }
  });

  it('negative control: without the subtransaction per element, one fault fails its whole group and the check sees it', async () => {
    // The shipped function with its EXCEPTION clause cut out, under another name.
    const shipped = readFileSync(join(FUNCTIONS_DIR, 'group_finish.sql'), 'utf8');
    const unguarded = shipped
      .replace(/EXCEPTION WHEN OTHERS THEN[\s\S]*?END;/, 'END;')
      .replace('FUNCTION fencegate_finish_many(', 'FUNCTION finish_many_unguarded(');
    expect(unguarded).not.toContain('WHEN OTHERS');
    await schema.pool.query(unguarded);
    const base = poolQuery(schema.pool as never, () => false);
    const ctx: PgContext = {
      query: (text, values, prepared) => base(text.replace('fencegate_finish_many(', 'finish_many_unguarded('), values, prepared),
      table: qualifier(null),
    };
    const finish = createFinish(ctx, { notifyChannel: null, notify: () => {} });
    const cmds = await admitted(5);
    const settled = await Promise.allSettled(cmds.map((c, i) => finish(i === 2 ? faulty(c) : completed(c))));
    expect(finish.group.stats.grouped).toBe(5);
    expect(settled.every((s) => s.status === 'rejected')).toBe(true);
    for (const c of cmds) expect(await stateOf(c)).toEqual({ record: 'in_progress', slot: c.ownerToken });
  });

  it('an element chosen as a deadlock victim (only a group holds rows of several finishes) runs again alone and succeeds', async () => {
    const [a, b] = await admitted(2);
    const deadlocks = async () =>
      Number((await schema.pool.query<{ n: string }>('SELECT deadlocks AS n FROM pg_stat_database WHERE datname = current_database()')).rows[0]!.n);
    const before = await deadlocks();
    const other = await schema.pool.connect();
    try {
      // Another transaction holds b's entity row and will want a's record:
      // the group locks a's rows, then waits for b's entity; the cycle closes.
      await other.query('BEGIN');
      await other.query('SELECT 1 FROM fence_entities WHERE entity = $1 FOR UPDATE', [b!.entity]);
      const finishes = Promise.all([store.finish(completed(a!)), store.finish(completed(b!))]);
      await new Promise((r) => setTimeout(r, 200));
      // The group's element for b waits first, so its deadlock check (after
      // deadlock_timeout, 1 s) finds the cycle and aborts it; a's commits.
      await other.query('SELECT 1 FROM idempotency_records WHERE scope = $1 AND key = $2 FOR UPDATE', [a!.scope, a!.key]);
      await other.query('COMMIT');
      expect(await finishes).toEqual([{ recorded: true }, { recorded: true }]);
    } finally {
      other.release();
    }
    expect(await deadlocks()).toBeGreaterThan(before);
    expect(await stateOf(b!)).toEqual({ record: 'completed', slot: null });
  });

  it('wakes every entity and record of a group: local waiters at once, the other replica by NOTIFY', async () => {
    expect(replica.listening).toBe(true);
    const cmds = await admitted(3);
    const topics = cmds.flatMap((c) => [entityTopic(c.entity!), recordTopic(c.scope, c.key!)]);
    const woken = (s: PostgresGatewayStore) => topics.map((t) => s.waitForChange(t, 20_000).then(() => performance.now()));
    const remote = woken(replica);
    const local = woken(store);
    // An unrelated topic: must not be woken by the group (the waits are real).
    const unrelated = replica.waitForChange(entityTopic(`e-${randomUUID()}`), 1_500).then(() => performance.now());
    const before = { ...groupOf(store).stats };
    const t0 = performance.now();
    await Promise.all(cmds.map((c) => store.finish(completed(c))));
    expect(groupOf(store).stats.grouped - before.grouped).toBe(3);
    for (const at of await Promise.all([...remote, ...local])) expect(at - t0).toBeLessThan(5_000);
    expect((await unrelated) - t0).toBeGreaterThan(1_000);
  });
});

/**
 * A group's bounds and its fall-backs: by bytes (a group's bodies go as one
 * hex text literal, which past V8's longest string fails every element), a
 * group the driver could not send goes again one by one, and close() drains
 * the finishes already queued.
 */
describe.skipIf(!POSTGRES_URL)('PostgreSQL finish group: bytes, unsent groups, close', () => {
  beforeAll(async () => {
    schema = await createTestSchema('fg_fgroup_b');
    store = await createPostgresStore({ connectionString: schema.url, poolSize: 8 });
  });
  afterAll(async () => {
    await store?.close();
    await schema?.drop();
  });

  const KiB = 1024;
  const isMany = (text: string) => text.includes('fencegate_finish_many(');
  /**
   * The schema's pool as a store context. `limitChars` scales V8's longest
   * string down for the test: a grouped statement whose bodies would make a
   * longer hex literal fails as node-postgres does, with a RangeError thrown
   * before anything is sent. `failMany` makes the next grouped statements
   * fail with the given error, before sending.
   */
  function context(o: { limitChars?: number; failMany?: () => Error | null } = {}): PgContext {
    const base = poolQuery(schema.pool as never, () => false);
    return {
      query: async (text, values, prepared) => {
        if (isMany(text)) {
          const bodies = values[7] as (Uint8Array | null)[];
          const chars = bodies.reduce((n, b) => n + (b === null ? 4 : 4 + 2 * b.byteLength), 2);
          if (o.limitChars !== undefined && chars > o.limitChars) throw new RangeError('Invalid string length');
          const err = o.failMany?.();
          if (err) throw err;
        }
        return base(text, values, prepared);
      },
      table: qualifier(null),
    };
  }
  const noWakeups = { notifyChannel: null, notify: () => {} };
  const withBody = (c: AdmitInput, bytes: number, fill: number) =>
    completed(c, { response: { status: 200, headers: [], body: new Uint8Array(bytes).fill(fill) } } as Partial<FinishInput>);
  /** Three 100 KiB answers and one tiny one, finished in one burst. */
  async function burst(finish: ReturnType<typeof createFinish>) {
    const cmds = await admitted(4);
    const inputs = cmds.map((c, i) => withBody(c, i < 3 ? 100 * KiB : 1, i + 1));
    const settled = await Promise.allSettled(inputs.map((f) => finish(f)));
    return { cmds, settled, states: await Promise.all(cmds.map(stateOf)) };
  }
  // 250 Ki characters: one 100 KiB body (200 Ki hex) fits, two do not.
  const limitChars = 250 * KiB;

  it('three large answers and a tiny one in one burst: each large one goes alone, all are recorded', async () => {
    const finish = createFinish(context({ limitChars }), noWakeups, { maxGroupBytes: 64 * KiB, aloneAboveBytes: 16 * KiB });
    const { cmds, settled, states } = await burst(finish);
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled', 'fulfilled']);
    expect(states.every((s) => s.record === 'completed' && s.slot === null)).toBe(true);
    expect(finish.group.stats).toMatchObject({ roundTrips: 4, elements: 4, grouped: 0, rerunAlone: 0 });
    // The body went through the one-element statement (binary) intact.
    const replay = await store.admit({ ...cmds[1]!, ownerToken: `o-${randomUUID()}` });
    expect(replay).toMatchObject({ outcome: 'replay', response: { body: new Uint8Array(100 * KiB).fill(2) } });
  });

  it('small answers still group, up to the byte cap', async () => {
    const finish = createFinish(context({ limitChars }), noWakeups, { maxGroupBytes: 64 * KiB, aloneAboveBytes: 16 * KiB });
    const cmds = await admitted(12);
    const results = await Promise.all(cmds.map((c) => finish(withBody(c, 10 * KiB, 3))));
    expect(results.every((r) => r.recorded)).toBe(true);
    // 10 KiB each, 64 KiB a group: at most 6 together, so at least 2 round trips; not 12.
    const g = finish.group.stats;
    expect(g.largest).toBeLessThanOrEqual(6);
    expect(g.largest).toBeGreaterThan(1);
    expect(g.roundTrips).toBeGreaterThanOrEqual(2);
    expect(g.roundTrips).toBeLessThan(12);
  });

  it('negative control: without the byte cap they share one statement, which fails them all, the tiny one too', async () => {
    const finish = createFinish(context({ limitChars }), noWakeups, { maxGroupBytes: Infinity, aloneAboveBytes: Infinity, unsent: () => false });
    const { settled, states } = await burst(finish);
    expect(finish.group.stats).toMatchObject({ roundTrips: 1, grouped: 4 });
    expect(settled.every((s) => s.status === 'rejected' && s.reason instanceof RangeError)).toBe(true);
    for (const s of states) expect(s.record).toBe('in_progress');
  });

  it('without the byte cap, the unsent group goes again one by one and all are recorded', async () => {
    const finish = createFinish(context({ limitChars }), noWakeups, { maxGroupBytes: Infinity, aloneAboveBytes: Infinity });
    const { settled, states } = await burst(finish);
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled', 'fulfilled']);
    expect(states.every((s) => s.record === 'completed')).toBe(true);
    expect(finish.group.stats).toMatchObject({ roundTrips: 5, grouped: 4, rerunAlone: 4 });
  });

  it('a group that fails before it is sent re-runs its elements one by one; a connection error does not', async () => {
    let next: Error | null = null;
    const once = () => ((e) => ((next = null), e))(next);
    const finish = createFinish(context({ failMany: once }), noWakeups);
    next = new TypeError('cannot serialise');
    let cmds = await admitted(5);
    let settled = await Promise.allSettled(cmds.map((c) => finish(completed(c))));
    expect(settled.every((s) => s.status === 'fulfilled')).toBe(true);
    for (const c of cmds) expect(await stateOf(c)).toEqual({ record: 'completed', slot: null });
    expect(finish.group.stats).toMatchObject({ roundTrips: 6, grouped: 5, rerunAlone: 5 });
    // A connection lost may have taken the group's COMMIT with it: its callers hear it, nothing runs again.
    next = new Error('Connection terminated unexpectedly');
    cmds = await admitted(3);
    settled = await Promise.allSettled(cmds.map((c) => finish(completed(c))));
    expect(settled.every((s) => s.status === 'rejected' && /Connection terminated/.test(String(s.reason)))).toBe(true);
    expect(finish.group.stats.rerunAlone).toBe(5);
  });

  it('negative control: without the re-run, a group that failed before it was sent fails every element', async () => {
    let next: Error | null = new TypeError('cannot serialise');
    const once = () => ((e) => ((next = null), e))(next);
    const finish = createFinish(context({ failMany: once }), noWakeups, { unsent: () => false });
    const cmds = await admitted(5);
    const settled = await Promise.allSettled(cmds.map((c) => finish(completed(c))));
    expect(settled.every((s) => s.status === 'rejected')).toBe(true);
    for (const c of cmds) expect(await stateOf(c)).toEqual({ record: 'in_progress', slot: c.ownerToken });
  });

  /** Three finishes queued in one turn, then close() in the same turn. */
  async function closeWithQueued(drain: boolean) {
    const s = await createPostgresStore({ connectionString: schema.url, poolSize: 4, migrate: false });
    if (!drain) groupOf(s).idle = () => Promise.resolve();
    const cmds = await Promise.all([fresh(), fresh(), fresh()].map(async (c) => (await s.admit(c), c)));
    const answers = Promise.allSettled(cmds.map((c) => s.finish(completed(c))));
    await s.close();
    return { cmds, settled: await answers, after: await s.finish(completed(cmds[0]!)).catch((e: Error) => e) };
  }

  it('close() lets the finishes already queued go out: all three recorded; a later finish is refused', async () => {
    const { cmds, settled, after } = await closeWithQueued(true);
    expect(settled).toEqual(Array(3).fill({ status: 'fulfilled', value: { recorded: true } }));
    for (const c of cmds) expect(await stateOf(c)).toEqual({ record: 'completed', slot: null });
    expect(String(after)).toMatch(/closed/);
  });

  it('negative control: a close() that does not wait for the group refuses them', async () => {
    const { cmds, settled } = await closeWithQueued(false);
    expect(settled.every((s) => s.status === 'rejected' && /closed/.test(String(s.reason)))).toBe(true);
    for (const c of cmds) expect(await stateOf(c)).toEqual({ record: 'in_progress', slot: c.ownerToken });
  });
});
