/**
 * PostgreSQL: every expiry the gateway's functions write or compare is taken
 * from the moment the rows are held, not from the transaction's start
 * (`now()`). Deterministic: another connection holds the entity's or the
 * record's row lock (BEGIN; SELECT … FOR UPDATE) for 1.5 s while a decision
 * waits for it; the database's clock_timestamp(), read by that connection
 * just before it lets go, is the reference. The margins are compared in SQL,
 * at microsecond precision.
 *
 * Negative control: the previous release's functions (migrations 0003 and
 * 0005, created here under `_old` names) fail the same assertions.
 */
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MIGRATIONS_ROOT } from '../../src/store/migrations.js';
import { createPostgresStore, type PostgresGatewayStore } from '../../src/store/postgres/index.js';
import type { AdmitInput } from '../../src/store/types.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { command, finishOf, response } from './conformance.js';

const HOLD_MS = 1_500;
const LOCK_MS = 1_000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The functions of 0003 and 0005 as they were, every fencegate_ function renamed `…_old`. */
function previousRelease(): string {
  const rename = (sql: string) => sql.replace(/\bfencegate_(log_rejection|ms_between|admit|finish)\(/g, 'fencegate_$1_old(');
  const read = (name: string) => readFileSync(join(MIGRATIONS_ROOT, 'gateway', 'postgres', name), 'utf8');
  return rename(read('0003_gateway_functions.sql')) + '\n' + rename(read('0005_gateway_fence_history.sql'));
}

describe.skipIf(!POSTGRES_URL)('PostgreSQL: expiries are measured from when the rows are held (clock_timestamp)', () => {
  let schema: TestSchema;
  let store: PostgresGatewayStore;
  /** Connections of the decision under test, told apart in pg_stat_activity. */
  const app = `fg-clock-${randomUUID().slice(0, 8)}`;
  let old: pg.Client;

  beforeAll(async () => {
    schema = await createTestSchema('fg_clock');
    store = await createPostgresStore({ connectionString: schema.url, applicationName: app, listen: false });
    old = new pg.Client({ connectionString: schema.url, application_name: `${app}-old` });
    await old.connect();
    await old.query(previousRelease());
  });
  afterAll(async () => {
    await old?.end();
    await store?.close();
    await schema?.drop();
  });

  /**
   * Runs `decide` while another connection holds the row `lockSql` locks;
   * lets go HOLD_MS after the decision is seen waiting for it. Returns the
   * database clock just before the release (as text, microseconds intact).
   * `whileWaiting`, if given, runs on the holder's connection once the
   * decision waits, with the start of the decision's transaction (its now()).
   */
  async function whileLocked<T>(
    lockSql: string,
    params: unknown[],
    waiter: string,
    decide: () => Promise<T>,
    whileWaiting?: (holder: pg.PoolClient, waiterStart: string) => Promise<void>,
  ): Promise<{ released: string; result: T }> {
    const holder = await schema.pool.connect();
    try {
      await holder.query('BEGIN');
      expect((await holder.query(lockSql, params)).rowCount).toBe(1);
      const pending = decide();
      pending.catch(() => {});
      let waiterStart: string | undefined;
      for (let i = 0; ; i++) {
        const { rows } = await schema.pool.query<{ start: string }>(
          "SELECT xact_start::text AS start FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock' AND xact_start IS NOT NULL",
          [waiter],
        );
        waiterStart = rows[0]?.start;
        if (waiterStart !== undefined) break;
        if (i > 250) throw new Error('the decision never waited for the row lock');
        await sleep(20);
      }
      await whileWaiting?.(holder, waiterStart);
      await sleep(HOLD_MS);
      const { rows } = await holder.query<{ t: string }>('SELECT clock_timestamp()::text AS t');
      await holder.query('COMMIT');
      return { released: rows[0]!.t, result: await pending };
    } finally {
      holder.release();
    }
  }

  /** Milliseconds from `released` to each expression of `cols` for one row (microsecond precision). */
  async function marginsMs(table: string, cols: string[], where: string, params: unknown[], released: string): Promise<number[]> {
    const select = cols.map((c, i) => `extract(epoch FROM (${c} - $${params.length + 1}::timestamptz)) * 1000 AS m${i}`).join(', ');
    const { rows } = await schema.pool.query(`SELECT ${select} FROM ${table} WHERE ${where}`, [...params, released]);
    expect(rows).toHaveLength(1);
    return cols.map((_, i) => Number(rows[0][`m${i}`]));
  }

  const oldAdmit = async (i: AdmitInput) => {
    const { rows } = await old.query('SELECT * FROM fencegate_admit_old($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)', [
      i.scope,
      i.key,
      i.entity,
      i.fence?.toString() ?? null,
      i.fingerprint,
      i.mode === 'serial',
      i.ownerToken,
      i.lockMs,
      i.retentionMs,
      i.onUnknown === 'retry',
      i.audit.caller,
      i.audit.method,
      i.audit.path,
      i.audit.payloadSha256,
      i.audit.requestId,
    ]);
    return rows[0] as { outcome: string };
  };
  type Impl = { name: string; waiter: string; admit: (i: AdmitInput) => Promise<{ outcome: string }> };
  const impls = (): Impl[] => [
    { name: '0006', waiter: app, admit: (i) => store.admit(i) },
    { name: 'previous release (negative control)', waiter: `${app}-old`, admit: oldAdmit },
  ];

  /** A fresh entity at fence 1 with no request in flight. */
  async function entityAtFence1(): Promise<string> {
    const first = command({ entity: `e-${randomUUID()}`, fence: 1n });
    expect((await store.admit(first)).outcome).toBe('forward');
    await store.finish(finishOf(first, 'completed'));
    return first.entity!;
  }

  it('an admission that waited for the entity row writes a record lock and a serial slot of lockMs from after the wait', async () => {
    const seen: Record<string, number[]> = {};
    for (const impl of impls()) {
      const entity = await entityAtFence1();
      const input = command({ entity, fence: 2n, lockMs: LOCK_MS });
      const { released, result } = await whileLocked('SELECT 1 FROM fence_entities WHERE entity = $1 FOR UPDATE', [entity], impl.waiter, () =>
        impl.admit(input),
      );
      expect(result.outcome).toBe('forward');
      const [lock] = await marginsMs('idempotency_records', ['locked_until'], 'scope = $1 AND key = $2', [input.scope, input.key], released);
      const [slot, accepted] = await marginsMs('fence_entities', ['inflight_until', 'accepted_at'], 'entity = $1', [entity], released);
      seen[impl.name] = [lock!, slot!, accepted!];
    }
    const fixed = seen['0006']!;
    expect(fixed[0]).toBeGreaterThanOrEqual(LOCK_MS);
    expect(fixed[1]).toBeGreaterThanOrEqual(LOCK_MS);
    expect(fixed[2]).toBeGreaterThanOrEqual(0);
    // The previous release measured them from before the wait: HOLD_MS short.
    const before = seen['previous release (negative control)']!;
    expect(before[0]).toBeLessThan(LOCK_MS);
    expect(before[1]).toBeLessThan(LOCK_MS);
    expect(before[2]).toBeLessThan(0);
  });

  it('a takeover that waited for the record row writes its lock and slot of lockMs from after the wait', async () => {
    const seen: Record<string, number[]> = {};
    for (const impl of impls()) {
      const entity = await entityAtFence1();
      const first = command({ entity, fence: 2n });
      expect((await store.admit(first)).outcome).toBe('forward');
      await store.finish(finishOf(first, 'unknown'));
      const retry = command({ entity, key: first.key, fence: 3n, lockMs: LOCK_MS, onUnknown: 'retry' });
      const { released, result } = await whileLocked(
        'SELECT 1 FROM idempotency_records WHERE scope = $1 AND key = $2 FOR UPDATE',
        [first.scope, first.key],
        impl.waiter,
        () => impl.admit(retry),
      );
      expect(result.outcome).toBe('forward');
      const [lock] = await marginsMs('idempotency_records', ['locked_until'], 'scope = $1 AND key = $2', [first.scope, first.key], released);
      const [slot] = await marginsMs('fence_entities', ['inflight_until'], 'entity = $1', [entity], released);
      seen[impl.name] = [lock!, slot!];
    }
    expect(seen['0006']![0]).toBeGreaterThanOrEqual(LOCK_MS);
    expect(seen['0006']![1]).toBeGreaterThanOrEqual(LOCK_MS);
    expect(seen['previous release (negative control)']![0]).toBeLessThan(LOCK_MS);
    expect(seen['previous release (negative control)']![1]).toBeLessThan(LOCK_MS);
  });

  it("a record lock that ran out while the admission waited reads as expired (the dead owner's record becomes outcome_unknown)", async () => {
    const outcomes: Record<string, string> = {};
    for (const impl of impls()) {
      // A lock still alive when the retry starts and gone when it gets the
      // row. Not left to timing (a stall of about LOCK_MS between the two
      // admissions would let a LOCK_MS lock run out before the retry starts,
      // and the control would read it as expired too): the lock is written
      // long, and while the retry waits it is made to end 1 ms after the
      // retry's transaction start, its now(). The retry gets the row HOLD_MS
      // after it was seen waiting, long after that.
      const holderOfKey = command({ entity: null, fence: null, mode: 'concurrent', lockMs: 60_000 });
      expect((await store.admit(holderOfKey)).outcome).toBe('forward');
      const retry = { ...holderOfKey, ownerToken: `owner-${randomUUID()}` };
      const { result } = await whileLocked(
        'SELECT 1 FROM idempotency_records WHERE scope = $1 AND key = $2 FOR UPDATE',
        [holderOfKey.scope, holderOfKey.key],
        impl.waiter,
        () => impl.admit(retry),
        async (holder, waiterStart) => {
          const { rowCount } = await holder.query(
            "UPDATE idempotency_records SET locked_until = $3::timestamptz + interval '1 millisecond' WHERE scope = $1 AND key = $2",
            [holderOfKey.scope, holderOfKey.key, waiterStart],
          );
          expect(rowCount).toBe(1);
        },
      );
      outcomes[impl.name] = result.outcome;
    }
    expect(outcomes['0006']).toBe('outcome-unknown');
    // The previous release compared with its start, when the lock was still alive.
    expect(outcomes['previous release (negative control)']).toBe('idempotency-in-progress');
  });

  it('a finish that waited for the record row keeps the response for its whole retention from after the wait', async () => {
    const retentionMs = 60_000;
    const seen: Record<string, number> = {};
    const finishes: Impl[] = impls();
    for (const impl of finishes) {
      const input = command({ entity: null, fence: null, mode: 'concurrent' });
      expect((await store.admit(input)).outcome).toBe('forward');
      const done = { ...finishOf(input, 'completed', response()), retentionMs };
      const run: () => Promise<unknown> =
        impl.waiter === app
          ? () => store.finish(done)
          : () =>
              old.query('SELECT recorded FROM fencegate_finish_old($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)', [
                done.scope,
                done.key,
                null,
                done.ownerToken,
                'completed',
                201,
                '[]',
                Buffer.from('x'),
                retentionMs,
                null,
                'POST',
                '/p',
                'ab',
                'r',
                null,
                null,
                null,
              ]);
      await whileLocked('SELECT 1 FROM idempotency_records WHERE scope = $1 AND key = $2 FOR UPDATE', [input.scope, input.key], impl.waiter, run).then(
        async ({ released }) => {
          const [expires] = await marginsMs(
            'idempotency_records',
            ['expires_at'],
            "scope = $1 AND key = $2 AND state = 'completed'",
            [input.scope, input.key],
            released,
          );
          seen[impl.name] = expires!;
        },
      );
    }
    expect(seen['0006']).toBeGreaterThanOrEqual(retentionMs);
    expect(seen['previous release (negative control)']).toBeLessThan(retentionMs);
  });
});
