/**
 * The queue fences' own schema: `fencegate_queue_fences` and
 * `fencegate_queue_store`, from `migrations/queue/<dialect>/`, recorded in
 * their own ledger, as the gateway and the lease module keep theirs
 * (src/db/migrations.ts). A queue's database gets these two tables only.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type Database from 'better-sqlite3';
import { MIGRATIONS_ROOT, type Dialect, type Ledger, type Migration } from '../db/migrations.js';
import { applyPostgresMigrations } from '../db/postgres-migrate.js';
import type { PoolLike } from '../db/postgres-types.js';
import { applySqliteMigrations } from '../db/sqlite-migrate.js';

export const QUEUE_LEDGER: Ledger = { table: 'fencegate_queue_migrations' };

/** `migrations/queue/<dialect>/NNNN_name.sql`, in order (the numbers continue the one sequence of migrations/README.md). */
export function loadQueueMigrations(dialect: Dialect, root = MIGRATIONS_ROOT): Migration[] {
  const dir = join(root, 'queue', dialect);
  return readdirSync(dir)
    .filter((name) => /^\d{4}_[a-z0-9_]+\.sql$/.test(name))
    .sort()
    .map((name) => ({ name, sql: readFileSync(join(dir, name), 'utf8') }));
}

export function migrateQueueSqlite(db: Database.Database): string[] {
  return applySqliteMigrations(db, QUEUE_LEDGER, loadQueueMigrations('sqlite'));
}

/** In one transaction, under the migrators' advisory lock (several workers may start at once). */
export function migrateQueuePostgres(pool: PoolLike): Promise<string[]> {
  return applyPostgresMigrations(pool, QUEUE_LEDGER, loadQueueMigrations('postgres'));
}
