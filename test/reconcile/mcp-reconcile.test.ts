import { afterEach, describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../../src/config/load.js';
import { readStatusResult } from '../../src/http/mcp/reconcile.js';
import { createFetchForwarder } from '../../src/http/forward-fetch.js';
import { createReconcileQuery } from '../../src/http/pipeline/reconcile.js';
import type { ReconcileTarget } from '../../src/http/pipeline/reconcile-rules.js';
import { delegate } from '../helpers/delegate.js';
import { z } from 'zod';
import { until } from '../helpers/gateway.js';
import { connectClient, fenced, mcpRoute, startMcpGateway, type McpGateway } from '../mcp/harness.js';
import { PAYMENT_RECONCILE, paymentRoute, startTaskUpstream, type TaskUpstream } from '../mcp/task-upstream.js';

// An mcp route's `reconcile` (DESIGN §3.12, docs/mcp.md): a status tool of
// the real SDK server (`get_payment`), asked by the lost call's key. A call
// the server performed is found and its retry gets the answer; one it did
// not perform is released once the bound has passed, and its retry runs; a
// status tool that lags behind its own writes never causes a second
// execution within the bound (and does, in the negative control, once the
// bound is switched off).

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(settleTime: string): Promise<{ up: TaskUpstream; gw: McpGateway; url: string }> {
  const up = await startTaskUpstream({ json: true });
  cleanups.push(() => up.close());
  const gw = await startMcpGateway([paymentRoute(up.url, { reconcile: { ...PAYMENT_RECONCILE, settleTime } })]);
  cleanups.push(() => gw.close());
  return { up, gw, url: `${gw.url}/mcp` };
}

type RpcError = { code: number; data?: { type?: string; reconciling?: boolean; retry_after?: number } };
async function outcome(p: Promise<unknown>): Promise<{ ok: true; result: any } | { ok: false; error: RpcError }> {
  try {
    return { ok: true, result: await p };
  } catch (err) {
    return { ok: false, error: err as RpcError };
  }
}

const pay = (key: string) => ({ name: 'pay', arguments: { ref: key, amount: 7 }, _meta: fenced(1, 'acct-1', key) });
const stateOf = async (gw: McpGateway, key: string) => (await gw.sqlite.getRecords(key))[0]?.state;

async function lostCall(gw: McpGateway, url: string, key: string): Promise<void> {
  const c = await connectClient(url);
  cleanups.push(() => c.close());
  const first = await outcome(c.client.callTool(pay(key)));
  expect(first.ok).toBe(false);
  await until(async () => (await stateOf(gw, key)) === 'outcome_unknown', 'the answer is lost');
}

describe('mcp reconcile through a status tool', () => {
  it('a timed-out call the server performed is found: the retry from another session gets the answer, nothing runs twice', async () => {
    const { up, gw, url } = await setup('30s');
    up.payGate = new Promise(() => {});
    await lostCall(gw, url, 'k-found');
    up.payGate = null;
    expect(up.paid).toEqual(['k-found']);

    const c = await connectClient(url);
    cleanups.push(() => c.close());
    const retry = (await c.client.callTool(pay('k-found'))) as { structuredContent?: { found?: boolean; ref?: string }; _meta?: Record<string, unknown> };
    expect(retry.structuredContent).toMatchObject({ found: true, ref: 'k-found' });
    expect(retry._meta?.['io.fencegate/reconciled']).toBe(true);
    expect(await stateOf(gw, 'k-found')).toBe('completed');
    expect(up.paid).toEqual(['k-found']);
  });

  it('a timed-out call the server did not perform: outcome-unknown with the hint until the bound, then released and forwarded', async () => {
    const { up, gw, url } = await setup('1s');
    // The call reaches the server, which does not charge before the gateway gives up.
    up.payBefore = new Promise(() => {});
    await lostCall(gw, url, 'k-none');
    up.payBefore = null;
    expect(up.paid).toEqual([]);

    const c = await connectClient(url);
    cleanups.push(() => c.close());
    const early = await outcome(c.client.callTool(pay('k-none')));
    expect(early.ok).toBe(false);
    if (!early.ok) {
      expect(early.error.code).toBe(-32005);
      expect(early.error.data?.reconciling).toBe(true);
      expect(early.error.data?.retry_after).toBeGreaterThanOrEqual(1);
    }
    expect(up.paid).toEqual([]);

    // Past timeoutMs + lockMarginMs + settleTime from the admission: released, and the retry runs.
    const ran = await until(async () => {
      const r = await outcome(c.client.callTool(pay('k-none')));
      return r.ok ? r.result : null;
    }, 'the retry forwarded once the not-found is trusted');
    expect((ran as { structuredContent?: unknown }).structuredContent).toEqual({ ref: 'k-none', amount: 7 });
    expect(up.paid).toEqual(['k-none']);
  });

  it.each([
    ['30s', 1],
    // The negative control: no settle time, so a lagging "not found" is trusted as soon as the lock has passed.
    ['0ms', 2],
  ])('a lagging status tool (settleTime %s): payments %i', async (settleTime, payments) => {
    const { up, gw, url } = await setup(settleTime);
    up.payGate = new Promise(() => {});
    await lostCall(gw, url, 'k-lag');
    up.payGate = null;
    // The charge happened, the status tool does not show it yet.
    up.lagging = true;
    const c = await connectClient(url);
    cleanups.push(() => c.close());
    // Past the lock (timeoutMs + lockMarginMs) for sure.
    await new Promise((r) => setTimeout(r, 600));
    const retry = await outcome(c.client.callTool(pay('k-lag')));
    if (payments === 1) {
      expect(retry.ok).toBe(false);
      if (!retry.ok) expect(retry.error.data?.type).toBe('outcome-unknown');
    } else expect(retry.ok).toBe(true);
    expect(up.paid).toHaveLength(payments);
  });

  it('the background pass settles a found record with no retry', async () => {
    const { up, gw, url } = await setup('30s');
    up.payGate = new Promise(() => {});
    await lostCall(gw, url, 'k-bg');
    up.payGate = null;
    const pass = await gw.running.gateway.reconcile();
    expect(pass.asked.found).toBe(1);
    expect(await stateOf(gw, 'k-bg')).toBe('completed');
    expect(up.paid).toEqual(['k-bg']);
  });
});

describe('a task call recorded unknown with its handle', () => {
  it('is asked about by tasks/get and tasks/result: the task over, its result completes the record; never released while it runs', async () => {
    const up = await startTaskUpstream({ json: true, stateless: true });
    cleanups.push(() => up.close());
    // The store outlives the gateway (it closes mid-follow), so the reconciler can be run on it after.
    const gw = await startMcpGateway([paymentRoute(up.url, { reconcile: { ...PAYMENT_RECONCILE, settleTime: '0ms' } })], {
      wrapStore: (s) => delegate(s, { close: async () => {} }),
    });
    cleanups.push(() => gw.close());
    const c = await connectClient(`${gw.url}/mcp`);
    cleanups.push(() => c.close());
    const call = { method: 'tools/call', params: { name: 'charge', arguments: { amount: 3 }, task: {}, _meta: fenced(1, 'acct-1', 'k-task') } };
    await c.client.request(call, z.looseObject({}));
    await until(() => up.methods().includes('tasks/get'), 'the gateway follows the task');
    await gw.running.gateway.close();
    const [record] = await gw.sqlite.getRecords('k-task');
    expect(record?.state).toBe('outcome_unknown');
    expect(record?.interim).toBe(true);

    const logs: unknown[] = [];
    const keep = (msg: string, fields?: object) => void logs.push({ msg, ...fields });
    const query = createReconcileQuery({
      store: gw.sqlite,
      forwarder: createFetchForwarder(),
      logger: { info: keep, warn: keep, error: keep },
      headers: new Map(),
    });
    const route = gw.running.gateway.config.routes[0]! as ReconcileTarget['route'];
    const target: ReconcileTarget = {
      route,
      scope: record!.scope,
      key: 'k-task',
      entity: 'acct-1',
      fence: '1',
      createdAt: record!.createdAt,
      requestId: record!.requestId,
      attemptUntil: record!.attemptUntil,
    };
    // Still running: nothing changes (the status tool would say "not found", settleTime is 0: the task is asked instead).
    expect((await query(target, 2_000)).result).toBe('unknown');
    expect((await gw.sqlite.getRecords('k-task'))[0]?.state).toBe('outcome_unknown');
    up.release();
    await until(async () => (await query(target, 2_000)).result === 'found', 'the task is over');
    const [done] = await gw.sqlite.getRecords('k-task');
    expect(done?.state).toBe('completed');
    expect(up.executions).toBe(1);
  });
});

describe('the status tool result rule', () => {
  const rc = parseConfig({
    store: { sqlite: ':memory:' },
    routes: [mcpRoute('http://127.0.0.1:9', { reconcile: { ...PAYMENT_RECONCILE, found: { pointer: '/structuredContent/found', equals: true } } })],
  }).routes[0]!.reconcile as Parameters<typeof readStatusResult>[0];
  it('notFound marker → not-found; structured, not an error and the found marker → found; anything else unknown', () => {
    expect(readStatusResult(rc, { content: [], structuredContent: { found: false } })).toBe('not-found');
    expect(readStatusResult(rc, { content: [], structuredContent: { found: true } })).toBe('found');
    expect(readStatusResult(rc, { content: [], isError: true, structuredContent: { found: true } })).toBe('unknown');
    expect(readStatusResult(rc, { content: [{ type: 'text', text: 'found' }] })).toBe('unknown');
    expect(readStatusResult(rc, { content: [], structuredContent: { found: 'maybe' } })).toBe('unknown');
  });
});

describe('a bad mcp reconcile stops start-up with one line', () => {
  const refusal = (route: Record<string, unknown>): string => {
    try {
      parseConfig({ store: { sqlite: ':memory:' }, routes: [route] });
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigError);
      return (err as Error).message.split('\n').slice(1).join('\n').trim();
    }
    throw new Error('accepted');
  };
  it.each([
    [{ ...PAYMENT_RECONCILE, arguments: { ref: 'fixed' } }, /^routes\[0\]\.reconcile\.arguments: names no \{key\}/],
    [{ ...PAYMENT_RECONCILE, arguments: { ref: '{key}-{request_id}' } }, /^routes\[0\]\.reconcile\.arguments: unknown variable \{request_id\}/],
    [{ tool: 'get_payment', arguments: { ref: '{key}' } }, /^routes\[0\]\.reconcile\.notFound: required$/],
    [{ path: '/status/{key}' }, /^routes\[0\]\.reconcile: an mcp route asks a status tool/],
  ])('%j', (reconcile, message) => {
    const line = refusal(mcpRoute('http://127.0.0.1:9', { reconcile }));
    expect(line).toMatch(message);
    expect(line.split('\n')).toHaveLength(1);
  });
  it('a status tool on a plain route', () => {
    expect(refusal({ name: 'p', match: { path: '/p' }, upstream: 'http://127.0.0.1:9', reconcile: PAYMENT_RECONCILE })).toMatch(
      /^routes\[0\]\.reconcile: a status tool \("tool"\) is for an mcp route/,
    );
  });
});
