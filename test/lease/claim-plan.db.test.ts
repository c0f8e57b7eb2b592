/**
 * Claim cost must not grow with finished rows (the seed's primary-key-only
 * claim walked past every one of them). Asserted on query plans and, on
 * PostgreSQL, on buffers touched, never on timings (CONTRIBUTING.md convention 9).
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import * as pgq from '../../src/lease/postgres/queries.js';
import * as sq from '../../src/lease/sqlite/queries.js';
import { POSTGRES_URL, postgresDatabase, sqliteDatabase, type TestDatabase } from './helpers/stores.js';

const FINISHED = 100_000;

describe('claim plan on SQLite', () => {
  let db: TestDatabase;
  beforeAll(async () => {
    db = await sqliteDatabase();
    await db.sql(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ${FINISHED})
      INSERT INTO tool_jobs (kind, state, idempotency_key, payload, payload_sha256, max_attempts,
                             fencing_token, attempt, created_at, run_after, finished_at)
      SELECT 'payment', 'succeeded', 'done-' || i, '{}', '-', 3, 1, 1, 0, 0, 0 FROM n`);
    const store = await db.open();
    await store.enqueue({ kind: 'payment', idempotencyKey: 'live', payload: {} });
    await db.sql('ANALYZE');
  });
  afterAll(async () => {
    await db?.dispose();
  });

  test('claim reads the two partial indexes and scans no table', async () => {
    const plan = await db.sql<{ detail: string }>(`EXPLAIN QUERY PLAN ${sq.CLAIM}`, [
      { owner: 'w1', kinds: null, lease_default_ms: 1000, lease_by_kind: '{}' },
    ]);
    const details = plan.map((r) => r.detail);
    expect(details.some((d) => /tool_jobs_running/.test(d))).toBe(true);
    expect(details.some((d) => /tool_jobs_queued/.test(d))).toBe(true);
    // A full scan reads "SCAN tool_jobs" (or "SCAN o"); json_each is a table-valued function, fine.
    expect(details.filter((d) => /^SCAN (tool_jobs|o)\b/.test(d))).toEqual([]);
  });

  test('with kinds and a custom fence key the plan stays on indexes', async () => {
    const plan = await db.sql<{ detail: string }>(`EXPLAIN QUERY PLAN ${sq.CLAIM}`, [
      { owner: 'w1', kinds: '["payment"]', lease_default_ms: 1000, lease_by_kind: '{"payment":5000}' },
    ]);
    expect(plan.map((r) => r.detail).filter((d) => /^SCAN (tool_jobs|o)\b/.test(d))).toEqual([]);
  });
});

interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  'Index Name'?: string;
  'Shared Hit Blocks'?: number;
  'Shared Read Blocks'?: number;
  Plans?: PlanNode[];
}

function walk(node: PlanNode, out: PlanNode[] = []): PlanNode[] {
  out.push(node);
  for (const child of node.Plans ?? []) walk(child, out);
  return out;
}

/**
 * The control: the seed's claim, in primary-key order with no partial index
 * it can use. The live job has the highest id, so it walks past every
 * finished row; the measure below must see that.
 */
const SEED_STYLE_CLAIM = `
UPDATE tool_jobs SET state = 'running', owner_id = $1, fencing_token = fencing_token + 1
WHERE id = (SELECT id FROM tool_jobs
             WHERE state IN ('queued', 'running') AND (state = 'queued' OR lease_until <= now())
             ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id`;

describe.skipIf(!POSTGRES_URL)('claim plan on PostgreSQL', () => {
  let db: TestDatabase;
  let client: pg.Client;

  /** Shared buffers a statement touches; run in a transaction that is rolled back, so nothing changes. */
  async function buffersOf(sql: string, params: unknown[]): Promise<{ buffers: number; nodes: PlanNode[] }> {
    await client.query('BEGIN');
    try {
      const { rows } = await client.query(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${sql}`, params);
      const top = rows[0]['QUERY PLAN'][0].Plan as PlanNode;
      return { buffers: (top['Shared Hit Blocks'] ?? 0) + (top['Shared Read Blocks'] ?? 0), nodes: walk(top) };
    } finally {
      await client.query('ROLLBACK');
    }
  }

  beforeAll(async () => {
    db = await postgresDatabase();
    await db.sql(
      `INSERT INTO tool_jobs (kind, state, idempotency_key, payload, payload_sha256, max_attempts,
                              fencing_token, attempt, finished_at)
       SELECT 'payment', 'succeeded', 'done-' || i, '{}', '-', 3, 1, 1, now() FROM generate_series(1, ${FINISHED}) i`,
    );
    const store = await db.open();
    await store.enqueue({ kind: 'payment', idempotencyKey: 'live', payload: {} });
    await db.sql('ANALYZE tool_jobs');
    client = new pg.Client({ connectionString: (db.descriptor as { postgres: string }).postgres });
    await client.connect();
  });
  afterAll(async () => {
    await client?.end();
    await db?.dispose();
  });

  test('claim reads the two partial indexes and scans no table', async () => {
    const { rows } = await client.query(`EXPLAIN (FORMAT JSON) ${pgq.CLAIM}`, ['w1', null, 1000, '{}']);
    const nodes = walk(rows[0]['QUERY PLAN'][0].Plan);
    const indexes = nodes.map((n) => n['Index Name']).filter(Boolean);
    expect(indexes).toContain('tool_jobs_running');
    expect(indexes).toContain('tool_jobs_queued');
    expect(nodes.filter((n) => n['Node Type'] === 'Seq Scan' && n['Relation Name'] === 'tool_jobs')).toEqual([]);
  });

  test(`claim touches a handful of buffers with ${FINISHED} finished rows; the seed-style claim walks them all`, async () => {
    const claim = await buffersOf(pgq.CLAIM, ['w1', null, 1000, '{}']);
    const seed = await buffersOf(SEED_STYLE_CLAIM, ['w1']);
    // The claim found the live job (an Update node that touched a row) …
    expect(claim.nodes[0]!['Node Type']).toBe('ModifyTable');
    // … through a constant number of index and heap pages, independent of
    // FINISHED, while the control reads hundreds (the heap or the whole pk index).
    expect(claim.buffers).toBeLessThan(60);
    expect(seed.buffers).toBeGreaterThan(10 * claim.buffers);
  });
});
