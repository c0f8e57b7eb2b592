/**
 * The admission conformance property (test/store/admission-conformance.ts)
 * against the D1 store, inside workerd, on the local D1 binding of
 * wrangler.toml: the D1 batch program must give every answer and leave
 * every state that the pure rules of src/core/admission.ts give. Each run
 * starts from emptied tables. No releases of lost admissions among the
 * commands (the Node twin runs them on SQLite and PostgreSQL): the D1 store
 * has no `releaseUnsent` (a lost batch answer's record is left to its lock,
 * DESIGN §8.2), as the first check says.
 */
import { env } from 'cloudflare:workers';
import { describe, expect, it } from 'vitest';
import { createD1Store } from '../../src/store/d1/index.js';
import { ALL_OUTCOMES, admissionProperty, hideFence, type AdmissionBackend, type TableSnapshot } from '../store/admission-conformance.js';

const RUNS = 25;
const NOW = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

const d1: AdmissionBackend = async () => {
  const db = env.DB;
  await db.batch(['fence_entities', 'idempotency_records', 'rejections', 'fence_history', 'admission_scratch'].map((t) => db.prepare(`DELETE FROM ${t}`)));
  const all = async (sql: string) => ((await db.prepare(sql).all()).results ?? []) as any[];
  return {
    store: createD1Store({ db }),
    async snapshot(): Promise<TableSnapshot> {
      return {
        entities: await all(`SELECT entity, CAST(fence AS TEXT) AS fence, inflight_owner AS owner, inflight_until > ${NOW} AS slotLive FROM fence_entities`),
        records: await all(`SELECT key, fingerprint, state, owner_token AS owner, locked_until > ${NOW} AS lockLive, expires_at > ${NOW} AS fresh,
          entity, CAST(fence AS TEXT) AS fence, status, CAST(body AS TEXT) AS body, request_id AS requestId,
          attempt_until IS NOT NULL AS attemptKept, attempt_until = locked_until AS attemptIsLock FROM idempotency_records`),
        rejections: await all(
          'SELECT reason, entity, idempotency_key AS key, CAST(presented_fence AS TEXT) AS presented, CAST(current_fence AS TEXT) AS current FROM rejections',
        ),
      };
    },
    async expire(key, entity) {
      await db.prepare("UPDATE idempotency_records SET locked_until = 0 WHERE key = ?1 AND state = 'in_progress'").bind(key).run();
      if (entity !== null) await db.prepare('UPDATE fence_entities SET inflight_until = 0 WHERE entity = ?1 AND inflight_owner IS NOT NULL').bind(entity).run();
    },
    async age(key) {
      await db.prepare("UPDATE idempotency_records SET expires_at = 0 WHERE key = ?1 AND state = 'completed'").bind(key).run();
    },
    close: async () => {},
  };
};

describe('admission conformance: the D1 store (workerd, local D1) against the pure rules', () => {
  it('every answer and the whole state equal decide/finish; a batch is explained by one serial order', { timeout: 300_000 }, async () => {
    expect('releaseUnsent' in createD1Store({ db: env.DB })).toBe(false);
    const seen = await admissionProperty(d1, { numRuns: RUNS });
    expect(seen).toEqual([...ALL_OUTCOMES].sort());
  });

  it('negative control: a store that never sees the fence fails the property', { timeout: 300_000 }, async () => {
    await expect(admissionProperty(d1, { numRuns: RUNS, wrap: hideFence, endOnFailure: true })).rejects.toThrow(/Property failed/);
  });
});
