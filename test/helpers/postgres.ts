import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { POSTGRES_SKIP_NOTICE } from './postgres-notice.js';

/** The PostgreSQL server for tests; CI sets it, a fresh laptop may not. */
export const POSTGRES_URL = process.env.FENCEGATE_TEST_POSTGRES_URL;

// Said once per run by the globalSetup (./postgres-notice.setup.ts), which
// sets FENCEGATE_PG_SKIP_NOTICE for the workers; a run without that setup
// (another vitest config) still hears it, once per process.
if (!POSTGRES_URL && !process.env.FENCEGATE_PG_SKIP_NOTICE) {
  process.env.FENCEGATE_PG_SKIP_NOTICE = '1';
  console.warn(POSTGRES_SKIP_NOTICE);
}

export interface TestSchema {
  /** A pool whose every connection uses the fresh schema as its search_path. */
  pool: pg.Pool;
  schema: string;
  /** Connection string that selects the schema (for child processes). */
  url: string;
  /** Ends the pool and drops the schema. */
  drop(): Promise<void>;
}

/** Creates a fresh schema, so that every test file has its own tables. */
export async function createTestSchema(prefix = 'fg', max = 10): Promise<TestSchema> {
  if (!POSTGRES_URL) throw new Error('FENCEGATE_TEST_POSTGRES_URL is not set');
  const schema = `${prefix}_${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: POSTGRES_URL });
  await admin.connect();
  await admin.query(`CREATE SCHEMA ${schema}`);
  await admin.end();
  const url = withSearchPath(POSTGRES_URL, schema);
  const pool = new pg.Pool({ connectionString: url, max });
  return {
    pool,
    schema,
    url,
    async drop() {
      await pool.end();
      const c = new pg.Client({ connectionString: POSTGRES_URL });
      await c.connect();
      await c.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await c.end();
    },
  };
}

/** Adds `options=-c search_path=<schema>` to a connection string. */
export function withSearchPath(url: string, schema: string): string {
  const u = new URL(url);
  u.searchParams.set('options', `-c search_path=${schema}`);
  return u.toString();
}
