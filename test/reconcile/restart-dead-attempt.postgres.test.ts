import { randomUUID } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { paymentsRoute } from '../helpers/gateway.js';
import { startPgTestGateway, type PgTestGateway } from '../helpers/pg-gateway.js';
import { POSTGRES_URL } from '../helpers/postgres.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// DESIGN §3.12 "Shutdown and restart" on PostgreSQL: an attempt left in
// progress (its gateway died, or its drain could not write the finish) is
// marked outcome_unknown by the background pass once its lock has expired by
// the database clock, and settled by the status query. The child-process
// version on SQLite: ./restart-after-drain.slow.test.ts.

describe.skipIf(!POSTGRES_URL)('the background pass settles an attempt left in progress (PostgreSQL)', () => {
  let gw: PgTestGateway | null = null;
  let up: FakeUpstream | null = null;
  afterEach(async () => {
    await gw?.close();
    await up?.close();
  });

  it('marks it unknown by the database clock, then the status query completes it', async () => {
    up = await startUpstream();
    up.behave(() => ({ kind: 'respond', status: 200, headers: { 'content-type': 'application/json' }, body: '{"state":"paid"}' }));
    gw = await startPgTestGateway({
      prefix: 'fg_dead',
      routes: [paymentsRoute(up.url, { timeoutMs: 2_000, lockMarginMs: 500, reconcile: { path: '/status?key={key}', interval: '1h', settleTime: '0s' } })],
      config: { sweepInterval: '1h' },
    });
    const key = `dead-${randomUUID()}`;
    const admitted = await gw.store.admit({
      scope: 'payments',
      key,
      entity: 'e1',
      fence: 1n,
      fingerprint: 'f'.repeat(64),
      mode: 'concurrent',
      ownerToken: randomUUID(),
      lockMs: 1,
      retentionMs: 86_400_000,
      onUnknown: 'reject',
      audit: { requestId: 'req-dead', clientRequestId: null, caller: null, method: 'POST', path: '/payments/e1', payloadSha256: '' },
    });
    expect(admitted.outcome).toBe('forward');
    const state = async () => (await gw!.schema.pool.query('SELECT state FROM idempotency_records WHERE key = $1', [key])).rows[0]?.state;
    // The lock of 1 ms has expired by the database clock.
    for (
      let i = 0;
      i < 100 && (await gw.schema.pool.query('SELECT 1 FROM idempotency_records WHERE key = $1 AND locked_until < now()', [key])).rowCount === 0;
      i++
    )
      await new Promise((r) => setTimeout(r, 10));
    expect(await state()).toBe('in_progress');
    const pass = await gw.running.gateway.reconcile();
    expect(pass.markedDead).toBe(1);
    expect(pass.asked).toEqual({ found: 1 });
    expect(await state()).toBe('completed');
  });
});
