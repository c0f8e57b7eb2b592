/**
 * PostgreSQL migration 0006 on a schema that already holds state: the fences,
 * the serial slot in flight and the rejection log survive, and a replica of
 * the previous release, still calling the functions with their old
 * signatures while the first upgraded replica migrates, keeps working.
 */
import { randomUUID } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { loadMigrations } from '../../src/store/migrations.js';
import { createPostgresStore, migratePostgres } from '../../src/store/postgres/index.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { command, finishOf } from './conformance.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** The previous release's admission: the 15-parameter fencegate_admit of 0005. */
const OLD_ADMIT = 'SELECT outcome, current_fence::text FROM fencegate_admit($1, $2, $3, $4, $5, true, $6, 30000, 3600000, false, NULL, $7, $8, NULL, $9)';

describe.skipIf(!POSTGRES_URL)('PostgreSQL migration 0006_gateway_clock_retention', () => {
  it("upgrades in place; the previous release's calls still work against the upgraded schema", async () => {
    const schema: TestSchema = await createTestSchema('fg_mig6');
    cleanups.push(() => schema.drop());
    await migratePostgres(
      schema.pool,
      loadMigrations('postgres').filter((m) => m.name < '0006'),
    );
    const entity = `acct-${randomUUID()}`;
    const oldAdmit = async (fence: number, owner: string, key = `k-${randomUUID()}`) =>
      (await schema.pool.query(OLD_ADMIT, ['payments', key, entity, fence, 'fp', owner, 'POST', '/payments/x', `req-${owner}`])).rows[0];
    // Before: fence 9 admitted and in flight (it holds the slot), fence 3 refused.
    expect(await oldAdmit(5, 'o-5')).toMatchObject({ outcome: 'forward' });
    await schema.pool.query('UPDATE fence_entities SET inflight_owner = NULL, inflight_until = NULL WHERE entity = $1', [entity]);
    expect(await oldAdmit(9, 'o-9', 'k-rise')).toMatchObject({ outcome: 'forward' });
    expect(await oldAdmit(3, 'o-3')).toMatchObject({ outcome: 'stale-fence', current_fence: '9' });

    const store = await createPostgresStore({ connectionString: schema.url, listen: false });
    cleanups.push(() => store.close());
    const { rows } = await schema.pool.query<{ name: string }>('SELECT name FROM fencegate_migrations ORDER BY name');
    expect(rows.map((r) => r.name)).toContain('0006_gateway_clock_retention.sql');

    const [old] = (await store.listRejections({ entity, limit: 10 })).items;
    expect(old).toMatchObject({ reason: 'stale-fence', presentedFence: '3', currentFence: '9', clientRequestId: null });
    expect(await store.admit(command({ entity, fence: 8n }))).toEqual({ outcome: 'stale-fence', currentFence: 9n });
    expect((await store.admit(command({ entity, fence: 10n }))).outcome).toBe('entity-busy');
    // The previous release's replica: its admission and finish still run (now through 0006's bodies).
    expect(await oldAdmit(2, 'o-2')).toMatchObject({ outcome: 'stale-fence', current_fence: '10' });
    const finished = await schema.pool.query(
      "SELECT recorded FROM fencegate_finish('payments', 'k-rise', $1, 'o-9', 'completed', 201, '[]', '\\x00', 60000, NULL, 'POST', '/p', NULL, 'r', NULL, NULL, NULL)",
      [entity],
    );
    expect(finished.rows[0]).toEqual({ recorded: true });
    const newest = (await store.listRejections({ entity, limit: 1 })).items[0];
    expect(newest).toMatchObject({ reason: 'stale-fence', presentedFence: '2', entity, clientRequestId: null });
    // The upgraded store: the slot is free again, and a refusal keeps the client's id.
    const next = command({ entity, fence: 11n, audit: { ...command().audit, clientRequestId: 'theirs' } });
    expect((await store.admit(next)).outcome).toBe('forward');
    await store.finish(finishOf(next, 'completed'));
    expect(await store.admit(command({ entity, fence: 4n, audit: { ...command().audit, clientRequestId: 'theirs' } }))).toEqual({
      outcome: 'stale-fence',
      currentFence: 11n,
    });
    expect((await store.listRejections({ entity, limit: 1 })).items[0]).toMatchObject({ clientRequestId: 'theirs' });
    // The functions of 0006 are the only bodies left: one logger signature.
    const { rows: loggers } = await schema.pool.query(
      "SELECT pg_get_function_identity_arguments(p.oid) AS args FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1 AND p.proname = 'fencegate_log_rejection'",
      [schema.schema],
    );
    expect(loggers).toHaveLength(1);
  });
});
