import { loadMigrations, LEDGERS, type Migration } from '../../db/migrations.js';
import { applySqliteMigrations } from '../../db/sqlite-migrate.js';
import type { SqliteDatabase } from '../../db/sqlite-open.js';

/**
 * Applies the gateway's pending `migrations/gateway/sqlite` files. Safe when
 * several processes start at once on the same file: the check and the apply
 * happen inside one `BEGIN IMMEDIATE` transaction, so the second process
 * waits for the first and then finds nothing left to do. Returns the names
 * it applied.
 */
export function migrateSqlite(db: SqliteDatabase, migrations: Migration[] = loadMigrations('gateway', 'sqlite')): string[] {
  return applySqliteMigrations(db, LEDGERS.gateway, migrations);
}
