import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { ClientLike } from '../../db/postgres-types.js';

/** One file of ./sql: the current definition of one function (and its overloads). */
export interface SqlFunctionFile {
  /** File name, e.g. `admit.sql`; the key of its row in fencegate_functions. */
  name: string;
  sql: string;
  sha256: string;
}

/**
 * The package's `src/store/postgres/sql/` folder, found from both
 * `src/store/postgres/` and `dist/store/postgres/` (three levels below the
 * package root): tsc does not copy .sql files, so the package ships the
 * folder itself (package.json `files`), as it ships `migrations/`.
 */
export const FUNCTIONS_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'src', 'store', 'postgres', 'sql');

/**
 * The order they are applied in: a LANGUAGE sql function is checked against
 * the functions it calls when it is created (plpgsql bodies only when they
 * run), so a callee comes before its callers.
 */
export const FUNCTION_FILES = ['ms_between.sql', 'log_rejection.sql', 'admit.sql', 'finish.sql', 'group_finish.sql', 'group_admit.sql', 'release_unsent.sql'] as const;

/** Reads ./sql in FUNCTION_FILES order; a file there that the list does not name is an error, not skipped. */
export function loadFunctions(dir = FUNCTIONS_DIR): SqlFunctionFile[] {
  const present = readdirSync(dir).filter((n) => n.endsWith('.sql'));
  const unknown = present.filter((n) => !(FUNCTION_FILES as readonly string[]).includes(n));
  if (unknown.length > 0) throw new Error(`${dir}: ${unknown.join(', ')} not listed in FUNCTION_FILES`);
  return FUNCTION_FILES.map((name) => {
    const sql = readFileSync(join(dir, name), 'utf8');
    return { name, sql, sha256: createHash('sha256').update(sql).digest('hex') };
  });
}

/**
 * Applies the function files whose sha256 is not the one fencegate_functions
 * records, or all of them when `force` (a migration ran: it may have restated
 * a function with an older body). Runs on the migrator's client, inside its
 * transaction and advisory lock. Returns `functions/<file>` for each applied.
 */
export async function applyFunctions(client: ClientLike, files: SqlFunctionFile[], force: boolean): Promise<string[]> {
  await client.query(`CREATE TABLE IF NOT EXISTS fencegate_functions (
    name       text        PRIMARY KEY,
    sha256     text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
  )`);
  const { rows } = await client.query<{ name: string; sha256: string }>('SELECT name, sha256 FROM fencegate_functions');
  const recorded = new Map(rows.map((r) => [r.name, r.sha256]));
  const applied: string[] = [];
  for (const f of files) {
    if (!force && recorded.get(f.name) === f.sha256) continue;
    await client.query(f.sql);
    await client.query(
      `INSERT INTO fencegate_functions (name, sha256) VALUES ($1, $2)
       ON CONFLICT (name) DO UPDATE SET sha256 = excluded.sha256, applied_at = now()`,
      [f.name, f.sha256],
    );
    applied.push(`functions/${f.name}`);
  }
  return applied;
}
