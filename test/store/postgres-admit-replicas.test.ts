import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RoundTripGroup } from '../../src/store/postgres/finish-group.js';
import { createPostgresStore, type PostgresGatewayStore } from '../../src/store/postgres/index.js';
import type { Admission, AdmitInput } from '../../src/store/types.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { admitInput } from '../store/helpers/inputs.js';

/**
 * Two replicas' admission groups (DESIGN §8.2, G1–G3) on one
 * database, with a third session grabbing entity and record rows for a few
 * ms at a time so that elements are left `alone` and run again. No finish
 * runs and locks are long, so per entity (serial) and per key at most one
 * request may ever be forwarded; and no forward may carry a fence below one
 * another admission had already committed before it was sent (G1).
 */
let schema: TestSchema;
let replicas: PostgresGatewayStore[];
const groupOf = (s: PostgresGatewayStore) => (s as unknown as { admission: { group: RoundTripGroup<AdmitInput, Admission> } }).admission.group;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Trace {
  input: AdmitInput;
  sentAt: number;
  answeredAt: number;
  answer: Admission | null;
}

function violations(traces: Trace[]): string[] {
  const out: string[] = [];
  const forwards = traces.filter((t) => t.answer?.outcome === 'forward');
  const count = (k: (t: Trace) => string | null) => {
    const m = new Map<string, number>();
    for (const t of forwards) {
      const n = k(t);
      if (n !== null) m.set(n, (m.get(n) ?? 0) + 1);
    }
    return [...m].filter(([, c]) => c > 1);
  };
  for (const [e, c] of count((t) => (t.input.mode === 'serial' ? t.input.entity : null))) out.push(`G3: entity ${e} forwarded ${c} times`);
  for (const [k, c] of count((t) => (t.input.key === null ? null : `${t.input.scope}/${t.input.key}`))) out.push(`G2: key ${k} forwarded ${c} times`);
  for (const r of forwards) {
    if (r.input.fence === null) continue;
    const newer = traces.find(
      (s) =>
        s.input.entity === r.input.entity &&
        s.input.fence !== null &&
        s.input.fence > r.input.fence! &&
        s.answer !== null &&
        s.answer.outcome !== 'stale-fence' &&
        s.answeredAt < r.sentAt,
    );
    if (newer) out.push(`G1: fence ${r.input.fence} forwarded for ${r.input.entity} after fence ${newer.input.fence} was committed`);
  }
  return out;
}

async function storm(lockMs: number, seed: string) {
  const entities = Array.from({ length: 60 }, (_, i) => `e-${seed}-${i}`);
  const keys = Array.from({ length: 80 }, (_, i) => `k-${seed}-${i}`);
  await schema.pool.query('INSERT INTO fence_entities (entity, fence, accepted_at) SELECT unnest($1::text[]), NULL, now() ON CONFLICT DO NOTHING', [entities]);
  let stop = false;
  const jammer = new pg.Client({ connectionString: schema.url });
  await jammer.connect();
  const jam = (async () => {
    while (!stop) {
      await jammer.query('BEGIN');
      await jammer.query('SELECT 1 FROM fence_entities WHERE entity = $1 FOR UPDATE', [entities[Math.floor(Math.random() * entities.length)]]);
      await jammer.query('SELECT 1 FROM idempotency_records WHERE scope = $1 AND key = $2 FOR UPDATE', ['r', keys[Math.floor(Math.random() * keys.length)]]);
      await sleep(2 + Math.random() * 8);
      await jammer.query('COMMIT');
    }
  })();
  const traces: Trace[] = [];
  const pick = <T>(a: T[]) => a[Math.floor(Math.random() * a.length)]!;
  try {
    for (let burst = 0; burst < 40; burst++) {
      const batch = Array.from({ length: 40 }, (_, i) => {
        const key = Math.random() < 0.3 ? null : pick(keys);
        const input = admitInput({
          key,
          entity: pick(entities),
          fence: Math.random() < 0.2 ? null : BigInt(1 + Math.floor(Math.random() * 4)),
          fingerprint: key ?? 'none',
          ownerToken: `o-${randomUUID()}`,
          lockMs,
          mode: 'serial',
        });
        const t: Trace = { input, sentAt: performance.now(), answeredAt: 0, answer: null };
        traces.push(t);
        return replicas[i % 2]!.admit(input).then(
          (a) => ((t.answer = a), (t.answeredAt = performance.now())),
          () => (t.answeredAt = performance.now()),
        );
      });
      await Promise.all(batch);
    }
  } finally {
    stop = true;
    await jam;
    await jammer.end();
  }
  return traces;
}

describe.skipIf(!POSTGRES_URL)('two replicas, grouped admissions, rows held elsewhere', () => {
  beforeAll(async () => {
    schema = await createTestSchema('fg_rv_repl');
    replicas = [await createPostgresStore({ connectionString: schema.url, poolSize: 4 })];
    replicas.push(await createPostgresStore({ connectionString: schema.url, poolSize: 4, migrate: false }));
  });
  afterAll(async () => {
    for (const r of replicas ?? []) await r.close();
    await schema?.drop();
  });

  it('no entity, key or lower fence is forwarded twice, with elements deferred and re-run on both replicas', async () => {
    const traces = await storm(600_000, 'a');
    const deferred = replicas.map((r) => groupOf(r).stats.deferred);
    const forwards = traces.filter((t) => t.answer?.outcome === 'forward').length;
    const failed = traces.filter((t) => t.answer === null).length;
    expect(deferred[0]! + deferred[1]!).toBeGreaterThan(0);
    expect(forwards).toBeGreaterThan(0);
    expect(failed).toBe(0);
    expect(violations(traces)).toEqual([]);
  });

  it('negative control: with 1 ms locks (slots expire at once) the same check sees entities forwarded twice', async () => {
    const traces = await storm(1, 'b');
    expect(violations(traces).some((v) => v.startsWith('G3'))).toBe(true);
  });
});
