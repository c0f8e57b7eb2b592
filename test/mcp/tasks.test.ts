import { afterEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { argumentsDigest, readMessage } from '../../src/http/mcp/message.js';
import type { GatewayStore } from '../../src/store/types.js';
import { delegate } from '../helpers/delegate.js';
import { until } from '../helpers/gateway.js';
import { connectClient, fenced, mcpRoute, startMcpGateway, type McpGateway } from './harness.js';
import { startTaskUpstream, type TaskUpstream } from './task-upstream.js';

// MCP tasks (2025-11-25) through an mcp route, with the real SDK on both
// sides: a task call's key covers `params.task`, the record (key and serial
// slot) stays in progress while the gateway follows the task, the task's
// result is what a retry from any session gets, `tasks/cancel` is fenced,
// and a blocking `tasks/result` is not cut at the route's timeoutMs.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const Any = z.looseObject({});

async function setup(
  routeOverrides: Record<string, unknown> = {},
  json = true,
  wrapStore?: (s: GatewayStore) => GatewayStore,
): Promise<{ up: TaskUpstream; gw: McpGateway; url: string; offUrl: string }> {
  const up = await startTaskUpstream({ json });
  cleanups.push(() => up.close());
  const gw = await startMcpGateway(
    [
      mcpRoute(up.url, { tools: { '*': { readOnly: false } }, timeoutMs: 5_000, ...routeOverrides }),
      // The negative control: the same upstream, no fence and no key.
      mcpRoute(up.url, { name: 'unchecked', match: { path: '/unchecked' }, fence: 'off', idempotency: 'off', mode: 'concurrent' }),
    ],
    wrapStore ? { wrapStore } : {},
  );
  cleanups.push(() => gw.close());
  return { up, gw, url: `${gw.url}/mcp`, offUrl: `${gw.url}/unchecked` };
}

async function agent(url: string) {
  const c = await connectClient(url);
  cleanups.push(() => c.close());
  return c.client;
}

const taskCall = (fence: number, entity: string, key: string, amount = 5) => ({
  method: 'tools/call' as const,
  params: { name: 'charge', arguments: { amount }, task: { ttl: 60_000 }, _meta: fenced(fence, entity, key) },
});

const rpcError = async (p: Promise<unknown>): Promise<{ code: number; data?: { type?: string } }> => {
  try {
    await p;
  } catch (err) {
    return err as { code: number; data?: { type?: string } };
  }
  throw new Error(`expected a JSON-RPC error, got ${JSON.stringify(await p)}`);
};

const stateOf = async (gw: McpGateway, key: string) => (await gw.sqlite.getRecords(key))[0]?.state;

describe('the fingerprint covers params.task', () => {
  it('a plain call and a task call are two digests; a plain call keeps the digest it had', () => {
    const enc = (o: unknown) => new TextEncoder().encode(JSON.stringify(o));
    const plain = enc({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'charge', arguments: { amount: 5 } } });
    const task = enc({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'charge', arguments: { amount: 5 }, task: { ttl: 1 } } });
    expect(argumentsDigest(task, true)).not.toBe(argumentsDigest(plain, false));
    // A task call read without its task (the check switched off) would be the plain call: the control.
    expect(argumentsDigest(task, false)).toBe(argumentsDigest(plain, false));
  });

  it('a task that is not an object, or a Task member in another case, is refused before anything', () => {
    const read = (params: Record<string, unknown>) =>
      readMessage(
        new TextEncoder().encode(JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'charge', arguments: {}, ...params } })),
      );
    expect(read({ task: 5 }).kind).toBe('refused');
    expect(read({ Task: {} }).kind).toBe('refused');
    // The control: the same call with `task` as written is a call.
    expect(read({ task: {} }).kind).toBe('call');
  });

  it('a plain call with a task call key is idempotency-key-reused and never reaches the server', async () => {
    const { up, url } = await setup();
    up.autoComplete = true;
    const a = await agent(url);
    await a.request(taskCall(1, 'acct-1', 'k-task'), Any);
    await until(() => up.executions === 1, 'the task ran');
    const err = await rpcError(a.callTool({ name: 'charge', arguments: { amount: 5 }, _meta: fenced(1, 'acct-1', 'k-task') }));
    expect(err.code).toBe(-32003);
    expect(err.data?.type).toBe('idempotency-key-reused');
    expect(up.methods().filter((m) => m === 'tools/call')).toHaveLength(1);
  });
});

describe('a task call is followed to its end', () => {
  it.each([true, false])('json=%s: the handle now, in-progress and entity-busy while it runs, its result for a retry from another session', async (json) => {
    const { up, gw, url } = await setup({ serialWaitMs: 0, timeoutMs: 10_000 }, json);
    const a = await agent(url);
    const created = (await a.request(taskCall(1, 'acct-1', 'k-1'), Any)) as { task?: { taskId: string; status: string } };
    expect(created.task?.status).toBe('working');
    expect(up.executions).toBe(1);
    expect(await stateOf(gw, 'k-1')).toBe('in_progress');

    // While it runs: a retry (another session) is in progress, a second task of the serial entity waits its turn.
    const b = await agent(url);
    expect((await rpcError(b.request(taskCall(1, 'acct-1', 'k-1'), Any))).data?.type).toBe('idempotency-in-progress');
    expect((await rpcError(b.request(taskCall(1, 'acct-1', 'k-2'), Any))).data?.type).toBe('entity-busy');
    expect(up.executions).toBe(1);
    // The gateway polls the task in the call's session.
    await until(() => up.methods().includes('tasks/get'), 'the gateway polls the task');

    up.release();
    await until(async () => (await stateOf(gw, 'k-1')) === 'completed', 'the task result recorded');
    // A retry from a third session gets the task's result (a CallToolResult), not a handle it could not read.
    const c = await agent(url);
    const replay = (await c.request(taskCall(1, 'acct-1', 'k-1'), Any)) as { content?: { text: string }[]; task?: unknown };
    expect(replay.task).toBeUndefined();
    expect(replay.content?.[0]?.text).toBe('charged 5 (#1)');
    expect(up.executions).toBe(1);
    // The slot is free again.
    await b.request(taskCall(1, 'acct-1', 'k-2'), Any);
    expect(up.executions).toBe(2);
    up.release();
    await until(async () => (await stateOf(gw, 'k-2')) === 'completed', 'the second task recorded');
  });

  it('negative control: without the gateway a second task of the entity runs at once and a retry runs again', async () => {
    const { up, offUrl } = await setup();
    const a = await agent(offUrl);
    await a.request(taskCall(1, 'acct-1', 'k-1'), Any);
    await a.request(taskCall(1, 'acct-1', 'k-1'), Any);
    expect(up.executions).toBe(2);
    expect(up.running()).toBe(2);
  });
});

describe("the record outlives the route's lock while the task runs", () => {
  // The lock is timeoutMs + lockMarginMs = 400 ms; the task runs well past it.
  it.each([
    ['kept alive', false],
    // The negative control: the extension answers yes but extends nothing, so the lock runs out under the running task.
    ['not extended (control)', true],
  ])('%s', async (_name, switchedOff) => {
    const { up, gw, url } = await setup(
      { timeoutMs: 300, lockMarginMs: 100, serialWaitMs: 0 },
      true,
      switchedOff ? (s) => delegate(s, { extendLock: async () => true }) : undefined,
    );
    const a = await agent(url);
    await a.request(taskCall(1, 'acct-1', 'k-1'), Any);
    await new Promise((r) => setTimeout(r, 1_000));
    const b = await agent(url);
    const second = await b.request(taskCall(1, 'acct-1', 'k-2'), Any).then(
      () => 'ran',
      (err: { data?: { type?: string } }) => err.data?.type,
    );
    if (switchedOff) {
      // The slot ran out: a second task of the serial entity runs beside the first.
      expect(second).toBe('ran');
      expect(up.executions).toBe(2);
      return;
    }
    expect(second).toBe('entity-busy');
    expect(await stateOf(gw, 'k-1')).toBe('in_progress');
    up.release();
    await until(async () => (await stateOf(gw, 'k-1')) === 'completed', 'the task result recorded');
    expect(up.executions).toBe(1);
  });

  it('a gateway that closes while it follows a task records it unknown, with the handle as its interim answer', async () => {
    // The store outlives this gateway (closed by the harness), so the record can be read after.
    const { up, gw, url } = await setup({ timeoutMs: 300, lockMarginMs: 100 }, true, (s) => delegate(s, { close: async () => {} }));
    const a = await agent(url);
    const created = (await a.request(taskCall(1, 'acct-1', 'k-1'), Any)) as { task: { taskId: string } };
    await until(() => up.methods().includes('tasks/get'), 'the gateway polls the task');
    await gw.running.gateway.close();
    const [record] = await gw.sqlite.getRecords('k-1');
    expect(record?.state).toBe('outcome_unknown');
    expect(record?.interim).toBe(true);
    const interim = await gw.sqlite.getInterim({ scope: record!.scope, key: 'k-1', createdAt: record!.createdAt });
    expect(JSON.parse(new TextDecoder().decode(interim!.body)).result.task.taskId).toBe(created.task.taskId);
  });
});

describe('tasks/cancel is fenced', () => {
  it('without a fence or with a stale one it is refused and never reaches the server; with the current fence it passes', async () => {
    const { up, url } = await setup();
    const a = await agent(url);
    const created = (await a.request(taskCall(5, 'acct-1', 'k-1'), Any)) as { task: { taskId: string } };
    const cancel = (meta: Record<string, string>) => a.request({ method: 'tasks/cancel', params: { taskId: created.task.taskId, _meta: meta } }, Any);

    expect((await rpcError(cancel({ 'io.fencegate/entity': 'acct-1' }))).data?.type).toBe('missing-fence');
    const stale = await rpcError(cancel({ 'io.fencegate/fence': '3', 'io.fencegate/entity': 'acct-1' }));
    expect(stale.code).toBe(-32001);
    expect(stale.data?.type).toBe('stale-fence');
    expect(up.methods()).not.toContain('tasks/cancel');

    // The control: the current fence reaches the server, which cancels the task.
    const cancelled = (await cancel({ 'io.fencegate/fence': '5', 'io.fencegate/entity': 'acct-1' })) as { status?: string };
    expect(cancelled.status).toBe('cancelled');
    expect(up.methods()).toContain('tasks/cancel');
  });

  it('a stale holder cannot cancel a followed task by naming another entity: the task is changed only under its own', async () => {
    const { up, url } = await setup();
    const a = await agent(url);
    const created = (await a.request(taskCall(5, 'acct-1', 'k-1'), Any)) as { task: { taskId: string } };
    const cancel = (meta: Record<string, string>) => a.request({ method: 'tasks/cancel', params: { taskId: created.task.taskId, _meta: meta } }, Any);
    // Holder 3 of acct-1 is stale (5 was accepted). It names an entity nobody uses, with fence 1.
    const outcome = await cancel({ 'io.fencegate/fence': '1', 'io.fencegate/entity': 'unrelated-entity' }).then(
      () => 'cancelled',
      (err: { data?: { type?: string } }) => err.data?.type ?? 'error',
    );
    expect(up.methods()).not.toContain('tasks/cancel');
    expect(outcome).not.toBe('cancelled');
  });

  it('a tasks/cancel spelt another way is refused', async () => {
    const { up, url } = await setup();
    const res = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'Tasks/Cancel', params: { taskId: 'x' } }),
    });
    expect(((await res.json()) as { error: { data: { type: string } } }).error.data.type).toBe('invalid-request');
    expect(up.methods()).toHaveLength(0);
  });
});

describe('a blocking tasks/result', () => {
  it("is bounded by taskTimeoutMs, not the route's timeoutMs", async () => {
    const { up, url } = await setup({ timeoutMs: 300, taskTimeoutMs: 20_000 });
    const a = await agent(url);
    const created = (await a.request(taskCall(1, 'acct-1', 'k-1'), Any)) as { task: { taskId: string } };
    const result = a.request({ method: 'tasks/result', params: { taskId: created.task.taskId } }, Any, { timeout: 20_000 });
    // Longer than the route's timeoutMs.
    await new Promise((r) => setTimeout(r, 900));
    up.release();
    const got = (await result) as { content?: { text: string }[] };
    expect(got.content?.[0]?.text).toBe('charged 5 (#1)');
  });
});
