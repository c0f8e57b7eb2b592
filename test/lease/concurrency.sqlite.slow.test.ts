/**
 * Several real processes share one SQLite file and claim from 1,000 jobs at
 * once: every job is claimed exactly once while leases live; after the
 * leases expire, exactly once more with a higher token, and the first round's
 * owners can no longer extend.
 */
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { killAll as killAllChildren, spawnChild, type LeaseChild as Child } from '../helpers/child.js';
import { sqliteDatabase, type TestDatabase } from './helpers/stores.js';

const PROCESSES = 4;
const JOBS = 1_000;

interface Claimed {
  type: 'claimed';
  claims: { id: number; token: number; previousOwnerId: string | null }[];
}

describe('concurrent claims on SQLite from several processes', () => {
  let db: TestDatabase;
  let children: Child[] = [];

  beforeAll(async () => {
    db = await sqliteDatabase();
    await db.sql(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ${JOBS})
      INSERT INTO tool_jobs (kind, idempotency_key, payload, payload_sha256, max_attempts, created_at, run_after)
      SELECT 'payment', 'job-' || i, json_object('n', i), '-', 5, 0, 0 FROM n`);
    children = Array.from({ length: PROCESSES }, (_, i) => spawnChild('claim-child.ts', [JSON.stringify(db.descriptor), `p${i}`]));
    // A barrier: every process has opened the file before anyone claims.
    await Promise.all(children.map((c) => c.next((m) => m.type === 'ready')));
  });
  afterAll(async () => {
    await killAllChildren();
    await db?.dispose();
  });

  // SQLite's lock is not fair: on a loaded machine one process can take every
  // job before the others are scheduled. A cap per process (room for all
  // jobs, never for all in one process) makes them share the work without
  // making the exactly-once check any weaker: they still race for every row.
  const CAP = Math.ceil(JOBS / (PROCESSES - 1));
  const round = async () => {
    const replies = children.map((c) => c.next<Claimed>((m) => m.type === 'claimed'));
    for (const c of children) c.send(`claim ${CAP}`);
    return (await Promise.all(replies)).map((r, i) => r.claims.map((c) => ({ ...c, owner: `p${i}` })));
  };

  test('each job is claimed exactly once per lease, tokens rise across re-claims', async () => {
    const first = await round();
    const all = first.flat();
    expect(all).toHaveLength(JOBS);
    expect(new Set(all.map((c) => c.id)).size).toBe(JOBS);
    expect(all.every((c) => c.token === 1)).toBe(true);
    // Really concurrent: the processes shared the work.
    expect(first.filter((mine) => mine.length > 0).length).toBeGreaterThan(1);

    await db.expireLease();
    const second = (await round()).flat();
    expect(second).toHaveLength(JOBS);
    expect(new Set(second.map((c) => c.id)).size).toBe(JOBS);
    const firstOwner = new Map(all.map((c) => [c.id, c.owner]));
    for (const c of second) {
      expect(c.token).toBe(2);
      expect(c.previousOwnerId).toBe(firstOwner.get(c.id));
    }

    const extended = children.map((c) => c.next<{ ok: number; lost: number }>((m) => m.type === 'extended'));
    for (const c of children) c.send('extend 0');
    const results = await Promise.all(extended);
    expect(results.reduce((n, r) => n + r.ok, 0)).toBe(0);
    expect(results.reduce((n, r) => n + r.lost, 0)).toBe(JOBS);

    for (const c of children) c.send('exit');
    expect(await Promise.all(children.map((c) => c.exited))).toEqual(children.map(() => 0));
  });
});
