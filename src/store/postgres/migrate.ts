import { loadMigrations, LEDGERS, type Migration } from '../../db/migrations.js';
import { applyPostgresMigrations } from '../../db/postgres-migrate.js';
import { applyFunctions, loadFunctions, type SqlFunctionFile } from './functions.js';
import type { PoolLike } from './types.js';

/**
 * Applies the gateway's pending `migrations/gateway/postgres` files (tables,
 * indexes, types), then the function files of ./sql whose checksum changed,
 * or all of them when a migration ran (./functions.ts), all in one
 * transaction: the files are the only definition of the functions (DESIGN
 * §4.1), whatever schema the database started from. Safe when several replicas start at once: a transaction-scoped
 * advisory lock (keyed by the schema, so per-test schemas do not contend)
 * serialises them, and the second one finds nothing left to do. Returns the
 * names applied (`functions/<file>` for a function file).
 *
 * With an explicit list of migrations (a test or benchmark rebuilding an
 * earlier release's schema) the function files are applied only if passed too.
 */
export async function migratePostgres(
  pool: PoolLike,
  migrations?: Migration[],
  functions: SqlFunctionFile[] = migrations === undefined ? loadFunctions() : [],
): Promise<string[]> {
  return applyPostgresMigrations(
    pool,
    LEDGERS.gateway,
    migrations ?? loadMigrations('gateway', 'postgres'),
    functions.length === 0 ? undefined : (client, applied) => applyFunctions(client, functions, applied.length > 0),
  );
}
