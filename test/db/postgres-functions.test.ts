/**
 * One current definition per PostgreSQL function (src/store/postgres/sql):
 * the migrator applies a function file after the migrations when its sha256
 * is not the one fencegate_functions records, and all of them after any
 * migration ran, in the migration transaction, under its advisory lock.
 *
 * Negative control: the files applied by checksum alone, after a migration
 * that restates a function with an older body, leave that older body in
 * place: the re-apply after migrations is what prevents it.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { loadMigrations, LEDGERS, type Migration } from '../../src/db/migrations.js';
import { applyPostgresMigrations } from '../../src/db/postgres-migrate.js';
import { applyFunctions, FUNCTION_FILES, FUNCTIONS_DIR, loadFunctions } from '../../src/store/postgres/functions.js';
import { migratePostgres } from '../../src/store/postgres/migrate.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const APPLIED_ALL = FUNCTION_FILES.map((f) => `functions/${f}`);

describe('PostgreSQL function files: loading and shipping', () => {
  it('lists every .sql file of the folder; an unlisted file is an error, not skipped', () => {
    expect(loadFunctions().map((f) => f.name)).toEqual([...FUNCTION_FILES]);
    const dir = mkdtempSync(join(tmpdir(), 'fencegate-sql-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    for (const f of FUNCTION_FILES) writeFileSync(join(dir, f), readFileSync(join(FUNCTIONS_DIR, f)));
    expect(loadFunctions(dir)).toHaveLength(FUNCTION_FILES.length);
    writeFileSync(join(dir, 'sweep.sql'), 'SELECT 1;');
    expect(() => loadFunctions(dir)).toThrow(/sweep\.sql not listed in FUNCTION_FILES/);
  });

  it('the folder ships in the package (tsc does not copy .sql; dist/ reads it from the same place)', () => {
    const root = fileURLToPath(new URL('../../', import.meta.url));
    const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { files: string[] };
    const rel = relative(root, FUNCTIONS_DIR).split('\\').join('/');
    expect(pkg.files.some((f) => rel === f || rel.startsWith(`${f}/`))).toBe(true);
    expect(pkg.files).toContain('migrations');
  });
});

describe.skipIf(!POSTGRES_URL)('PostgreSQL function files: applied by checksum', () => {
  const fresh = async (prefix: string): Promise<TestSchema> => {
    const s = await createTestSchema(prefix, 6);
    cleanups.push(() => s.drop());
    return s;
  };
  /** Every function of the schema: signature -> body. */
  const bodies = async (s: TestSchema) =>
    new Map(
      (
        await s.pool.query<{ sig: string; src: string }>(
          `SELECT proname || '(' || pg_get_function_identity_arguments(oid) || ')' AS sig, prosrc AS src
           FROM pg_proc WHERE pronamespace = $1::regnamespace ORDER BY 1`,
          [s.schema],
        )
      ).rows.map((r) => [r.sig, r.src]),
    );

  it('a new schema ends with exactly the bodies of migration 0006 (the files are copies of them)', async () => {
    const byMigrations = await fresh('fg_fn_mig');
    const byFiles = await fresh('fg_fn_files');
    await migratePostgres(byMigrations.pool, loadMigrations('gateway', 'postgres'), []);
    expect(await migratePostgres(byFiles.pool)).toEqual([...loadMigrations('gateway', 'postgres').map((m) => m.name), ...APPLIED_ALL]);
    const expected = await bodies(byMigrations);
    expect([...expected.keys()]).toHaveLength(6); // admit ×2, finish ×2, log_rejection, ms_between
    // fencegate_admit_many, fencegate_finish_many and fencegate_release_unsent (group_admit.sql, group_finish.sql,
    // release_unsent.sql) are newer than the migrations: they live only in their files.
    const fromFiles = await bodies(byFiles);
    expect([...fromFiles.keys()].filter((sig) => !expected.has(sig)).map((sig) => sig.split('(')[0])).toEqual(['fencegate_admit_many', 'fencegate_finish_many', 'fencegate_release_unsent']);
    for (const sig of [...fromFiles.keys()]) if (!expected.has(sig)) fromFiles.delete(sig);
    expect(fromFiles).toEqual(expected);
    const ledger = await byFiles.pool.query('SELECT name, sha256 FROM fencegate_functions ORDER BY name');
    expect(ledger.rows).toEqual(loadFunctions().map((f) => ({ name: f.name, sha256: f.sha256 })).sort((a, b) => a.name.localeCompare(b.name)));
    expect(await migratePostgres(byFiles.pool)).toEqual([]);
  });

  it('a changed file is applied (that one only), and recorded; the same file again is not', async () => {
    const s = await fresh('fg_fn_change');
    await migratePostgres(s.pool);
    const files = loadFunctions().map((f) =>
      f.name === 'admit.sql' ? { ...f, sql: f.sql.replace('IF v_pass > 10 THEN', 'IF v_pass > 12 THEN'), sha256: 'changed' } : f,
    );
    expect(files.find((f) => f.name === 'admit.sql')!.sql).toContain('v_pass > 12');
    expect(await migratePostgres(s.pool, loadMigrations('gateway', 'postgres'), files)).toEqual(['functions/admit.sql']);
    const admit = [...(await bodies(s)).entries()].find(([sig]) => sig.startsWith('fencegate_admit(') && sig.includes('p_log_key'))!;
    expect(admit[1]).toContain('IF v_pass > 12 THEN');
    expect((await s.pool.query("SELECT sha256 FROM fencegate_functions WHERE name = 'admit.sql'")).rows[0]).toEqual({ sha256: 'changed' });
    expect(await migratePostgres(s.pool, loadMigrations('gateway', 'postgres'), files)).toEqual([]);
    // Back to the file as it is: applied again.
    expect(await migratePostgres(s.pool)).toEqual(['functions/admit.sql']);
  });

  /** A later migration restating fencegate_ms_between with another body, as 0005 and 0006 restated admit. */
  const restate: Migration = {
    name: '9999_restate_ms_between.sql',
    sql: 'CREATE OR REPLACE FUNCTION fencegate_ms_between(a timestamptz, b timestamptz) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$ SELECT 0::bigint $$;',
  };
  const msBetween = async (s: TestSchema) => [...(await bodies(s)).entries()].find(([sig]) => sig.startsWith('fencegate_ms_between('))![1];

  it('after a migration ran, every file is applied again: an old migration never leaves its body behind', async () => {
    const s = await fresh('fg_fn_force');
    await migratePostgres(s.pool);
    expect(await migratePostgres(s.pool, [...loadMigrations('gateway', 'postgres'), restate], loadFunctions())).toEqual([restate.name, ...APPLIED_ALL]);
    expect(await msBetween(s)).toContain('ceil(extract(epoch');
  });

  it('negative control: by checksum alone, the restated body stays', async () => {
    const s = await fresh('fg_fn_noforce');
    await migratePostgres(s.pool);
    const files = loadFunctions();
    const applied = await applyPostgresMigrations(s.pool, LEDGERS.gateway, [...loadMigrations('gateway', 'postgres'), restate], (client) =>
      applyFunctions(client, files, false),
    );
    expect(applied).toEqual([restate.name]);
    expect(await msBetween(s)).toContain('SELECT 0::bigint');
  });

  it('replicas starting at once: each migration and each function file is applied exactly once', async () => {
    const s = await fresh('fg_fn_race');
    const runs = await Promise.all([1, 2, 3, 4].map(() => migratePostgres(s.pool)));
    const all = runs.flat();
    expect(all.sort()).toEqual([...loadMigrations('gateway', 'postgres').map((m) => m.name), ...APPLIED_ALL].sort());
    expect((await s.pool.query('SELECT count(*)::int AS n FROM fencegate_functions')).rows[0]).toEqual({ n: FUNCTION_FILES.length });
  });

  it('a failing function file rolls the whole run back, migrations included', async () => {
    const s = await fresh('fg_fn_fail');
    const broken = loadFunctions().map((f) => (f.name === 'finish.sql' ? { ...f, sql: `${f.sql}\nSELECT no_such_function();` } : f));
    await expect(migratePostgres(s.pool, loadMigrations('gateway', 'postgres'), broken)).rejects.toThrow(/no_such_function/);
    const left = await s.pool.query("SELECT count(*)::int AS n FROM information_schema.tables WHERE table_schema = $1", [s.schema]);
    expect(left.rows[0]).toEqual({ n: 0 });
  });
});
