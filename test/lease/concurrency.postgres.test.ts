/**
 * 20 workers, each with its own connection, claim from 1,000 jobs at once on
 * the real PostgreSQL server: every job is claimed exactly once while leases
 * live; after the leases expire every job is claimed exactly once more with a
 * higher token, and the old owners can no longer extend.
 */
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createPostgresJobStore } from '../../src/lease/postgres/store.js';
import type { JobStore, Lease } from '../../src/lease/types.js';
import { POSTGRES_URL, postgresDatabase, type TestDatabase } from './helpers/stores.js';

const WORKERS = 20;
const JOBS = 1_000;

describe.skipIf(!POSTGRES_URL)('concurrent claims on PostgreSQL', () => {
  let db: TestDatabase;
  let stores: JobStore[] = [];

  beforeAll(async () => {
    db = await postgresDatabase();
    const url = (db.descriptor as { postgres: string }).postgres;
    stores = await Promise.all(
      Array.from({ length: WORKERS }, () => createPostgresJobStore({ connectionString: url, poolMax: 1, migrate: false, leaseMs: 120_000 })),
    );
    await db.sql(
      `INSERT INTO tool_jobs (kind, idempotency_key, payload, payload_sha256, max_attempts)
       SELECT 'payment', 'job-' || i, jsonb_build_object('n', i), '-', 5 FROM generate_series(1, ${JOBS}) i`,
    );
  });
  afterAll(async () => {
    await Promise.all(stores.map((s) => s.close()));
    await db?.dispose();
  });

  /** Every worker claims until nothing is left, all at once. */
  const claimAll = () =>
    Promise.all(
      stores.map(async (store, w) => {
        const got: Lease[] = [];
        for (;;) {
          const { lease } = await store.claim({ workerId: `w${w}` });
          if (!lease) return got;
          got.push(lease);
        }
      }),
    );

  test('each job is claimed exactly once while leases live, then exactly once more with a higher token after they expire', async () => {
    const first = (await claimAll()).flat();
    expect(first).toHaveLength(JOBS);
    expect(new Set(first.map((l) => l.id)).size).toBe(JOBS);
    expect(first.every((l) => l.fencingToken === 1)).toBe(true);
    const firstById = new Map(first.map((l) => [l.id, l]));

    await db.expireLease();
    const second = (await claimAll()).flat();
    expect(second).toHaveLength(JOBS);
    expect(new Set(second.map((l) => l.id)).size).toBe(JOBS);
    for (const l of second) {
      const before = firstById.get(l.id)!;
      expect(l.fencingToken).toBeGreaterThan(before.fencingToken);
      expect(l.previousOwnerId).toBe(before.ownerId);
    }

    // The old owners, all at once: every extend is refused (complete is the
    // same condition; the conformance suite checks it one by one).
    const byOwner = (leases: Lease[]) => stores.map((_, w) => leases.filter((l) => l.ownerId === `w${w}`));
    const stale = await Promise.all(byOwner(first).map((mine, w) => Promise.all(mine.map((l) => stores[w]!.extend(l)))));
    expect(stale.flat().filter((r) => r.ok)).toEqual([]);
    const rows = await db.sql<{ state: string; owner_id: string; n: string }>(
      'SELECT state, count(*) AS n FROM tool_jobs WHERE owner_id IS NOT NULL AND fencing_token = 2 GROUP BY state',
    );
    expect(rows).toEqual([{ state: 'running', n: String(JOBS) }]);
  });
});
