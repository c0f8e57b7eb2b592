/**
 * One definition per PostgreSQL function: its file in src/store/postgres/sql
 * (DESIGN §4.1). The migrator applies a function file after the migrations
 * when its sha256 is not the one fencegate_functions records, and all of them
 * after any migration ran, in the migration transaction, under its advisory
 * lock. Migrations change tables, indexes and types; none after
 * LAST_MIGRATION_WITH_FUNCTIONS creates a function.
 *
 * Checked here: a fresh install, an upgrade from the gateway schema of every
 * earlier release (each prefix of the migration list, then today's migrator)
 * and the files applied alone all give the same functions
 * (`pg_get_functiondef` of every fencegate_% function); and no migration
 * after the cut-over creates one (a static scan). A replica of an older
 * release never applies its files over a newer release's.
 *
 * Negative controls: a migration after the cut-over that carries a stale
 * function copy is named by the scan, and a migrator going by checksums
 * alone leaves its body, which the comparison reports (as it reports the
 * functions missing after such a migrator upgraded the first schema); an
 * edited file that a migrator does not apply is reported against the files.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { loadMigrations, LEDGERS, type Migration } from '../../src/db/migrations.js';
import { applyPostgresMigrations } from '../../src/db/postgres-migrate.js';
import {
  applyFunctions,
  definedRoutines,
  FUNCTION_FILES,
  FUNCTIONS_DIR,
  functionsInMigrations,
  LAST_MIGRATION_WITH_FUNCTIONS,
  loadFunctions,
  type SqlFunctionFile,
} from '../../src/store/postgres/functions.js';
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

  const GATEWAY = loadMigrations('gateway', 'postgres');

  /**
   * Every fencegate_% function of a schema: its identity signature and its
   * whole definition (`pg_get_functiondef`: arguments, defaults, result,
   * language, volatility, settings, body), the schema's own name taken out.
   */
  const definitions = async (s: TestSchema): Promise<Map<string, string>> => {
    const { rows } = await s.pool.query<{ sig: string; def: string }>(
      `SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' AS sig, pg_get_functiondef(p.oid) AS def
       FROM pg_proc p WHERE p.pronamespace = $1::regnamespace AND p.proname LIKE 'fencegate\\_%' ORDER BY 1`,
      [s.schema],
    );
    return new Map(rows.map((r) => [r.sig, r.def.split(`${s.schema}.`).join('').split(s.schema).join('<schema>')]));
  };

  /** What differs between two sets of definitions, one line per function; empty when they are the same. */
  const differences = (got: Map<string, string>, want: Map<string, string>): string[] => [
    ...[...want.keys()].filter((sig) => !got.has(sig)).map((sig) => `missing ${sig}`),
    ...[...got.keys()].filter((sig) => !want.has(sig)).map((sig) => `extra ${sig}`),
    ...[...want.keys()].filter((sig) => got.has(sig) && got.get(sig) !== want.get(sig)).map((sig) => `differs ${sig}`),
  ];

  /**
   * The files themselves: the tables of every migration, every function the
   * migrations created dropped, then the files run in FUNCTION_FILES order.
   * What is left comes from the files alone.
   */
  const byFilesAlone = async (files: SqlFunctionFile[] = loadFunctions()): Promise<Map<string, string>> => {
    const s = await fresh('fg_fn_alone');
    await migratePostgres(s.pool, GATEWAY, []);
    const { rows } = await s.pool.query<{ f: string }>('SELECT p.oid::regprocedure::text AS f FROM pg_proc p WHERE p.pronamespace = $1::regnamespace', [
      s.schema,
    ]);
    for (const r of rows) await s.pool.query(`DROP FUNCTION ${r.f}`);
    expect(await definitions(s)).toEqual(new Map());
    for (const f of files) await s.pool.query(f.sql);
    return definitions(s);
  };

  /** fencegate_functions as a migrator leaves it after applying today's files, the bodies left as they are. */
  const recordFiles = async (s: TestSchema) => {
    await s.pool.query('CREATE TABLE fencegate_functions (name text PRIMARY KEY, sha256 text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())');
    for (const f of loadFunctions()) await s.pool.query('INSERT INTO fencegate_functions (name, sha256) VALUES ($1, $2)', [f.name, f.sha256]);
  };

  it('no migration after the cut-over creates a function (static scan)', () => {
    const names = GATEWAY.map((m) => m.name);
    expect(names).toContain(LAST_MIGRATION_WITH_FUNCTIONS);
    expect(functionsInMigrations(GATEWAY)).toEqual([]);
    // The scan sees the copies the migrations up to the cut-over hold (history, never edited).
    expect(functionsInMigrations(GATEWAY, '0000').map((m) => m.migration)).toEqual([
      '0003_gateway_functions.sql',
      '0005_gateway_fence_history.sql',
      '0006_gateway_clock_retention.sql',
      LAST_MIGRATION_WITH_FUNCTIONS,
    ]);
    // The lease part never had any.
    expect(functionsInMigrations(loadMigrations('lease', 'postgres'), '0000')).toEqual([]);
  });

  it('negative control: a migration after the cut-over that carries a function copy is named', () => {
    const msBetween = loadFunctions().find((f) => f.name === 'ms_between.sql')!.sql;
    const stale: Migration = { name: '0010_stale_copy.sql', sql: `ALTER TABLE rejections ADD COLUMN note text;\n${msBetween}` };
    const quoted: Migration = { name: '0011_procedure.sql', sql: 'create procedure "public"."fencegate_x"() language sql as $$ select 1 $$;' };
    const commentOnly: Migration = {
      name: '0012_comment.sql',
      sql: '-- no CREATE OR REPLACE FUNCTION here: see src/store/postgres/sql\n/* nor CREATE FUNCTION x */ SELECT 1;',
    };
    expect(functionsInMigrations([...GATEWAY, stale, quoted, commentOnly])).toEqual([
      { migration: '0010_stale_copy.sql', routines: ['fencegate_ms_between'] },
      { migration: '0011_procedure.sql', routines: ['public.fencegate_x'] },
    ]);
    expect(definedRoutines(commentOnly.sql)).toEqual([]);
  });

  it('fresh install, upgrade from every earlier gateway schema, and the files alone: the same functions', { timeout: 120_000 }, async () => {
    const fromFiles = await byFilesAlone();
    expect([...fromFiles.keys()].map((sig) => sig.split('(')[0])).toEqual([
      'fencegate_admit', // the 15-parameter signature of releases before 0006, kept for their replicas
      'fencegate_admit',
      'fencegate_admit_many',
      'fencegate_extend_lock',
      'fencegate_finish',
      'fencegate_finish',
      'fencegate_finish_many',
      'fencegate_log_rejection',
      'fencegate_ms_between',
      'fencegate_release_unsent',
    ]);

    const installed = await fresh('fg_fn_fresh');
    expect(await migratePostgres(installed.pool)).toEqual([...GATEWAY.map((m) => m.name), ...APPLIED_ALL]);
    expect(differences(await definitions(installed), fromFiles)).toEqual([]);
    const ledger = await installed.pool.query('SELECT name, sha256 FROM fencegate_functions ORDER BY name');
    expect(ledger.rows).toEqual(
      loadFunctions()
        .map((f) => ({ name: f.name, sha256: f.sha256 }))
        .sort((a, b) => a.name.localeCompare(b.name)),
    );
    expect(await migratePostgres(installed.pool)).toEqual([]);

    for (let k = 1; k < GATEWAY.length; k++) {
      const earlier = GATEWAY.slice(0, k);
      // As that release left it: its migrations, which defined its functions.
      const old = await fresh('fg_fn_up');
      await migratePostgres(old.pool, earlier, []);
      expect(await migratePostgres(old.pool), `upgrade from ${earlier.at(-1)!.name}`).toEqual([...GATEWAY.slice(k).map((m) => m.name), ...APPLIED_ALL]);
      expect(differences(await definitions(old), fromFiles), `upgrade from ${earlier.at(-1)!.name}`).toEqual([]);
      // Stronger: today's files already recorded by checksum at that schema
      // (the ledger of a release with function files; their bodies need
      // today's tables, so the bodies are the migrations'): a migrator that
      // went by the checksums alone would keep those bodies.
      const recorded = await fresh('fg_fn_uprec');
      await migratePostgres(recorded.pool, earlier, []);
      await recordFiles(recorded);
      expect(await migratePostgres(recorded.pool)).toEqual([...GATEWAY.slice(k).map((m) => m.name), ...APPLIED_ALL]);
      expect(differences(await definitions(recorded), fromFiles), `upgrade from ${earlier.at(-1)!.name} with the files recorded`).toEqual([]);
    }
  });

  it('negative control: applied by checksum alone, an upgrade from the first schema lacks the functions newer than the migrations', async () => {
    const fromFiles = await byFilesAlone();
    const s = await fresh('fg_fn_cksum');
    await migratePostgres(s.pool, GATEWAY.slice(0, 1), []);
    await recordFiles(s);
    const files = loadFunctions();
    expect(await applyPostgresMigrations(s.pool, LEDGERS.gateway, GATEWAY, (client) => applyFunctions(client, files, false))).toEqual(
      GATEWAY.slice(1).map((m) => m.name),
    );
    expect(differences(await definitions(s), fromFiles).map((d) => d.split('(')[0])).toEqual([
      'missing fencegate_admit_many',
      'missing fencegate_extend_lock',
      'missing fencegate_finish_many',
      'missing fencegate_release_unsent',
      // admit.sql changed after 0009 restated it (a refused admission leaves accepted_at; 0010's columns).
      'differs fencegate_admit',
      // finish.sql changed after 0006 restated it (0010: an unknown finish keeps its interim answer).
      'differs fencegate_finish',
    ]);
  });

  /** A migration after the cut-over carrying an older copy of fencegate_ms_between (no rounding up). */
  const staleCopy: Migration = {
    name: '0010_stale_copy.sql',
    sql: 'CREATE INDEX IF NOT EXISTS rejections_at_x ON rejections (at);\nCREATE OR REPLACE FUNCTION fencegate_ms_between(a timestamptz, b timestamptz) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$ SELECT (extract(epoch FROM (a - b)) * 1000)::bigint $$;',
  };

  it('negative control: a stale function copy in a migration is named by the scan, and left in place by checksums alone', async () => {
    expect(functionsInMigrations([...GATEWAY, staleCopy])).toEqual([{ migration: staleCopy.name, routines: ['fencegate_ms_between'] }]);
    const fromFiles = await byFilesAlone();
    // By checksum alone: the copy's body stays, and the comparison reports it.
    const s = await fresh('fg_fn_stale');
    await migratePostgres(s.pool);
    const files = loadFunctions();
    expect(await applyPostgresMigrations(s.pool, LEDGERS.gateway, [...GATEWAY, staleCopy], (client) => applyFunctions(client, files, false))).toEqual([
      staleCopy.name,
    ]);
    expect(differences(await definitions(s), fromFiles)).toEqual(['differs fencegate_ms_between(a timestamp with time zone, b timestamp with time zone)']);
    // Today's migrator applies every file after a migration ran: the file's body again.
    const t = await fresh('fg_fn_force');
    await migratePostgres(t.pool);
    expect(await migratePostgres(t.pool, [...GATEWAY, staleCopy], loadFunctions())).toEqual([staleCopy.name, ...APPLIED_ALL]);
    expect(differences(await definitions(t), fromFiles)).toEqual([]);
  });

  it('an edited file reaches an installed database; negative control: a migrator that skips it is reported', async () => {
    const edited = loadFunctions().map((f) => (f.name === 'ms_between.sql' ? { ...f, sql: f.sql.replace('* 1000)', '* 1000 + 0)'), sha256: 'edited' } : f));
    expect(edited.find((f) => f.name === 'ms_between.sql')!.sql).toContain('* 1000 + 0)');
    const want = await byFilesAlone(edited);
    expect(differences(want, await byFilesAlone())).toEqual(['differs fencegate_ms_between(a timestamp with time zone, b timestamp with time zone)']);

    const s = await fresh('fg_fn_edit');
    await migratePostgres(s.pool);
    expect(await migratePostgres(s.pool, GATEWAY, edited)).toEqual(['functions/ms_between.sql']);
    expect(differences(await definitions(s), want)).toEqual([]);

    // A migrator that applies the files only when a migration ran: the edit never arrives.
    const skipped = await fresh('fg_fn_skip');
    await migratePostgres(skipped.pool);
    expect(
      await applyPostgresMigrations(skipped.pool, LEDGERS.gateway, GATEWAY, (client, applied) =>
        applied.length > 0 ? applyFunctions(client, edited, true) : Promise.resolve([]),
      ),
    ).toEqual([]);
    expect(differences(await definitions(skipped), want)).toEqual(['differs fencegate_ms_between(a timestamp with time zone, b timestamp with time zone)']);
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

  it('a replica of an older release, starting on a schema a newer release migrated, leaves the newer functions; negative control: by checksum alone it puts its own back', async () => {
    const newerMigration: Migration = { name: '9990_newer_release.sql', sql: 'CREATE TABLE newer_release (id int)' };
    const newerFiles = loadFunctions().map((f) => (f.name === 'ms_between.sql' ? { ...f, sql: f.sql.replace('* 1000)', '* 1000 + 0)'), sha256: 'newer' } : f));
    const s = await fresh('fg_fn_older');
    await migratePostgres(s.pool, [...GATEWAY, newerMigration], newerFiles);
    const newer = await definitions(s);
    // This release is the older one: nothing to migrate, and its files are not applied.
    expect(await migratePostgres(s.pool)).toEqual([]);
    expect(differences(await definitions(s), newer)).toEqual([]);
    expect((await s.pool.query("SELECT sha256 FROM fencegate_functions WHERE name = 'ms_between.sql'")).rows).toEqual([{ sha256: 'newer' }]);
    const files = loadFunctions();
    expect(await applyPostgresMigrations(s.pool, LEDGERS.gateway, GATEWAY, (client) => applyFunctions(client, files, false))).toEqual([
      'functions/ms_between.sql',
    ]);
    expect(differences(await definitions(s), newer)).toEqual(['differs fencegate_ms_between(a timestamp with time zone, b timestamp with time zone)']);
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
    const left = await s.pool.query('SELECT count(*)::int AS n FROM information_schema.tables WHERE table_schema = $1', [s.schema]);
    expect(left.rows[0]).toEqual({ n: 0 });
  });
});
