import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { longCallBudget, lockSafetyMs } from '../../src/http/lock-budget.js';
import { overrideStore } from '../../src/store/override.js';
import { command, effectOf, expectProblem, paymentsRoute, recordRows, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// A long call (DESIGN §3.6 "Long calls"): the admission locks the record for
// the route's lockWindow, and the gateway renews the lock with the store's
// extendLock while the upstream holds the connection. Short values here: a
// window of 400 ms, renewed every 100 ms, and an upstream that answers only
// after several windows have passed.

const WINDOW = { lockWindow: '400ms', renewEvery: '100ms' };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let up: FakeUpstream | null = null;
let gw: TestGateway | null = null;
afterEach(async () => {
  await gw?.close();
  await up?.close();
  gw = null;
  up = null;
});

async function start(wrap?: Parameters<typeof startTestGateway>[0]['wrapStore']) {
  up = await startUpstream();
  gw = await startTestGateway({
    // lockMarginMs 100: the pause check keeps 50 ms off a window of 400.
    routes: [paymentsRoute(up.url, { timeoutMs: 30_000, lockMarginMs: 100, longCall: WINDOW })],
    // The sweeper must not be what marks the record: the admission's rule f is.
    config: { sweepInterval: '1h' },
    ...(wrap !== undefined ? { wrapStore: wrap } : {}),
  });
  return { up, gw };
}

describe('long calls: the lock renewed while the upstream holds the connection', () => {
  it('keeps the record in progress past several windows: a competing retry gets idempotency-in-progress, then the answer is recorded and replayed', async () => {
    const { up, gw } = await start();
    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise }));
    const first = command(gw.url, '/payments/long', { fence: 1, entity: 'e1', key: 'long-1' });
    await up.waitForCalls(1);
    // Four windows: without renewal the lock would have ended long ago.
    await sleep(1_600);
    await expectProblem(await command(gw.url, '/payments/long', { fence: 1, entity: 'e1', key: 'long-1' }), 409, 'idempotency-in-progress');
    expect(recordRows(gw.sqlite, 'long-1').map((r) => r.state)).toEqual(['in_progress']);
    gate.open();
    const res = await first;
    expect(res.status).toBe(201);
    expect((await effectOf(res)).effect).toBe(1);
    expect(recordRows(gw.sqlite, 'long-1').map((r) => r.state)).toEqual(['completed']);
    const again = await command(gw.url, '/payments/long', { fence: 1, entity: 'e1', key: 'long-1' });
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(up.effects).toBe(1);
  });

  it('negative control: without the renewal the window ends, the retry marks the record outcome_unknown, and nothing is sent twice', async () => {
    const { up, gw } = await start((s) =>
      overrideStore(s, {
        extendLock: async () => {
          throw new Error('store down (test)');
        },
      } as never),
    );
    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise }));
    const first = command(gw.url, '/payments/long', { fence: 1, entity: 'e1', key: 'long-2' });
    await up.waitForCalls(1);
    await sleep(1_600);
    await expectProblem(await command(gw.url, '/payments/long', { fence: 1, entity: 'e1', key: 'long-2' }), 409, 'outcome-unknown');
    expect(recordRows(gw.sqlite, 'long-2').map((r) => r.state)).toEqual(['outcome_unknown']);
    gate.open();
    // The late answer still belongs to its owner (nobody took the record over, DESIGN §3.7).
    expect((await first).status).toBe(201);
    expect(up.effects).toBe(1);
  });

  it('a lost lock never releases the record: a "not processed" answer after the lapse leaves it outcome_unknown', async () => {
    const { up, gw } = await start((s) =>
      overrideStore(s, {
        extendLock: async () => {
          throw new Error('store down (test)');
        },
      } as never),
    );
    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise, then: { kind: 'respond', status: 503, body: 'busy' } }));
    const first = command(gw.url, '/payments/long', { fence: 1, entity: 'e1', key: 'long-3' });
    await up.waitForCalls(1);
    await sleep(1_600);
    await expectProblem(await command(gw.url, '/payments/long', { fence: 1, entity: 'e1', key: 'long-3' }), 409, 'outcome-unknown');
    gate.open();
    expect((await first).status).toBe(503);
    expect(recordRows(gw.sqlite, 'long-3').map((r) => r.state)).toEqual(['outcome_unknown']);
    await expectProblem(await command(gw.url, '/payments/long', { fence: 1, entity: 'e1', key: 'long-3' }), 409, 'outcome-unknown');
    expect(up.effects).toBe(1);
  });

  it('negative control of the rule above: with the lock held, the same answer releases the record', async () => {
    const { up, gw } = await start();
    up.behave(() => ({ kind: 'respond', status: 503, body: 'busy' }));
    expect((await command(gw.url, '/payments/long', { fence: 1, entity: 'e1', key: 'long-4' })).status).toBe(503);
    expect(recordRows(gw.sqlite, 'long-4')).toEqual([]);
  });
});

describe('the long call pause check', () => {
  it('measures from the lock as extended and keeps the whole route timeout', () => {
    const safetyMs = lockSafetyMs(2_000);
    expect(longCallBudget({ lockEnds: 60_000, windowMs: 60_000, safetyMs, routeTimeoutMs: 3_600_000, now: 100 })).toEqual({
      timeoutMs: 3_600_000,
      startBy: 60_000 - safetyMs,
    });
    // Less than half a window left: nothing is sent, however long the route's timeout.
    expect(longCallBudget({ lockEnds: 60_000, windowMs: 60_000, safetyMs, routeTimeoutMs: 3_600_000, now: 29_751 })).toBeNull();
    // The same moment after a renewal: sent.
    expect(longCallBudget({ lockEnds: 89_000, windowMs: 60_000, safetyMs, routeTimeoutMs: 3_600_000, now: 29_751 })?.timeoutMs).toBe(3_600_000);
  });
});

describe('longCall and asyncReply in the configuration', () => {
  const base = (route: Record<string, unknown>) => ({ routes: [paymentsRoute('http://127.0.0.1:9', route)] });
  const problem = (route: Record<string, unknown>) => {
    try {
      parseConfig(base(route));
    } catch (err) {
      return (err as Error).message;
    }
    return null;
  };

  it('takes hours of timeout only with longCall', () => {
    expect(problem({ timeoutMs: 3_600_000 })).toMatch(/routes\[0\]\.timeoutMs: over 600000 \(10m\) needs "longCall"/);
    expect(problem({ timeoutMs: 3_600_000, longCall: {} })).toBeNull();
    const c = parseConfig(base({ timeoutMs: 3_600_000, longCall: { lockWindow: '90s' } }));
    expect(c.routes[0]!.longCall).toEqual({ lockWindow: 90_000, renewEvery: 30_000 });
    expect(problem({ timeoutMs: 86_400_001, longCall: {} })).toMatch(/routes\[0\]\.timeoutMs/);
  });

  it('refuses a renewal that could not survive one failure, an mcp route, a route without idempotency', () => {
    expect(problem({ longCall: { lockWindow: '1s', renewEvery: '600ms' } })).toMatch(/routes\[0\]\.longCall\.renewEvery: must be at most half of lockWindow/);
    expect(problem({ longCall: { lockWindow: '400ms' } })).toMatch(/routes\[0\]\.longCall: lockWindow must be over twice the pause check's margin \(250 ms/);
    expect(problem({ longCall: {}, idempotency: 'off' })).toMatch(/routes\[0\]\.longCall: needs idempotency/);
    expect(problem({ longCall: {}, protocol: 'mcp', match: { path: '/mcp' } })).toMatch(/routes\[0\]\.longCall: not available on an mcp route/);
  });

  it('refuses asyncReply on an mcp route, without idempotency, with onUnknown "retry"', () => {
    expect(problem({ asyncReply: {} })).toBeNull();
    expect(problem({ asyncReply: {}, protocol: 'mcp', match: { path: '/mcp' } })).toMatch(/routes\[0\]\.asyncReply: not available on an mcp route/);
    expect(problem({ asyncReply: {}, idempotency: 'off' })).toMatch(/routes\[0\]\.asyncReply: needs idempotency/);
    expect(problem({ asyncReply: {}, onUnknown: 'retry' })).toMatch(/routes\[0\]\.asyncReply: does not go with onUnknown "retry"/);
  });
});
