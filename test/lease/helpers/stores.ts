import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../../helpers/postgres.js';
import { createPostgresJobStore } from '../../../src/lease/postgres/store.js';
import { createSqliteJobStore } from '../../../src/lease/sqlite/store.js';
import type { JobStore, JobStoreOptions } from '../../../src/lease/types.js';

export { POSTGRES_URL };

/**
 * A database for one test file, and a way to open stores on it. `sql` runs
 * raw SQL on it (to backdate leases, read rows, EXPLAIN), with `$1`-style
 * params on PostgreSQL and `?` on SQLite.
 */
export interface TestDatabase {
  dialect: 'sqlite' | 'postgres';
  /** What child processes and the heartbeat thread use to reach the same database. */
  descriptor: { sqlite: string } | { postgres: string };
  open(options?: JobStoreOptions): Promise<JobStore>;
  sql<R = Record<string, unknown>>(text: string, params?: unknown[]): Promise<R[]>;
  /** Moves a job's lease into the past, as if it had expired (DB clock untouched). */
  expireLease(id: number): Promise<void>;
  dispose(): Promise<void>;
}

export type TestDatabaseFactory = () => Promise<TestDatabase>;

/** A fresh SQLite file in its own temp dir. */
export const sqliteDatabase: TestDatabaseFactory = async () => {
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-lease-'));
  const path = join(dir, 'jobs.db');
  const stores: JobStore[] = [];
  const admin = createSqliteJobStore({ path });
  stores.push(admin);
  const { openSqlite } = await import('../../../src/store/sqlite/open.js');
  const raw = openSqlite(path);
  return {
    dialect: 'sqlite',
    descriptor: { sqlite: path },
    async open(options = {}) {
      const store = createSqliteJobStore({ ...options, path, migrate: false });
      stores.push(store);
      return store;
    },
    async sql(text, params = []) {
      const stmt = raw.prepare(text);
      return (stmt.reader ? stmt.all(...params) : (stmt.run(...params), [])) as never[];
    },
    async expireLease(id) {
      raw.prepare('UPDATE tool_jobs SET lease_until = lease_until - 3600000 WHERE id = ?').run(id);
    },
    async dispose() {
      for (const s of stores) await s.close();
      raw.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
};

/** A fresh PostgreSQL schema (needs FENCEGATE_TEST_POSTGRES_URL). */
export const postgresDatabase: TestDatabaseFactory = async () => {
  const schema: TestSchema = await createTestSchema('lease');
  const stores: JobStore[] = [];
  const admin = await createPostgresJobStore({ pool: schema.pool, connectionString: schema.url });
  stores.push(admin);
  return {
    dialect: 'postgres',
    descriptor: { postgres: schema.url },
    async open(options = {}) {
      const store = await createPostgresJobStore({ ...options, connectionString: schema.url, migrate: false });
      stores.push(store);
      return store;
    },
    async sql(text, params = []) {
      return (await schema.pool.query(text, params)).rows;
    },
    async expireLease(id) {
      await schema.pool.query("UPDATE tool_jobs SET lease_until = lease_until - interval '1 hour' WHERE id = $1", [id]);
    },
    async dispose() {
      for (const s of stores) await s.close();
      await schema.drop();
    },
  };
};
