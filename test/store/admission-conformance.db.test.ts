import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { createPostgresStore, type PostgresGatewayStore } from '../../src/store/postgres/index.js';
import { SqliteGatewayStore, type SqliteStoreOptions } from '../../src/store/sqlite/index.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { releaseForgettingTakeovers, releaseKeepingSlot } from '../helpers/store-wrappers.js';
import {
  ALL_OUTCOMES,
  admissionProperty,
  dropFingerprint,
  hideFence,
  RELEASE_BRANCHES,
  type AdmissionBackend,
  type TableSnapshot,
} from './admission-conformance.js';

// The admission conformance property (./admission-conformance.ts) against
// the SQLite store (FULL and NORMAL, with group commit and with one
// transaction per decision) and PostgreSQL, and again with releases of lost
// admissions among the commands (both stores have releaseUnsent); D1 runs
// it under workerd (test/workers/admission-conformance.workerd.ts), without
// releases: it has no release of a lost admission.

const RUNS = Number(process.env.FENCEGATE_FC_RUNS ?? 40);
const PG_RUNS = Number(process.env.FENCEGATE_FC_RUNS ?? 25);

const dir = mkdtempSync(join(tmpdir(), 'fencegate-admission-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let files = 0;

/** A fresh database file per run. */
function sqlite(options: Partial<SqliteStoreOptions>): AdmissionBackend {
  return async () => {
    const store = new SqliteGatewayStore({ path: join(dir, `admission-${++files}.db`), ...options });
    const db = store.db;
    const now = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
    return {
      store,
      async snapshot(): Promise<TableSnapshot> {
        return {
          entities: db
            .prepare(`SELECT entity, CAST(fence AS TEXT) AS fence, inflight_owner AS owner, inflight_until > ${now} AS slotLive FROM fence_entities`)
            .all() as any,
          records: db
            .prepare(`SELECT key, fingerprint, state, owner_token AS owner, locked_until > ${now} AS lockLive, expires_at > ${now} AS fresh,
              entity, CAST(fence AS TEXT) AS fence, status, CAST(body AS TEXT) AS body, request_id AS requestId,
              attempt_until IS NOT NULL AS attemptKept, attempt_until = locked_until AS attemptIsLock FROM idempotency_records`)
            .all() as any,
          rejections: db
            .prepare(
              'SELECT reason, entity, idempotency_key AS key, CAST(presented_fence AS TEXT) AS presented, CAST(current_fence AS TEXT) AS current FROM rejections',
            )
            .all() as any,
        };
      },
      async expire(key, entity) {
        db.prepare("UPDATE idempotency_records SET locked_until = 0 WHERE key = ? AND state = 'in_progress'").run(key);
        if (entity !== null) db.prepare('UPDATE fence_entities SET inflight_until = 0 WHERE entity = ? AND inflight_owner IS NOT NULL').run(entity);
      },
      async age(key) {
        db.prepare("UPDATE idempotency_records SET expires_at = 0 WHERE key = ? AND state = 'completed'").run(key);
      },
      close: () => store.close(),
    };
  };
}

const SQLITE: [string, Partial<SqliteStoreOptions>][] = [
  ['FULL, group commit', { synchronous: 'FULL' }],
  ['NORMAL, group commit', { synchronous: 'NORMAL' }],
  ['NORMAL, one transaction per decision', { synchronous: 'NORMAL', groupCommit: false }],
];

describe('admission conformance: the SQLite store against the pure rules (src/core/admission.ts)', () => {
  it.each(SQLITE)(
    '%s: every answer and the whole state equal decide/finish, under scheduler-chosen interleavings',
    { timeout: 180_000 },
    async (_name, options) => {
      const seen = await admissionProperty(sqlite(options), { numRuns: RUNS });
      // The runs reached every branch of DESIGN §3.5 (a test that never refuses proves nothing about refusals).
      expect(seen).toEqual([...ALL_OUTCOMES].sort());
    },
  );

  it.each(SQLITE)(
    '%s, with releases of lost admissions: every release and the state after equal releaseUnsent',
    { timeout: 180_000 },
    async (_name, options) => {
      const seen = await admissionProperty(sqlite(options), { numRuns: RUNS, release: true });
      // Every branch of the release rule (DESIGN §8.2) was reached.
      expect(seen).toEqual(expect.arrayContaining(RELEASE_BRANCHES));
    },
  );

  it('negative control: a store that never sees the fence fails the property', { timeout: 180_000 }, async () => {
    await expect(admissionProperty(sqlite({ synchronous: 'NORMAL' }), { numRuns: RUNS, wrap: hideFence, endOnFailure: true })).rejects.toThrow(
      /Property failed/,
    );
  });

  it('negative control: a store that never compares fingerprints fails the property', { timeout: 180_000 }, async () => {
    await expect(admissionProperty(sqlite({ synchronous: 'NORMAL' }), { numRuns: RUNS, wrap: dropFingerprint, endOnFailure: true })).rejects.toThrow(
      /Property failed/,
    );
  });

  it('negative control: a release that deletes a taken-over record (forgetting the unknown outcome) fails the property', { timeout: 180_000 }, async () => {
    await expect(
      admissionProperty(sqlite({ synchronous: 'NORMAL' }), { numRuns: RUNS, wrap: releaseForgettingTakeovers, endOnFailure: true, release: true }),
    ).rejects.toThrow(/Property failed[\s\S]*release/);
  });

  it('negative control: a release that keeps the serial slot fails the property', { timeout: 180_000 }, async () => {
    await expect(
      admissionProperty(sqlite({ synchronous: 'NORMAL' }), { numRuns: RUNS, wrap: releaseKeepingSlot, endOnFailure: true, release: true }),
    ).rejects.toThrow(/Property failed[\s\S]*release/);
  });
});

describe.skipIf(!POSTGRES_URL)('admission conformance: the PostgreSQL store against the pure rules', () => {
  let schema: TestSchema;
  let store: PostgresGatewayStore;
  afterAll(async () => {
    await store?.close();
    await schema?.drop();
  });

  /** One schema and one store for the property; every run starts from emptied tables. */
  const postgres: AdmissionBackend = async () => {
    schema ??= await createTestSchema('fg_adm');
    store ??= await createPostgresStore({ connectionString: schema.url, poolSize: 8 });
    const q = async (sql: string, params: unknown[] = []) => (await schema.pool.query(sql, params)).rows;
    await q('TRUNCATE fence_entities, idempotency_records, rejections, fence_history');
    return {
      store,
      async snapshot(): Promise<TableSnapshot> {
        return {
          entities: (await q(
            'SELECT entity, fence::text AS fence, inflight_owner AS owner, inflight_until > clock_timestamp() AS "slotLive" FROM fence_entities',
          )) as any,
          records: (await q(`SELECT key, fingerprint, state, owner_token AS owner, locked_until > clock_timestamp() AS "lockLive",
              expires_at > clock_timestamp() AS fresh, entity, fence::text AS fence, status, convert_from(body, 'UTF8') AS body,
              request_id AS "requestId", attempt_until IS NOT NULL AS "attemptKept", attempt_until = locked_until AS "attemptIsLock"
              FROM idempotency_records`)) as any,
          rejections: (await q(
            'SELECT reason, entity, idempotency_key AS key, presented_fence::text AS presented, current_fence::text AS current FROM rejections',
          )) as any,
        };
      },
      async expire(key, entity) {
        await q("UPDATE idempotency_records SET locked_until = to_timestamp(0) WHERE key = $1 AND state = 'in_progress'", [key]);
        if (entity !== null) await q('UPDATE fence_entities SET inflight_until = to_timestamp(0) WHERE entity = $1 AND inflight_owner IS NOT NULL', [entity]);
      },
      async age(key) {
        await q("UPDATE idempotency_records SET expires_at = to_timestamp(0) WHERE key = $1 AND state = 'completed'", [key]);
      },
      close: async () => {},
    };
  };

  it('every answer and the whole state equal decide/finish; a batch is explained by one serial order', { timeout: 300_000 }, async () => {
    const seen = await admissionProperty(postgres, { numRuns: PG_RUNS });
    expect(seen).toEqual([...ALL_OUTCOMES].sort());
  });

  it('with releases of lost admissions: every release and the state after equal releaseUnsent (fencegate_release_unsent)', { timeout: 300_000 }, async () => {
    const seen = await admissionProperty(postgres, { numRuns: PG_RUNS, release: true });
    expect(seen).toEqual(expect.arrayContaining(RELEASE_BRANCHES));
  });

  it('negative control: a store that never sees the fence fails the property', { timeout: 300_000 }, async () => {
    await expect(admissionProperty(postgres, { numRuns: PG_RUNS, wrap: hideFence, endOnFailure: true })).rejects.toThrow(/Property failed/);
  });

  it('negative control: a release that deletes a taken-over record fails the property', { timeout: 300_000 }, async () => {
    await expect(admissionProperty(postgres, { numRuns: PG_RUNS, wrap: releaseForgettingTakeovers, endOnFailure: true, release: true })).rejects.toThrow(
      /Property failed[\s\S]*release/,
    );
  });
});
