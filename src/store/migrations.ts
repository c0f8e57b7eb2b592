import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** One numbered SQL file from `migrations/<dialect>/`. */
export interface Migration {
  /** File name, e.g. `0001_gateway.sql`; also the id recorded as applied. */
  name: string;
  sql: string;
}

/** The package's `migrations/` folder: two levels up from both `src/store/` and `dist/store/`. */
export const MIGRATIONS_ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'migrations');

const MIGRATION_FILE = /^\d{4}_[a-z0-9_]+\.sql$/;

/**
 * Reads the append-only migrations of one dialect, in order. Files are
 * numbered `NNNN_name.sql`; anything else in the folder is ignored.
 */
export function loadMigrations(dialect: 'sqlite' | 'postgres', root = MIGRATIONS_ROOT): Migration[] {
  const dir = join(root, dialect);
  return readdirSync(dir)
    .filter((name) => MIGRATION_FILE.test(name))
    .sort()
    .map((name) => ({ name, sql: readFileSync(join(dir, name), 'utf8') }));
}
