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
export const FUNCTION_FILES = [
  'ms_between.sql',
  'log_rejection.sql',
  'admit.sql',
  'finish.sql',
  'group_finish.sql',
  'group_admit.sql',
  'release_unsent.sql',
  'extend_lock.sql',
] as const;

/**
 * The last migration that may define a PostgreSQL function. Up to it,
 * migrations restated the functions (0003, 0005, 0006 and 0009 hold copies
 * of older or equal bodies; shipped files are never edited, DESIGN §4.5).
 * Every later migration changes tables, indexes and types only: the one
 * definition of a function is its file in ./sql (DESIGN §4.1), and
 * test/db/postgres-functions.test.ts scans the migrations for a copy.
 */
export const LAST_MIGRATION_WITH_FUNCTIONS = '0009_rejection_tool.sql';

const ROUTINE = /\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\s+((?:"[^"]+"|[\w$]+)(?:\s*\.\s*(?:"[^"]+"|[\w$]+))?)/gi;

/**
 * The routines a SQL text creates (`CREATE [OR REPLACE] FUNCTION|PROCEDURE
 * name`), in order, comments left out (a comment may name the statement it
 * explains). A statement inside a dollar-quoted body counts too: a migration
 * has no business creating one there either.
 */
export function definedRoutines(sql: string): string[] {
  const code = sql.replace(/\/\*[\s\S]*?\*\//g, ' ').replace(/--[^\n]*/g, ' ');
  return [...code.matchAll(ROUTINE)].map((m) => m[1]!.replace(/\s+/g, '').replace(/"/g, ''));
}

/**
 * The migrations after `lastWithFunctions` that create a routine, each with
 * the routines it creates: what must be empty (a function changes in its
 * ./sql file, never in a migration).
 */
export function functionsInMigrations(
  migrations: readonly { name: string; sql: string }[],
  lastWithFunctions: string = LAST_MIGRATION_WITH_FUNCTIONS,
): { migration: string; routines: string[] }[] {
  return migrations
    .filter((m) => m.name > lastWithFunctions)
    .map((m) => ({ migration: m.name, routines: definedRoutines(m.sql) }))
    .filter((m) => m.routines.length > 0);
}

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
 * records, or all of them when `force`: a migration ran, and it may have
 * restated a function with an older body (a database upgraded from before
 * LAST_MIGRATION_WITH_FUNCTIONS runs those), or changed a table or type a
 * function is built on. Runs on the migrator's client, inside its
 * transaction and advisory lock, so a replica still serving (the previous
 * release during a rolling upgrade, DESIGN §8.2) never sees the new tables
 * with the old functions, nor an old body left by a migration. Returns
 * `functions/<file>` for each applied.
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
