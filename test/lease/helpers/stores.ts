import { rmSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { createTestSchema, POSTGRES_URL } from '../../helpers/postgres.js';
import { createPostgresJobStore } from '../../../src/lease/postgres/store.js';
import { createSqliteJobStore } from '../../../src/lease/sqlite/store.js';
import { openSqlite } from '../../../src/db/sqlite-open.js';
import type { JobStore, JobStoreOptions, StoreDescriptor } from '../../../src/lease/types.js';
import { tempDir } from '../../helpers/temp.js';

export { POSTGRES_URL };

/** Time columns of tool_jobs that tests may move into the past. */
export type TimeColumn = 'lease_until' | 'run_after' | 'deadline_at';

/**
 * A database for one test file, and a way to open stores on it. Expiry is
 * reached by moving rows into the past in SQL, never by faking a clock (G6).
 */
export interface TestDatabase {
  dialect: 'sqlite' | 'postgres';
  /** What child processes and the heartbeat thread use to reach the same database. */
  descriptor: StoreDescriptor;
  open(options?: JobStoreOptions): Promise<JobStore>;
  /** Raw SQL: `?` params on SQLite, `$1` on PostgreSQL. */
  sql<R = Record<string, unknown>>(text: string, params?: unknown[]): Promise<R[]>;
  /** Moves a time column of one job (or all jobs) `ms` into the past. */
  backdate(column: TimeColumn, ms: number, id?: number): Promise<void>;
  /** Expires a job's lease (or every lease) as if an hour had passed. */
  expireLease(id?: number): Promise<void>;
  /**
   * Holds the write lock on tool_jobs until the returned function is called,
   * so every writer (the heartbeat thread too) waits and times out: the
   * database is unreachable for writes.
   */
  lockWrites(): Promise<() => Promise<void>>;
  dispose(): Promise<void>;
}

export type TestDatabaseFactory = () => Promise<TestDatabase>;

/** A fresh SQLite file in its own temp dir. */
export const sqliteDatabase: TestDatabaseFactory = async () => {
  const dir = tempDir('fencegate-lease-').dir;
  const path = join(dir, 'jobs.db');
  const stores: JobStore[] = [createSqliteJobStore({ path })]; // migrates
  const raw = openSqlite(path);
  const backdate = async (column: TimeColumn, ms: number, id?: number) => {
    raw.prepare(`UPDATE tool_jobs SET ${column} = ${column} - ? WHERE ? IS NULL OR id = ?`).run(ms, id ?? null, id ?? null);
  };
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
    backdate,
    expireLease: (id) => backdate('lease_until', 3_600_000, id),
    async lockWrites() {
      const holder = openSqlite(path);
      holder.exec('BEGIN IMMEDIATE');
      return async () => {
        holder.exec('ROLLBACK');
        holder.close();
      };
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
  const schema = await createTestSchema('lease');
  const stores: JobStore[] = [await createPostgresJobStore({ pool: schema.pool, connectionString: schema.url })];
  const backdate = async (column: TimeColumn, ms: number, id?: number) => {
    await schema.pool.query(`UPDATE tool_jobs SET ${column} = ${column} - $1::bigint * interval '1 millisecond' WHERE $2::bigint IS NULL OR id = $2`, [
      ms,
      id ?? null,
    ]);
  };
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
    backdate,
    expireLease: (id) => backdate('lease_until', 3_600_000, id),
    async lockWrites() {
      const holder = new pg.Client({ connectionString: schema.url });
      await holder.connect();
      await holder.query('BEGIN');
      // EXCLUSIVE blocks every UPDATE, allows plain reads.
      await holder.query('LOCK TABLE tool_jobs IN EXCLUSIVE MODE');
      return async () => {
        await holder.query('ROLLBACK');
        await holder.end();
      };
    },
    async dispose() {
      for (const s of stores) await s.close();
      await schema.drop();
    },
  };
};

/** Both backends, PostgreSQL only when FENCEGATE_TEST_POSTGRES_URL is set. */
export const BACKENDS: { name: 'sqlite' | 'postgres'; factory: TestDatabaseFactory; skip: boolean }[] = [
  { name: 'sqlite', factory: sqliteDatabase, skip: false },
  { name: 'postgres', factory: postgresDatabase, skip: !POSTGRES_URL },
];
