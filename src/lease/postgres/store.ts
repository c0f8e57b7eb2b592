import { migrateLeasePostgres } from '../migrate.js';
import type { PoolLike } from '../../db/postgres-types.js';
import { checkStoreId, enqueuedBefore, enqueueParams, failParams, failResult, LEASE_LOST, normaliseEnqueue } from '../store-common.js';
import type { JobState, JobStore, JobStoreOptions, StoreDescriptor } from '../types.js';
import { claimers } from './claim.js';
import { completer } from './complete.js';
import { owned, preparedOn } from './prepared.js';
import * as q from './queries.js';
import { rowToJob, type JobRow } from './rows.js';

export type PostgresJobStoreOptions = JobStoreOptions & {
  /** Timeout of each statement on a pool the store opens itself (`statement_timeout` and client-side `query_timeout`). */
  queryTimeoutMs?: number;
  /** Connection timeout on a pool the store opens itself. */
  connectionTimeoutMs?: number;
  /** Pool size on a pool the store opens itself; default 4. */
  poolMax?: number;
  /**
   * `transaction` behind a transaction-pooling PgBouncer, on a pool the store
   * opens itself: statements unnamed, the timeout SET LOCAL per transaction
   * (docs/deploy-postgres.md "Through PgBouncer").
   */
  pooler?: 'session' | 'transaction';
} & (
    | { connectionString: string }
    /**
     * A pool you opened (e.g. a `pg.Pool`); not ended by `close()`. Give its
     * `connectionString` too so that the heartbeat thread can open its own.
     */
    | { pool: PoolLike; connectionString?: string }
  );

/** The database's identity (migration 0007), read once: every job this store enqueues carries it. */
async function readStoreId(pool: PoolLike): Promise<string> {
  let row: { store_id: string } | undefined;
  try {
    row = (await pool.query<{ store_id: string }>(q.STORE_ID)).rows[0];
  } catch (err) {
    // Before migration 0007 the table does not exist (undefined_table): the same fault as no row.
    if ((err as { code?: unknown }).code !== '42P01') throw err;
  }
  return checkStoreId(row);
}

/**
 * The job store on PostgreSQL. Every operation is one statement (its own
 * transaction), so the store needs no client of its own between calls and
 * works through any pool. Concurrent claim() and completeAndClaim() calls
 * (same owner, kinds and leases), and concurrent complete() calls, share a
 * statement when they arrive while one is in flight (./group.ts); a lone
 * call goes out at once.
 *
 * @example
 * const store = await createPostgresJobStore({ connectionString: process.env.DATABASE_URL! });
 * const { lease } = await store.claim({ workerId: 'w1' });
 */
export async function createPostgresJobStore(options: PostgresJobStoreOptions): Promise<JobStore> {
  let pool: PoolLike;
  let ownsPool = false;
  if ('pool' in options) {
    pool = options.pool;
  } else {
    // Loaded on demand: `pg` stays out of programs that only use SQLite.
    // The pool the gateway store opens too: statement_timeout SET after connecting (a
    // startup parameter is refused by PgBouncer), per transaction behind a
    // transaction pooler, whose statements then go unnamed.
    const { configuredPool } = await import('../../db/postgres-pool.js');
    const own = configuredPool(
      {
        connectionString: options.connectionString,
        max: options.poolMax ?? 4,
        // Both sides: the server cancels a statement stuck on a lock, the client
        // gives up on a connection that went silent.
        ...(options.queryTimeoutMs === undefined ? {} : { query_timeout: options.queryTimeoutMs }),
        ...(options.connectionTimeoutMs === undefined ? {} : { connectionTimeoutMillis: options.connectionTimeoutMs }),
      },
      { statementTimeoutMs: options.queryTimeoutMs ?? null, pooler: options.pooler },
      // An idle client that loses its connection emits 'error' on the pool; unheard,
      // it would crash the process. The next query reports the fault instead.
      () => {},
    );
    pool = own as unknown as PoolLike;
    ownsPool = true;
  }
  let storeId: string;
  try {
    if (options.migrate ?? true) await migrateLeasePostgres(pool);
    storeId = await readStoreId(pool);
  } catch (err) {
    if (ownsPool) await pool.end().catch(() => {});
    throw err;
  }

  const descriptor: StoreDescriptor | undefined =
    options.connectionString === undefined
      ? undefined
      : { postgres: options.connectionString, ...(options.pooler === undefined ? {} : { pooler: options.pooler }) };
  const prepared = preparedOn(pool);
  const { claim, completeAndClaim } = claimers(prepared, options);
  const complete = completer(prepared);
  let closed = false;

  return {
    dialect: 'postgres',
    descriptor,
    storeId,

    async enqueue(input) {
      const job = normaliseEnqueue(input);
      const inserted = await pool.query<JobRow>(q.ENQUEUE, enqueueParams(job, storeId));
      const row = inserted.rows[0];
      if (row) return { created: true, job: rowToJob(row) };
      // ON CONFLICT DO NOTHING waited for the other inserter to commit, so
      // this (new-snapshot) read finds its row.
      const existing = await pool.query<JobRow>(q.BY_KEY, [job.idempotencyKey]);
      return enqueuedBefore(rowToJob(existing.rows[0] as JobRow), job.payloadSha256);
    },

    claim,

    async extend(lease) {
      const { rows } = await prepared<{ lease_until: Date }>(q.EXTEND, [...owned(lease), lease.leaseMs]);
      return rows[0] ? { ok: true, leaseUntil: rows[0].lease_until } : LEASE_LOST;
    },

    complete,

    completeAndClaim,

    async fail(lease, error, { retryable, backoffMs = 0 }) {
      const p = failParams(error, backoffMs);
      const { rows } = await prepared<{ state: JobState; reason: string | null; run_after: Date }>(q.FAIL, [
        ...owned(lease),
        p.errorJson,
        retryable,
        p.backoffMs,
        error.code,
      ]);
      const row = rows[0];
      return failResult(row && { state: row.state, reason: row.reason, runAfter: row.run_after }, error);
    },

    async release(lease) {
      const { rows } = await prepared(q.RELEASE, owned(lease));
      return rows.length === 1 ? { ok: true } : LEASE_LOST;
    },

    async cancel(id) {
      const { rows } = await pool.query(q.CANCEL, [id]);
      return rows.length === 1 ? { ok: true } : { ok: false, reason: 'not_cancellable' };
    },

    async get(id) {
      const { rows } = await pool.query<JobRow>(q.BY_ID, [id]);
      return rows[0] ? rowToJob(rows[0]) : null;
    },

    async counts() {
      const { rows } = await pool.query<{ state: JobState; kind: string; count: number }>(q.COUNTS);
      return rows;
    },

    async close() {
      if (closed) return;
      closed = true;
      if (ownsPool) await pool.end();
    },
  };
}
