import { EventEmitter } from 'node:events';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { GatewayStore } from '../../src/store/types.js';
import { command, paymentsRoute, recordRows, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// A store outage that outlasts the first few finish retries (a PostgreSQL
// restart kept the server away ~1.5 s in postgres-restart.test.ts): the
// answered request must still be recorded as completed, so that the caller's
// retry gets the replay and not 409 outcome-unknown. The outage is a store
// wrapper whose finish throws until the test ends it (after more failed
// attempts than the old fixed schedule of four made), not a timer.

describe('a finish that meets a store outage', () => {
  let up: FakeUpstream;
  let gw: TestGateway;
  const events = new EventEmitter();
  let outage = false;
  let failed = 0;

  beforeAll(async () => {
    up = await startUpstream();
    const wrap = (inner: GatewayStore): GatewayStore =>
      new Proxy(inner, {
        get(target, prop, receiver) {
          if (prop === 'finish') {
            return async (input: Parameters<GatewayStore['finish']>[0]) => {
              if (outage) {
                failed++;
                events.emit('failed');
                throw new Error('connect ECONNREFUSED 127.0.0.1:5432 (simulated outage)');
              }
              return target.finish(input);
            };
          }
          const v = Reflect.get(target, prop, receiver);
          return typeof v === 'function' ? v.bind(target) : v;
        },
      });
    gw = await startTestGateway({ routes: [paymentsRoute(up.url, { timeoutMs: 10_000, lockMarginMs: 2_000 })], wrapStore: wrap });
  });

  afterAll(async () => {
    outage = false;
    await gw?.close();
    await up?.close();
  });

  it('is retried while the record’s lock lives: the answer is recorded and the retry gets the replay', async () => {
    outage = true;
    const pending = command(gw.url, '/payments/charges', { fence: 1, entity: 'tool-job:outage', key: 'outage-1' });
    // Five failed finishes: one more than the old schedule (0, 50, 200, 1000 ms) ever tried.
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`only ${failed} finish attempts were made`)), 20_000);
      const check = () => {
        if (failed < 5) return;
        clearTimeout(timer);
        events.off('failed', check);
        resolve();
      };
      events.on('failed', check);
      check();
    });
    outage = false;
    const res = await pending;
    expect(res.status).toBe(201);
    const body = await res.text();
    expect(recordRows(gw.sqlite, 'outage-1')).toMatchObject([{ state: 'completed', status: 201 }]);

    const retry = await command(gw.url, '/payments/charges', { fence: 1, entity: 'tool-job:outage', key: 'outage-1' });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(await retry.text()).toBe(body);
    expect(up.callsFor('outage-1')).toHaveLength(1);
  });
});
