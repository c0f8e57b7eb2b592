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
import { describeGatewayStoreConformance } from '../store/conformance.js';

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
