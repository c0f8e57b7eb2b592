/**
 * The shared store conformance suite (test/store/conformance.ts) against the
 * D1 store, inside workerd, on the local D1 binding of wrangler.toml. The
 * harness starts from an empty database (`reset()` wipes the bindings, then
 * the migrations are applied again), so suite-wide counts such as "nothing
 * left to sweep" see only the suite's own rows.
 *
 * "Another replica" is a second store on the same binding: what another
 * Worker isolate has. It shares no memory with the first, so its waiters
 * wake by polling (DESIGN §8.3).
 */
import { applyD1Migrations, reset } from 'cloudflare:test';
import { env } from 'cloudflare:workers';
import { createD1Store } from '../../src/store/d1/index.js';
import { describe, expect, it } from 'vitest';
import { command, commandRowOf, describeGatewayStoreConformance, finishOf } from '../store/conformance.js';

describeGatewayStoreConformance('d1 (workerd, local D1)', async () => {
  await reset();
  await applyD1Migrations(env.DB, env.TEST_MIGRATIONS);
  const stores = [createD1Store({ db: env.DB })];
  return {
    store: stores[0]!,
    async backdateRejections(ids, ms) {
      const stmt = env.DB.prepare('UPDATE rejections SET at = at - ?1 WHERE id = CAST(?2 AS INTEGER)');
      await env.DB.batch(ids.map((id) => stmt.bind(ms, id)));
    },
    async backdate(table, column, ms, where) {
      await env.DB.prepare(`UPDATE ${table} SET ${column} = ${column} - ?1 WHERE ${where.column} = ?2`).bind(ms, where.value).run();
    },
    async forgetAttempt(key) {
      await env.DB.prepare('UPDATE idempotency_records SET attempt_until = NULL, request_id = NULL WHERE key = ?1').bind(key).run();
    },
    async openReplica() {
      const replica = createD1Store({ db: env.DB });
      stores.push(replica);
      return replica;
    },
    async close() {
      for (const s of stores) await s.close();
    },
  };
});

// A Worker deployed before `wrangler d1 migrations apply` created the command
// log (0011): its finishes still land, without their rows (a failed finish
// would leave the record to become outcome_unknown although the upstream answered).
describe('d1 finish on a database without the commands table', () => {
  it('records the finish; the row is what is missing', async () => {
    await reset();
    await applyD1Migrations(env.DB, env.TEST_MIGRATIONS);
    await env.DB.prepare('DROP TABLE commands').run();
    const store = createD1Store({ db: env.DB });
    const input = command();
    expect((await store.admit(input)).outcome).toBe('forward');
    const f = finishOf(input, 'completed');
    f.command = commandRowOf(input);
    expect(await store.finish(f)).toEqual({ recorded: true });
    expect((await store.getRecords(input.key!))[0]).toMatchObject({ state: 'completed' });
    // The table is really gone: a batch that names it fails whole, as the finish's first batch did.
    await expect(env.DB.batch([env.DB.prepare("INSERT INTO commands (at, outcome) VALUES (0, 'completed')")])).rejects.toThrow(/no such table: commands/);
    await store.close();
  });
});
