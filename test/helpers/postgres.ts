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

/** Another session, holding rows until `release()`; `waiters()` counts the sessions its locks block right now. */
export interface HeldRows {
  client: pg.Client;
  waiters(): Promise<number>;
  release(): Promise<void>;
}

/** A session of its own on the schema, with a transaction open, for tests that hold rows another session's statement must wait for. */
export async function otherSession(schema: TestSchema): Promise<HeldRows> {
  const client = new pg.Client({ connectionString: schema.url });
  await client.connect();
  const pid = (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
  await client.query('BEGIN');
  return {
    client,
    async waiters() {
      const { rows } = await schema.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))', [pid]);
      return rows[0]!.n;
    },
    async release() {
      await client.query('COMMIT');
      await client.end();
    },
  };
}

/** `entity`'s fence_entities row held FOR UPDATE by another session (as another replica's admission or finish holds it for a moment). */
export async function holdEntity(schema: TestSchema, entity: string): Promise<HeldRows> {
  await schema.pool.query('INSERT INTO fence_entities (entity, fence, accepted_at) VALUES ($1, NULL, now()) ON CONFLICT DO NOTHING', [entity]);
  const held = await otherSession(schema);
  await held.client.query('SELECT 1 FROM fence_entities WHERE entity = $1 FOR UPDATE', [entity]);
  return held;
}

/** The reasons of the rejection rows a request left, in the store on `schema`. */
export async function rejectionReasons(schema: TestSchema, requestId: string): Promise<string[]> {
  const { rows } = await schema.pool.query<{ reason: string }>('SELECT reason FROM rejections WHERE request_id = $1', [requestId]);
  return rows.map((r) => r.reason);
}

/** Polls `reached` (a state another session or a store got to) every 10 ms, up to 10 s: ordering by events, not by sleeps. */
export async function until(reached: () => boolean | Promise<boolean>, what = 'the awaited state'): Promise<void> {
  const end = Date.now() + 10_000;
  while (!(await reached())) {
    if (Date.now() > end) throw new Error(`not reached within 10 s: ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
