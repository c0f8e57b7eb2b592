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
const fresh = (over: Partial<AdmitInput> = {}) => admitInput({ key: `k-${randomUUID()}`, entity: `e-${randomUUID()}`, ownerToken: `o-${randomUUID()}`, ...over });
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
    expect(replay).toMatchObject({ outcome: 'replay', response: { status: 201, headers: [['content-type', 'application/json']], body: new Uint8Array([7, 0, 9]) } });
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

  it('negative control: without the subtransaction per element, one fault fails its whole group and the check sees it', async () => {
    // The shipped function with its EXCEPTION clause cut out, under another name.
    const shipped = readFileSync(join(FUNCTIONS_DIR, 'group_finish.sql'), 'utf8');
    const unguarded = shipped.replace(/EXCEPTION WHEN OTHERS THEN[\s\S]*?END;/, 'END;').replace('FUNCTION fencegate_finish_many(', 'FUNCTION finish_many_unguarded(');
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
