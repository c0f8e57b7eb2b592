/**
 * The fence source on PostgreSQL and SQLite: one upsert per attempt into
 * `fencegate_queue_fences` (migrations/queue/<dialect>/).
 */
import type Database from 'better-sqlite3';
import type { PoolLike } from '../db/postgres-types.js';
import { LeaseError } from '../lease/errors.js';
import { STORE_ID } from './keys.js';
import type { BeginResult, FenceGuard, FenceSource } from './types.js';

function checkedStoreId(row: { store_id?: unknown } | undefined): string {
  const id = row?.store_id;
  if (typeof id !== 'string' || !STORE_ID.test(id)) {
    throw new LeaseError('store_identity', 'fencegate_queue_store has no valid store id: run the queue migrations (migrate: true)');
  }
  return id;
}

function sqlGuard(guard: FenceGuard | undefined): { where: string; values: readonly unknown[] } {
  if (guard === undefined) return { where: 'true', values: [] };
  if (guard.kind !== 'sql') throw new LeaseError('invalid_input', `a SQL fence source takes a 'sql' guard, got '${guard.kind}'`);
  return guard;
}

/*
 * $1 queue, $2 job_ref, then the guard's values. The guard is evaluated in
 * the SELECT of this one statement: when it is false no row is inserted and
 * none is updated, and the empty RETURNING is the answer `not_owner`.
 */
const PG_BEGIN = (where: string) => `
  INSERT INTO fencegate_queue_fences AS f (queue, job_ref, fence)
  SELECT $1, $2, 1 WHERE ${where}
  ON CONFLICT (queue, job_ref) DO UPDATE SET fence = f.fence + 1, updated_at = now()
  RETURNING fence::text AS fence`;

export async function postgresFenceSource(pool: PoolLike): Promise<FenceSource> {
  const { rows } = await pool.query<{ store_id: string }>('SELECT store_id FROM fencegate_queue_store');
  const storeId = checkedStoreId(rows[0]);
  return {
    backend: 'postgres',
    storeId,
    async begin(job, guard) {
      const g = sqlGuard(guard);
      const res = await pool.query<{ fence: string }>(PG_BEGIN(g.where), [job.queue, job.id, ...g.values]);
      return answer(res.rows[0]?.fence);
    },
    async sweep(options) {
      const { olderThanMs, batch } = sweepBounds(options);
      // The database's clock decides the age (DESIGN G6), as it wrote updated_at.
      const res = await pool.query(
        `DELETE FROM fencegate_queue_fences WHERE (queue, job_ref) IN (
           SELECT queue, job_ref FROM fencegate_queue_fences
           WHERE updated_at < clock_timestamp() - $1 * interval '1 millisecond' LIMIT $2)`,
        [olderThanMs, batch],
      );
      return res.rowCount ?? 0;
    },
  };
}

// As PG_BEGIN: ? queue, ? job_ref, then the guard's values. SQLite's upsert
// needs a WHERE on the SELECT to parse the ON CONFLICT that follows.
const SQLITE_BEGIN = (where: string) => `
  INSERT INTO fencegate_queue_fences (queue, job_ref, fence, updated_at)
  SELECT ?, ?, 1, CAST(unixepoch('subsec') * 1000 AS INTEGER) WHERE ${where}
  ON CONFLICT (queue, job_ref) DO UPDATE SET fence = fence + 1, updated_at = excluded.updated_at
  RETURNING fence`;

export function sqliteFenceSource(db: Database.Database): FenceSource {
  const storeId = checkedStoreId(db.prepare('SELECT store_id FROM fencegate_queue_store').get() as { store_id?: unknown } | undefined);
  const cached = new Map<string, Database.Statement>();
  return {
    backend: 'sqlite',
    storeId,
    async begin(job, guard) {
      const g = sqlGuard(guard);
      let stmt = cached.get(g.where);
      if (stmt === undefined) {
        stmt = db.prepare(SQLITE_BEGIN(g.where));
        if (cached.size < 16) cached.set(g.where, stmt);
      }
      const row = stmt.get(job.queue, job.id, ...g.values) as { fence: number } | undefined;
      return answer(row?.fence);
    },
    async sweep(options) {
      const { olderThanMs, batch } = sweepBounds(options);
      return db
        .prepare(
          `DELETE FROM fencegate_queue_fences WHERE rowid IN (
             SELECT rowid FROM fencegate_queue_fences
             WHERE updated_at < CAST(unixepoch('subsec') * 1000 AS INTEGER) - ? LIMIT ?)`,
        )
        .run(olderThanMs, batch).changes;
    },
  };
}

/** The sweep's bounds, checked before any statement (a day at least: see FenceSource.sweep). */
function sweepBounds(options: { olderThanMs: number; batch?: number }): { olderThanMs: number; batch: number } {
  const { olderThanMs, batch = 1000 } = options;
  if (!Number.isSafeInteger(olderThanMs) || olderThanMs < 86_400_000)
    throw new LeaseError(
      'invalid_input',
      `olderThanMs must be a whole number of ms of at least a day (longer than the gateway's entityRetention), got ${String(olderThanMs)}`,
    );
  if (!Number.isSafeInteger(batch) || batch < 1 || batch > 100_000)
    throw new LeaseError('invalid_input', `batch must be a whole number from 1 to 100000, got ${String(batch)}`);
  return { olderThanMs, batch };
}

function answer(fence: string | number | undefined): BeginResult {
  if (fence === undefined) return { ok: false, reason: 'not_owner' };
  const n = Number(fence);
  if (!Number.isSafeInteger(n) || n < 1) throw new LeaseError('invalid_input', `the fence store returned an unusable fence: ${String(fence)}`);
  return { ok: true, fence: n };
}
