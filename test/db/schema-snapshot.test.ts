/**
 * The whole current schema, one readable file per dialect, committed beside
 * this test: a freshly migrated gateway database and lease database, as every
 * migration (and, on PostgreSQL, every function file) leaves them. A
 * migration or function file that changes the schema fails this test until
 * the snapshot is updated with it, so the change shows up in review:
 *
 *   UPDATE_SNAPSHOTS=1 npx vitest run test/db/schema-snapshot.test.ts
 *
 * (with FENCEGATE_TEST_POSTGRES_URL set, or the PostgreSQL file is not written).
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { migrateLeasePostgres, migrateLeaseSqlite } from '../../src/lease/migrate.js';
import { migratePostgres } from '../../src/store/postgres/migrate.js';
import { migrateSqlite } from '../../src/store/sqlite/migrate.js';
import { openSqlite } from '../../src/db/sqlite-open.js';
import { createTestSchema, POSTGRES_URL } from '../helpers/postgres.js';
import { dumpPostgres, dumpSqlite } from './schema-dump.js';

const UPDATE = 'UPDATE_SNAPSHOTS=1 npx vitest run test/db/schema-snapshot.test.ts';
const here = (name: string) => fileURLToPath(new URL(name, import.meta.url));

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function header(dialect: string, sources: string): string {
  return [
    `-- fencegate: the whole current ${dialect} schema of a freshly migrated database.`,
    `-- Generated from ${sources}; do not edit.`,
    `-- Compared by test/db/schema-snapshot.test.ts; after a deliberate change: ${UPDATE}`,
    '',
  ].join('\n');
}

/** Writes the snapshot (UPDATE_SNAPSHOTS=1) or compares with it, naming the command that updates it. */
function matchSnapshot(file: string, actual: string): void {
  const path = here(file);
  if (process.env.UPDATE_SNAPSHOTS === '1') {
    writeFileSync(path, actual);
    return;
  }
  let expected: string;
  try {
    expected = readFileSync(path, 'utf8');
  } catch {
    throw new Error(`test/db/${file} is missing: create it with ${UPDATE}`);
  }
  expect(actual, `the schema differs from test/db/${file}. If the change is intended: ${UPDATE}`).toBe(expected);
}

describe('schema snapshot', () => {
  it('SQLite (and D1: the gateway part is migrations_dir): gateway database and lease database', () => {
    const dir = mkdtempSync(join(tmpdir(), 'fencegate-schema-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const gateway = openSqlite(join(dir, 'gateway.db'));
    const lease = openSqlite(join(dir, 'jobs.db'));
    cleanups.push(() => {
      gateway.close();
      lease.close();
    });
    migrateSqlite(gateway);
    migrateLeaseSqlite(lease);
    const text =
      header('SQLite', 'migrations/gateway/sqlite and migrations/lease/sqlite') +
      '\n-- ===== gateway database (migrations/gateway/sqlite; D1 too) =====\n\n' +
      dumpSqlite(gateway) +
      '\n-- ===== lease database (migrations/lease/sqlite) =====\n\n' +
      dumpSqlite(lease);
    matchSnapshot('schema.sqlite.snapshot.sql', text);
  });

  it.skipIf(!POSTGRES_URL)('PostgreSQL: gateway schema (migrations and function files) and lease schema', async () => {
    const gateway = await createTestSchema('fg_snap_gw', 2);
    const lease = await createTestSchema('fg_snap_lease', 2);
    cleanups.push(
      () => gateway.drop(),
      () => lease.drop(),
    );
    await migratePostgres(gateway.pool);
    await migrateLeasePostgres(lease.pool);
    const text =
      header('PostgreSQL', 'migrations/gateway/postgres, src/store/postgres/sql and migrations/lease/postgres') +
      '\n-- ===== gateway schema (migrations/gateway/postgres, then src/store/postgres/sql) =====\n\n' +
      (await dumpPostgres(gateway.pool, gateway.schema)) +
      '\n-- ===== lease schema (migrations/lease/postgres) =====\n\n' +
      (await dumpPostgres(lease.pool, lease.schema));
    matchSnapshot('schema.postgres.snapshot.sql', text);
  });
});
