import type Database from 'better-sqlite3';
import { loadMigrations, LEDGERS, type Migration } from '../db/migrations.js';
import { applyPostgresMigrations } from '../db/postgres-migrate.js';
import type { PoolLike } from '../db/postgres-types.js';
import { applySqliteMigrations } from '../db/sqlite-migrate.js';

/**
 * The lease module's own schema (DESIGN §4, §6): `tool_jobs` and
 * `tool_job_store`, from `migrations/lease/<dialect>/`, recorded in the
 * ledger `fencegate_lease_migrations`. A worker's database gets these tables
 * only, never the gateway's. A database created before the ledgers were split
 * (one ledger, both parts) is upgraded in place: its lease rows are taken
 * over from `fencegate_migrations`, nothing runs twice, and the gateway
 * tables it holds are left alone.
 */
export function migrateLeaseSqlite(db: Database.Database, migrations: Migration[] = loadMigrations('lease', 'sqlite')): string[] {
  return applySqliteMigrations(db, LEDGERS.lease, migrations);
}

/** PostgreSQL: as migrateLeaseSqlite, in one transaction under the migrators' advisory lock. */
export async function migrateLeasePostgres(pool: PoolLike, migrations: Migration[] = loadMigrations('lease', 'postgres')): Promise<string[]> {
  return applyPostgresMigrations(pool, LEDGERS.lease, migrations);
}

/**
 * `fencegate migrate --lease --database-url URL`: migrateLeasePostgres on a
 * one-connection pool of its own. `pg` is loaded here, on demand, so the CLI
 * and SQLite-only programs do not load it.
 */
export async function migrateLeasePostgresUrl(url: string): Promise<string[]> {
  const { default: pg } = await import('pg');
  const pool = new pg.Pool({ connectionString: url, max: 1, application_name: 'fencegate-migrate' });
  pool.on('error', () => {}); // an idle connection's fault: the migration's own query reports it
  return migrateLeasePostgres(pool as unknown as PoolLike).finally(() => pool.end());
}
