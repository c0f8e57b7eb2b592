import { afterEach, describe, expect, it } from 'vitest';
import { overrideStore } from '../../src/store/override.js';
import { command, effectOf, expectProblem, paymentsRoute } from '../helpers/gateway.js';
import { startPgTestGateway, type PgTestGateway } from '../helpers/pg-gateway.js';
import { POSTGRES_URL } from '../helpers/postgres.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// test/gateway/long-call.test.ts on PostgreSQL: the lock (and the serial
// slot) renewed by the database's clock while the upstream holds the call.

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe.skipIf(!POSTGRES_URL)('long calls on PostgreSQL', () => {
  let up: FakeUpstream | null = null;
  let gw: PgTestGateway | null = null;
  afterEach(async () => {
    await gw?.close();
    await up?.close();
    gw = null;
    up = null;
  });

  const start = async (renew: boolean) => {
    up = await startUpstream();
    gw = await startPgTestGateway({
      prefix: 'fg_long',
      routes: [paymentsRoute(up.url, { timeoutMs: 30_000, lockMarginMs: 100, serialWaitMs: 200, longCall: { lockWindow: '400ms', renewEvery: '100ms' } })],
      config: { sweepInterval: '1h' },
      ...(renew
        ? {}
        : {
            wrapStore: (s) =>
              overrideStore(s, {
                extendLock: async () => {
                  throw new Error('store down (test)');
                },
              }),
          }),
    });
    return { up, gw };
  };

  const states = async (g: PgTestGateway, key: string) =>
    (await g.schema.pool.query('SELECT state FROM idempotency_records WHERE key = $1', [key])).rows.map((r) => r.state);

  it('a competing retry past several windows gets idempotency-in-progress, another fence for the entity waits for the slot; the answer is recorded', async () => {
    const { up, gw } = await start(true);
    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise }));
    const first = command(gw.url, '/payments/long', { fence: 1, entity: 'e1', key: 'pg-long-1' });
    await up.waitForCalls(1);
    await sleep(1_600);
    await expectProblem(await command(gw.url, '/payments/long', { fence: 1, entity: 'e1', key: 'pg-long-1' }), 409, 'idempotency-in-progress');
    // The serial slot is renewed with the record: another command for the entity is still busy.
    await expectProblem(await command(gw.url, '/payments/long', { fence: 2, entity: 'e1', key: 'pg-long-other' }), 409, 'entity-busy');
    expect(await states(gw, 'pg-long-1')).toEqual(['in_progress']);
    gate.open();
    const res = await first;
    expect(res.status).toBe(201);
    expect((await effectOf(res)).effect).toBe(1);
    expect(await states(gw, 'pg-long-1')).toEqual(['completed']);
    expect(up.effects).toBe(1);
  });

  it('negative control: without the renewal the retry finds the lock expired and the record outcome_unknown', async () => {
    const { up, gw } = await start(false);
    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise }));
    const first = command(gw.url, '/payments/long', { fence: 1, entity: 'e1', key: 'pg-long-2' });
    await up.waitForCalls(1);
    await sleep(1_600);
    await expectProblem(await command(gw.url, '/payments/long', { fence: 1, entity: 'e1', key: 'pg-long-2' }), 409, 'outcome-unknown');
    gate.open();
    expect((await first).status).toBe(201);
    expect(up.effects).toBe(1);
  });
});
