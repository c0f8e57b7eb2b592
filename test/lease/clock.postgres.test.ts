/**
 * The PostgreSQL lease statements count what they write from after a lock
 * wait, not from the moment they arrived (src/lease/postgres/queries.ts):
 * `now()` is the transaction's start, so a statement that waited for a lock
 * would write a lease end already partly used up and judge ownership by a
 * time already past.
 *
 * Deterministic: another connection holds the lock (the table, or the row
 * while updating it) until the statement is seen waiting for it in
 * pg_stat_activity, lets a little time pass, reads clock_timestamp() and
 * only then commits. A lease end counted from after the wait is at least that
 * reading plus the lease. Each test runs the statement as shipped and, as its
 * negative control, the same text with now() in place of clock_timestamp().
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import * as q from '../../src/lease/postgres/queries.js';
import type { JobStore, Lease } from '../../src/lease/types.js';
import { POSTGRES_URL, postgresDatabase, type TestDatabase } from './helpers/stores.js';

const LEASE_MS = 30_000;
type Holder = 'table lock' | 'row update';

/** The shipped statement, and the same statement on the transaction's start time. */
const withNow = (sql: string) => {
  const old = sql.replaceAll('clock_timestamp()', 'now()');
  expect(old).not.toBe(sql);
  return old;
};

describe.skipIf(!POSTGRES_URL)('PostgreSQL lease statements after a lock wait', () => {
  let db: TestDatabase;
  let store: JobStore;
  let url: string;
  let n = 0;

  beforeAll(async () => {
    db = await postgresDatabase();
    store = await db.open({ leaseMs: LEASE_MS });
    url = (db.descriptor as { postgres: string }).postgres;
  });
  afterAll(async () => {
    await db?.dispose();
  });

  const claimed = async (): Promise<Lease> => {
    const kind = `clock-${++n}`;
    await store.enqueue({ kind, idempotencyKey: kind, payload: {} });
    const { lease } = await store.claim({ workerId: 'w1', kinds: [kind] });
    expect(lease).not.toBeNull();
    return lease!;
  };

  /**
   * Runs `statement` while another connection holds `holder` on job `id`.
   * Once the statement waits for it, `whileWaiting` may change the row (the
   * holder has the lock); then time passes, the holder reads its clock and
   * commits. Returns the statement's result and that reading.
   */
  async function afterLockWait<T>(
    holder: Holder,
    id: number,
    statement: () => Promise<T>,
    whileWaiting?: (h: pg.Client, waiterStart: string) => Promise<void>,
  ): Promise<{ result: T; released: string }> {
    const h = new pg.Client({ connectionString: url });
    // Watches from outside h's transaction: inside one, pg_stat_activity
    // keeps showing what it showed at the transaction's first look.
    const watcher = new pg.Client({ connectionString: url });
    await h.connect();
    await watcher.connect();
    try {
      const pid = (await h.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
      await h.query('BEGIN');
      if (holder === 'table lock') await h.query('LOCK TABLE tool_jobs IN EXCLUSIVE MODE');
      else await h.query('UPDATE tool_jobs SET lease_until = lease_until WHERE id = $1', [id]);
      const pending = statement().then(
        (value) => ({ ok: true as const, value }),
        (error: unknown) => ({ ok: false as const, error }),
      );
      let waiter: { start: string } | undefined;
      for (let i = 0; i < 2_000 && !waiter; i++) {
        waiter = (
          await watcher.query<{ start: string }>(
            "SELECT xact_start::text AS start FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)) AND wait_event_type = 'Lock' AND xact_start IS NOT NULL",
            [pid],
          )
        ).rows[0];
        if (!waiter) await new Promise((r) => setTimeout(r, 5));
      }
      expect(waiter, 'the statement never waited for the lock').toBeDefined();
      await whileWaiting?.(h, waiter!.start);
      await h.query('SELECT pg_sleep(0.05)');
      const released = (await h.query<{ t: string }>('SELECT clock_timestamp()::text AS t')).rows[0]!.t;
      await h.query('COMMIT');
      const outcome = await pending;
      if (!outcome.ok) throw outcome.error;
      return { result: outcome.value, released };
    } finally {
      await h.end();
      await watcher.end();
    }
  }

  /** Is job `id`'s lease end at least `released` + the lease (counted from after the wait)? */
  const countsFromRelease = async (id: number, released: string) =>
    (
      await db.sql<{ ok: boolean }>("SELECT lease_until >= $1::timestamptz + $2::bigint * interval '1 millisecond' AS ok FROM tool_jobs WHERE id = $3", [
        released,
        LEASE_MS,
        id,
      ])
    )[0]!.ok;

  for (const holder of ['table lock', 'row update'] as const) {
    test(`extend after a wait for a ${holder}: the new lease end counts from after the wait (negative control: now())`, async () => {
      const lease = await claimed();
      const shipped = await afterLockWait(holder, lease.id, () => store.extend(lease));
      expect(shipped.result.ok).toBe(true);
      expect(await countsFromRelease(lease.id, shipped.released)).toBe(true);

      const old = await afterLockWait(holder, lease.id, () => db.sql(withNow(q.EXTEND), [lease.id, lease.ownerId, lease.fencingToken, LEASE_MS]));
      expect(old.result).toHaveLength(1);
      expect(await countsFromRelease(lease.id, old.released)).toBe(false);
    });

    test(`complete after a wait for a ${holder}, during which the lease ended: refused (negative control: now() stores the result)`, async () => {
      // While the statement waits, the lease is made to end 1 ms after the
      // statement's start: alive by now(), over by the time the row is written.
      const endSoonAfterStart = (id: number) => async (h: pg.Client, waiterStart: string) => {
        await h.query("UPDATE tool_jobs SET lease_until = $1::timestamptz + interval '1 millisecond' WHERE id = $2", [waiterStart, id]);
      };
      const lease = await claimed();
      const shipped = await afterLockWait(holder, lease.id, () => store.complete(lease, 'late'), endSoonAfterStart(lease.id));
      expect(shipped.result).toEqual({ ok: false, reason: 'lease_lost' });
      expect(await store.get(lease.id)).toMatchObject({ state: 'running', result: null });

      const other = await claimed();
      const old = await afterLockWait(
        holder,
        other.id,
        () => db.sql(withNow(q.COMPLETE), [other.id, other.ownerId, other.fencingToken, '"late"']),
        endSoonAfterStart(other.id),
      );
      expect(old.result).toHaveLength(1);
      expect(await store.get(other.id)).toMatchObject({ state: 'succeeded', result: 'late' });
    });
  }

  test('claim after a wait for a table lock: the lease end counts from after the wait (negative control: now())', async () => {
    // A row lock is no wait for a claim (SKIP LOCKED passes it by); a table lock is.
    const claimAfterWait = async (run: (kind: string) => Promise<unknown>) => {
      const kind = `clock-claim-${++n}`;
      const { job } = await store.enqueue({ kind, idempotencyKey: kind, payload: {} });
      const { released } = await afterLockWait('table lock', job.id, () => run(kind));
      expect(await store.get(job.id)).toMatchObject({ state: 'running', fencingToken: 1 });
      return countsFromRelease(job.id, released);
    };
    expect(await claimAfterWait((kind) => store.claim({ workerId: 'w2', kinds: [kind] }))).toBe(true);
    expect(await claimAfterWait((kind) => db.sql(withNow(q.CLAIM), ['w2', [kind], LEASE_MS, '{}']))).toBe(false);
  });
});
