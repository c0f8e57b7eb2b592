/**
 * The migrators of the last release with one ledger, as they were (the code
 * of src/store/sqlite/migrate.ts and src/store/postgres/migrate.ts before the
 * gateway and the lease module got their own): every file of the dialect,
 * gateway and lease alike, recorded in `fencegate_migrations`. The files are
 * today's (moved, unchanged); RELEASED pins which ones that release had.
 */
import type Database from 'better-sqlite3';
import type { PoolLike } from '../../src/db/postgres-types.js';
import { loadMigrations, loadSingleLedgerHistory, type Dialect, type Migration } from '../../src/db/migrations.js';
import { logText } from '../../src/store/postgres/rejections.js';
import type { Admission, AdmitInput } from '../../src/store/types.js';

export const RELEASED = [
  '0001_gateway.sql',
  '0002_tool_jobs.sql',
  '0003_d1_admission_scratch.sql',
  '0003_gateway_functions.sql',
  '0004_audit.sql',
  '0005_gateway_fence_history.sql',
  '0005_lean_pages.sql',
  '0006_client_request_id_retention.sql',
  '0006_gateway_clock_retention.sql',
  '0007_tool_job_store.sql',
];

export function releasedMigrations(dialect: Dialect): Migration[] {
  return loadSingleLedgerHistory(dialect).filter((m) => RELEASED.includes(m.name));
}

/** The gateway migrations that came after that release: what an upgrade of its database applies. */
export function gatewayMigrationsSince(dialect: Dialect): string[] {
  return loadMigrations('gateway', dialect)
    .map((m) => m.name)
    .filter((n) => !RELEASED.includes(n));
}

/**
 * The admission of that release on PostgreSQL: its 18-argument call of
 * fencegate_admit (migration 0006; the rejection row had no tool). Today's
 * store passes a 19th argument, which that schema's function does not take.
 */
export function releasedPostgresAdmit(pool: PoolLike): (input: AdmitInput) => Promise<Admission['outcome']> {
  return async (input) => {
    const a = logText({ entity: input.entity, idempotencyKey: input.key, audit: input.audit });
    const { rows } = await pool.query<{ outcome: Admission['outcome'] }>(
      'SELECT outcome FROM fencegate_admit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)',
      [
        input.scope,
        input.key,
        input.entity,
        input.fence?.toString() ?? null,
        input.fingerprint,
        input.mode === 'serial',
        input.ownerToken,
        input.lockMs,
        input.retentionMs,
        input.onUnknown === 'retry',
        a.caller,
        a.method,
        a.path,
        a.payloadSha256,
        a.requestId,
        a.clientRequestId,
        a.entity,
        a.idempotencyKey,
      ],
    );
    return rows[0]!.outcome;
  };
}

export function migrateSqliteAsReleased(db: Database.Database, migrations = releasedMigrations('sqlite')): string[] {
  const applied: string[] = [];
  const run = db.transaction(() => {
    db.exec(`CREATE TABLE IF NOT EXISTS fencegate_migrations (
      name TEXT PRIMARY KEY NOT NULL,
      applied_at INTEGER NOT NULL
    ) STRICT`);
    const done = new Set((db.prepare('SELECT name FROM fencegate_migrations').all() as { name: string }[]).map((r) => r.name));
    const record = db.prepare("INSERT INTO fencegate_migrations (name, applied_at) VALUES (?, CAST(unixepoch('subsec') * 1000 AS INTEGER))");
    for (const m of migrations) {
      if (done.has(m.name)) continue;
      db.exec(m.sql);
      record.run(m.name);
      applied.push(m.name);
    }
  });
  run.immediate();
  return applied;
}

export async function migratePostgresAsReleased(pool: PoolLike, migrations = releasedMigrations('postgres')): Promise<string[]> {
  const client = await pool.connect();
  const applied: string[] = [];
  try {
    await client.query('BEGIN');
    await client.query("SELECT pg_advisory_xact_lock(hashtext('fencegate_migrations:' || current_schema()))");
    await client.query(`CREATE TABLE IF NOT EXISTS fencegate_migrations (
      name text PRIMARY KEY,
      applied_at timestamptz NOT NULL DEFAULT now()
    )`);
    const { rows } = await client.query<{ name: string }>('SELECT name FROM fencegate_migrations');
    const done = new Set(rows.map((r) => r.name));
    for (const m of migrations) {
      if (done.has(m.name)) continue;
      await client.query(m.sql);
      await client.query('INSERT INTO fencegate_migrations (name) VALUES ($1)', [m.name]);
      applied.push(m.name);
    }
    await client.query('COMMIT');
    return applied;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    client.release();
  }
}
