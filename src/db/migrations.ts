import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export type Dialect = 'sqlite' | 'postgres';

/**
 * Who owns a schema: the gateway (its tables in the gateway's database) or
 * the lease module (the job tables in a worker's database). Each part has its
 * own folder, `migrations/<part>/<dialect>/`, and its own ledger.
 */
export type SchemaPart = 'gateway' | 'lease';

/** One numbered SQL file from `migrations/<part>/<dialect>/`. */
export interface Migration {
  /** File name, e.g. `0001_gateway.sql`; also the id recorded as applied. */
  name: string;
  sql: string;
}

/** The package's `migrations/` folder: two levels up from both `src/db/` and `dist/db/`. */
export const MIGRATIONS_ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'migrations');

const MIGRATION_FILE = /^\d{4}_[a-z0-9_]+\.sql$/;

/**
 * Reads the append-only migrations of one part and dialect, in order. Files
 * are numbered `NNNN_name.sql`; anything else in the folder is ignored.
 * Numbers are one sequence across both parts (the releases before the split
 * kept every file in one folder and one ledger), so a number is never reused.
 */
export function loadMigrations(part: SchemaPart, dialect: Dialect, root = MIGRATIONS_ROOT): Migration[] {
  const dir = join(root, part, dialect);
  return readdirSync(dir)
    .filter((name) => MIGRATION_FILE.test(name))
    .sort()
    .map((name) => ({ name, sql: readFileSync(join(dir, name), 'utf8') }));
}

/**
 * Every migration of a dialect, both parts, in the one order the releases
 * before the split applied them under the one ledger `fencegate_migrations`.
 * Only for rebuilding such a database (upgrade tests, benchmarks of an
 * earlier schema); a store migrates its own part.
 */
export function loadSingleLedgerHistory(dialect: Dialect, root = MIGRATIONS_ROOT): Migration[] {
  return [...loadMigrations('gateway', dialect, root), ...loadMigrations('lease', dialect, root)].sort((a, b) =>
    a.name < b.name ? -1 : a.name > b.name ? 1 : 0,
  );
}

/** The table that records which migrations of one part a database has. */
export interface Ledger {
  table: string;
  /**
   * A ledger of an earlier layout whose rows count as applied here. A
   * database created before the split holds both parts' migrations in
   * `fencegate_migrations`; the lease part takes over its own rows from it
   * instead of running them again (its `ALTER TABLE … ADD COLUMN` would fail
   * on SQLite, and a re-run would hide which release created a table).
   */
  adoptFrom?: string;
}

export const LEDGERS: Record<SchemaPart, Ledger> = {
  // The gateway keeps the name of the single ledger: D1 and existing
  // databases already hold its rows, and it ignores the lease's rows in it.
  gateway: { table: 'fencegate_migrations' },
  lease: { table: 'fencegate_lease_migrations', adoptFrom: 'fencegate_migrations' },
};

const IDENT = /^[a-z_][a-z0-9_]*$/;

/** Ledger names are interpolated into SQL: only plain lowercase identifiers. */
export function checkLedger(ledger: Ledger): void {
  for (const t of [ledger.table, ledger.adoptFrom]) {
    if (t !== undefined && !IDENT.test(t)) throw new Error(`invalid ledger table name: ${t}`);
  }
}
