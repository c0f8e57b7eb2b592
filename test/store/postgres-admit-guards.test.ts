import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAdmit } from '../../src/store/postgres/admit.js';
import { FUNCTIONS_DIR } from '../../src/store/postgres/functions.js';
import { createPostgresStore, type PostgresGatewayStore } from '../../src/store/postgres/index.js';
import { poolQuery, qualifier, type PgContext } from '../../src/store/postgres/query.js';
import type { Admission, AdmitInput } from '../../src/store/types.js';
import { createTestSchema, holdEntity as holdRow, rejectionReasons, POSTGRES_URL, until, type TestSchema } from '../helpers/postgres.js';
import { admitInput } from '../store/helpers/inputs.js';

/**
 * The grouped admission's guards (DESIGN §8.2): the group's lock_timeout
 * stays in its transaction, a group whose COMMIT fails answers no caller
 * "forward", and a deferred refusal is logged once (G5).
 */
let schema: TestSchema;
let one: TestSchema; // a pool of ONE connection: every statement runs on the same backend
let store: PostgresGatewayStore;

const fresh = (over: Partial<AdmitInput> = {}) =>
  admitInput({
    key: `k-${randomUUID()}`,
    entity: `e-${randomUUID()}`,
    ownerToken: `o-${randomUUID()}`,
    audit: { ...admitInput().audit, requestId: `r-${randomUUID()}` },
    ...over,
  });

function ctxOf(pool: pg.Pool, rewrite: (t: string) => string = (t) => t): PgContext {
  const base = poolQuery(pool as never, () => false);
  return { query: (text, values, prepared) => base(rewrite(text), values, prepared), table: qualifier(null) };
}
const recordOf = async (c: AdmitInput) =>
  (await schema.pool.query<{ state: string }>('SELECT state FROM idempotency_records WHERE scope = $1 AND key = $2', [c.scope, c.key])).rows[0]?.state ?? null;
const rejectionsOf = (requestId: string) => rejectionReasons(schema, requestId);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const holdEntity = (entity: string) => holdRow(schema, entity);

describe.skipIf(!POSTGRES_URL)('grouped admission guards', () => {
  beforeAll(async () => {
    schema = await createTestSchema('fg_rv_guard');
    store = await createPostgresStore({ connectionString: schema.url, poolSize: 4 });
    const u = new URL(schema.url);
    one = { ...schema, pool: new pg.Pool({ connectionString: u.toString(), max: 1 }) };
    // A constraint trigger checked at COMMIT: a record whose owner starts with "boom" fails the commit.
    await schema.pool.query(`CREATE FUNCTION boom_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN IF NEW.owner_token LIKE 'boom%' THEN RAISE EXCEPTION 'commit refused'; END IF; RETURN NULL; END $$`);
    await schema.pool.query(`CREATE CONSTRAINT TRIGGER boom_at_commit AFTER INSERT ON idempotency_records
      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION boom_at_commit()`);
  });
  afterAll(async () => {
    await one?.pool.end();
    await store?.close();
    await schema?.drop();
  });

  /** A group on the one-connection pool, then what lock_timeout that backend has for its next statement. */
  async function lockTimeoutAfterGroup(rewrite?: (t: string) => string, failing = false) {
    const admit = createAdmit(ctxOf(one.pool, rewrite));
    const cmds = [fresh(), failing ? fresh({ ownerToken: `boom-${randomUUID()}` }) : fresh(), fresh()];
    const settled = await Promise.allSettled(cmds.map((c) => admit(c)));
    expect(admit.group.stats.grouped).toBe(3);
    const { rows } = await one.pool.query<{ lock_timeout: string }>('SHOW lock_timeout');
    return { settled, lockTimeout: rows[0]!.lock_timeout };
  }

  it("the group's 5 ms lock_timeout does not stay on the pooled connection, after a commit or after a failed one", async () => {
    expect((await lockTimeoutAfterGroup()).lockTimeout).toBe('0');
    const failed = await lockTimeoutAfterGroup(undefined, true);
    expect(failed.settled.every((s) => s.status === 'rejected')).toBe(true);
    expect(failed.lockTimeout).toBe('0');
    // And a plain admission on that backend still waits for a row lock as long as it must (not 5 ms).
    const c = fresh();
    const held = await holdEntity(c.entity!);
    const admitted = createAdmit(ctxOf(one.pool))(c);
    await sleep(100);
    await held.release();
    await expect(admitted).resolves.toEqual({ outcome: 'forward', takeover: false });
  });

  it('negative control: a session-wide set_config leaks 5ms to the next statement, and the check sees it', async () => {
    const shipped = readFileSync(join(FUNCTIONS_DIR, 'group_admit.sql'), 'utf8');
    const leaky = shipped
      .replace(
        "PERFORM set_config('lock_timeout', coalesce(p_lock_timeout_ms, 0) || 'ms', true);",
        "PERFORM set_config('lock_timeout', coalesce(p_lock_timeout_ms, 0) || 'ms', false);",
      )
      .replace("PERFORM set_config('lock_timeout', v_prior, true);", '')
      .replace('FUNCTION fencegate_admit_many(', 'FUNCTION admit_many_leaky(');
    expect(leaky).toContain("'ms', false)");
    await schema.pool.query(leaky);
    const r = await lockTimeoutAfterGroup((t) => t.replace('fencegate_admit_many(', 'admit_many_leaky('));
    expect(r.lockTimeout).toBe('5ms');
    await one.pool.query('RESET lock_timeout');
  });

  /** Every caller answered `forward` must have its record committed. */
  async function forwardsWithoutRecord(admit: (c: AdmitInput) => Promise<Admission>) {
    const cmds = [fresh(), fresh({ ownerToken: `boom-${randomUUID()}` }), fresh()];
    const settled = await Promise.allSettled(cmds.map((c) => admit(c)));
    await sleep(50);
    const bad: number[] = [];
    for (const [i, s] of settled.entries()) if (s.status === 'fulfilled' && s.value.outcome === 'forward' && (await recordOf(cmds[i]!)) === null) bad.push(i);
    return { settled, bad };
  }

  it('a group whose COMMIT fails after its rows were computed answers every caller with the fault, none forward', async () => {
    const admit = createAdmit(ctxOf(schema.pool), { budgetMs: null }); // no budget: only the held row defers
    const { settled, bad } = await forwardsWithoutRecord(admit);
    expect(admit.group.stats.grouped).toBe(3);
    expect(settled.map((s) => s.status)).toEqual(['rejected', 'rejected', 'rejected']);
    expect(bad).toEqual([]);
  });

  it('negative control: a group answered after its SELECT, committed after (explicit transaction), forwards without a record', async () => {
    const base = ctxOf(schema.pool);
    const ctx: PgContext = {
      ...base,
      async query<R>(text: string, values: unknown[]) {
        if (!text.includes('fencegate_admit_many(')) return base.query<R>(text, values);
        const c = await schema.pool.connect();
        await c.query('BEGIN');
        const res = await c.query(text, values);
        void c
          .query('COMMIT')
          .catch(() => {})
          .finally(() => c.release());
        return { rows: res.rows as R[] };
      },
    };
    const admit = createAdmit(ctx);
    const { bad } = await forwardsWithoutRecord(admit);
    expect(bad).toEqual([0, 1, 2]); // every caller heard "forward" for a transaction that never committed
  });

  it('a stale fence deferred (its entity row held elsewhere) is refused once and logged once (G5)', async () => {
    const entity = `e-${randomUUID()}`;
    await expect(store.admit(fresh({ entity, fence: 9n }))).resolves.toMatchObject({ outcome: 'forward' });
    const held = await holdEntity(entity);
    const admit = createAdmit(ctxOf(schema.pool), { budgetMs: null }); // no budget: only the held row defers
    const z = fresh();
    const stale = fresh({ entity, fence: 3n });
    const answers = Promise.all([admit(z), admit(stale)]);
    await until(async () => admit.group.stats.deferred >= 1 && (await held.waiters()) >= 1, 'the stale fence left alone and waiting for the row');
    await held.release();
    expect(await answers).toMatchObject([{ outcome: 'forward' }, { outcome: 'stale-fence', currentFence: 9n }]);
    expect(admit.group.stats).toMatchObject({ grouped: 2, deferred: 1 });
    expect(await rejectionsOf(stale.audit.requestId)).toEqual(['stale-fence']);
  });
});
