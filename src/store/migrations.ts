// The migration files and their ledgers belong to the database plumbing that
// the gateway and the lease module share (src/db/migrations.ts).
import { loadSingleLedgerHistory, type Dialect, type Migration } from '../db/migrations.js';

export { MIGRATIONS_ROOT, type Migration } from '../db/migrations.js';

/**
 * Every migration of a dialect, gateway and lease, in the order the releases
 * before the split applied them under one ledger: for rebuilding such a
 * database in upgrade tests and benchmarks. A store migrates its own part
 * (src/db/migrations.ts `loadMigrations(part, dialect)`).
 */
export function loadMigrations(dialect: Dialect): Migration[] {
  return loadSingleLedgerHistory(dialect);
}
