import { loadMigrations, LEDGERS, type Migration } from '../../db/migrations.js';
import { applyPostgresMigrations } from '../../db/postgres-migrate.js';
import { applyFunctions, loadFunctions, type SqlFunctionFile } from './functions.js';
import type { PoolLike } from './types.js';

/**
 * Applies the gateway's pending `migrations/gateway/postgres` files (tables,
 * indexes, types), then the function files of ./sql whose checksum changed,
 * or all of them when a migration ran (./functions.ts), all in one
 * transaction: the files are the only definition of the functions (DESIGN
 * §4.1), whatever schema the database started from. Safe when several
 * replicas start at once: a transaction-scoped advisory lock (keyed by the
 * schema, so per-test schemas do not contend) serialises them, and the
 * second one finds nothing left to do. Returns the names applied
 * (`functions/<file>` for a function file).
 *
 * A database whose ledger holds a gateway migration this release does not
 * know was migrated by a newer release: its function files are not applied
 * over that release's. A replica of the previous release that restarts
 * during a rolling upgrade would otherwise put its own bodies back under the
 * new replicas (DESIGN §4.5). Limit: a newer release that changed a
 * function and added no migration cannot be told from this one.
 *
 * With an explicit list of migrations (a test or benchmark rebuilding an
 * earlier release's schema) the function files are applied only if passed too.
 */
export async function migratePostgres(
  pool: PoolLike,
  migrations?: Migration[],
  functions: SqlFunctionFile[] = migrations === undefined ? loadFunctions() : [],
): Promise<string[]> {
  const list = migrations ?? loadMigrations('gateway', 'postgres');
  // What this release may find in the ledger: its gateway migrations, and the
  // lease migrations that the releases before the split recorded there too.
  const known = new Set([...list, ...loadMigrations('lease', 'postgres')].map((m) => m.name));
  return applyPostgresMigrations(
    pool,
    LEDGERS.gateway,
    list,
    functions.length === 0
      ? undefined
      : async (client, applied) => {
          const { rows } = await client.query<{ name: string }>(`SELECT name FROM ${LEDGERS.gateway.table}`);
          if (rows.some((r) => !known.has(r.name))) return [];
          return applyFunctions(client, functions, applied.length > 0);
        },
  );
}
