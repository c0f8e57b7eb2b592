import { afterEach, describe, expect, it } from 'vitest';
import { createUndiciForwarder } from '../../src/http/forward-undici.js';
import type { Forwarder } from '../../src/http/forward.js';
import { MCP_ERROR_CODES, MCP_META } from '../../src/protocol/mcp.js';
import { connectClient, fenced, mcpRoute, rawPost, startMcpGateway, textOf } from './harness.js';
import { rawUpstream, toolCall, type Handler } from './raw-upstream.js';

// The JSON-RPC edges of a decided call: a `method` that is not a string, a
// `_meta` fence written as a number in a non-canonical form, and answers
// that are not the call's (an SSE event of another type, a response to
// another id). Each case has its control beside it: the same message in the
// accepted form is decided, or the hostile upstream does act on what the
// gateway refuses to send it.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(handler: Handler, route: Record<string, unknown> = {}, forwarder?: Forwarder) {
  const up = await rawUpstream(handler);
  cleanups.push(() => up.close());
  const gw = await startMcpGateway([mcpRoute(up.url, route)], forwarder ? { forwarder } : {});
  cleanups.push(() => gw.close());
  return { up, gw };
}

type RpcAnswer = { id: unknown; result?: { content: { text: string }[] }; error?: { code: number; data: { type: string } } };
const post = async (url: string, body: string) => (await (await rawPost(`${url}/mcp`, body)).json()) as RpcAnswer;

/** A JSON-RPC server as some JS upstreams are written: handlers looked up in a plain object by `msg.method`. */
function lookupByKey(): { handler: Handler; ran: () => number } {
  let ran = 0;
  const handlers: Record<string, (m: { id: unknown }) => unknown> = {
    'tools/call': () => ({ content: [{ type: 'text', text: `run ${++ran}` }] }),
    ping: () => ({}),
  };
  return {
    ran: () => ran,
    handler: (_req, res, body) => {
      const doc = JSON.parse(body);
      const answer = (m: { id: unknown; method: unknown }) => {
        const h = handlers[m.method as string];
        return h ? { jsonrpc: '2.0', id: m.id, result: h(m) } : { jsonrpc: '2.0', id: m.id, error: { code: -32601, message: 'no such method' } };
      };
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(Array.isArray(doc) ? doc.map(answer) : answer(doc)));
    },
  };
}

describe('a method that is not a string', () => {
  const call = (method: unknown) => JSON.stringify({ jsonrpc: '2.0', id: 5, method, params: { name: 'pay', arguments: {} } });

  it('is refused -32600 invalid-request, alone and in a batch, never forwarded, logged as a decision', async () => {
    const server = lookupByKey();
    const { up, gw } = await setup(server.handler);
    for (const method of [['tools/call'], null, { 0: 't' }, 7, true]) {
      const single = await post(gw.url, call(method));
      expect(single, JSON.stringify(method)).toMatchObject({ id: 5, error: { code: -32600, data: { type: 'invalid-request' } } });
      const batch = await post(gw.url, `[${JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' })},${call(method)}]`);
      expect(batch, JSON.stringify(method)).toMatchObject({ id: null, error: { code: -32600, data: { type: 'invalid-request' } } });
    }
    expect(up.seen).toHaveLength(0);
    expect(server.ran()).toBe(0);
    expect(gw.decisions().map((d) => d.decision)).toEqual(Array(10).fill('invalid-request'));
  });

  it('control: the same upstream, sent the message directly, runs ["tools/call"] as a call; a string method other than tools/call still passes', async () => {
    const server = lookupByKey();
    const { up, gw } = await setup(server.handler);
    const direct = (await (await rawPost(up.url, call(['tools/call']))).json()) as RpcAnswer;
    expect(direct.result?.content[0]?.text).toBe('run 1');
    expect(server.ran()).toBe(1);
    expect(await post(gw.url, JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'ping' }))).toMatchObject({ id: 2, result: {} });
    expect(await post(gw.url, JSON.stringify([{ jsonrpc: '2.0', id: 3, method: 'ping' }]))).toMatchObject([{ id: 3, result: {} }]);
  });
});

describe('a _meta fence written as a JSON number', () => {
  const withFence = (fenceLiteral: string, key: string) =>
    `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund","arguments":{"inv":1},"_meta":{"${MCP_META.fence}":${fenceLiteral},"${MCP_META.entity}":"inv-1","${MCP_META.idempotencyKey}":"${key}"}}}`;
  const echo: Handler = (_req, res, body) =>
    void res
      .writeHead(200, { 'content-type': 'application/json' })
      .end(JSON.stringify({ jsonrpc: '2.0', id: JSON.parse(body).id, result: { content: [{ type: 'text', text: 'ok' }] } }));

  it('is refused invalid-fence unless written as the one canonical decimal (1e3, 1000.0, 1000e0, 10E2 are not 1000); never forwarded', async () => {
    const { up, gw } = await setup(echo, { fence: 'required' });
    for (const literal of ['1e3', '1000.0', '1000e0', '10E2', '1.0e3', '-0']) {
      const r = await post(gw.url, withFence(literal, `k-${literal}`));
      expect(r, literal).toMatchObject({ id: 1, error: { code: MCP_ERROR_CODES['invalid-fence'], data: { type: 'invalid-fence' } } });
    }
    expect(up.seen).toHaveLength(0);
    // Logged as the other malformed fences are, with the value presented.
    const page = await gw.sqlite.listRejections({ reason: 'invalid-fence', tool: 'refund', limit: 50 });
    expect(page.items).toHaveLength(6);
  });

  it('control: 1000 as a number and "1000" as a string are one fence, decided and forwarded; a lower fence is then stale', async () => {
    const { up, gw } = await setup(echo, { fence: 'required' });
    expect(await post(gw.url, withFence('1000', 'k-a'))).toMatchObject({ id: 1, result: { content: [{ text: 'ok' }] } });
    expect(await post(gw.url, withFence('"1000"', 'k-b'))).toMatchObject({ id: 1, result: { content: [{ text: 'ok' }] } });
    expect(await post(gw.url, withFence('999', 'k-c'))).toMatchObject({ error: { data: { type: 'stale-fence' } } });
    expect(up.seen).toHaveLength(2);
  });
});

/** A stateless MCP server written by hand: JSON for initialize, 202 for notifications, `tools/call` answered with `events(id)`. */
function sseServer(events: (id: unknown) => string): { handler: Handler; calls: () => number } {
  let calls = 0;
  return {
    calls: () => calls,
    handler: (req, res, body) => {
      // No server stream (GET) and no session to end (DELETE): MCP lets a server answer 405.
      if (req.method !== 'POST') return void res.writeHead(405, { allow: 'POST' }).end();
      const m = JSON.parse(body);
      if (m.method === 'initialize') {
        const result = { protocolVersion: m.params.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: 'hostile', version: '1.0.0' } };
        return void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: m.id, result }));
      }
      if (m.id === undefined) return void res.writeHead(202).end();
      calls++;
      res.writeHead(200, { 'content-type': 'text/event-stream' }).end(events(m.id));
    },
  };
}
const result = (id: unknown, text: string) => JSON.stringify({ jsonrpc: '2.0', id, result: { content: [{ type: 'text', text }] } });
const progress = JSON.stringify({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'working' } });

describe("answers that are not the call's", () => {
  it('an SSE event of another type is never the answer: the SDK agent gets (and a retry replays) the message event', async () => {
    const server = sseServer(
      (id) => `event: decoy\ndata: ${result(id, 'decoy')}\n\nevent: message\ndata: ${progress}\n\nevent: message\ndata: ${result(id, 'real')}\n\n`,
    );
    const { gw } = await setup(server.handler);
    const agent = await connectClient(`${gw.url}/mcp`);
    cleanups.push(() => agent.close());
    const call = { name: 'refund', arguments: { inv: 1 }, _meta: fenced(1, 'inv-1', 'k-type') };
    expect(textOf(await agent.client.callTool(call))).toBe('real');
    expect(textOf(await agent.client.callTool(call))).toBe('real');
    expect(server.calls()).toBe(1);
    // The raw stream: the decoy is not passed on, the notification is.
    const raw = await (await rawPost(`${gw.url}/mcp`, toolCall(9, 'refund', { inv: 2 }, fenced(1, 'inv-2', 'k-type-raw')))).text();
    expect(raw).not.toContain('decoy');
    expect(raw).toContain('notifications/message');
    expect(raw).toContain('"real"');
  });

  it('a stream whose only response is in an event of another type has no answer: outcome unknown, the retry is -32005, not the decoy', async () => {
    const server = sseServer((id) => `event: decoy\ndata: ${result(id, 'decoy')}\n\n`);
    const { gw } = await setup(server.handler);
    const first = await (await rawPost(`${gw.url}/mcp`, toolCall(1, 'refund', { inv: 1 }, fenced(1, 'inv-1', 'k-only-decoy')))).text();
    expect(first).not.toContain('decoy');
    expect(first).toContain(`"code":${MCP_ERROR_CODES['upstream-timeout']}`);
    const retry = await post(gw.url, toolCall(2, 'refund', { inv: 1 }, fenced(1, 'inv-1', 'k-only-decoy')));
    expect(retry).toMatchObject({ id: 2, error: { code: MCP_ERROR_CODES['outcome-unknown'] } });
    expect(server.calls()).toBe(1);
  });

  it('a response to another id in the stream is not passed on nor recorded; the response to the call is', async () => {
    const server = sseServer((id) => `event: message\ndata: ${result(4242, 'someone else')}\n\nevent: message\ndata: ${result(id, 'mine')}\n\n`);
    const { gw } = await setup(server.handler);
    // The first answer as the caller's bytes: the stream as it was passed on.
    const raw = await (await rawPost(`${gw.url}/mcp`, toolCall(3, 'refund', { inv: 1 }, fenced(1, 'inv-1', 'k-id')))).text();
    expect(raw).not.toContain('someone else');
    expect(raw).toContain('"mine"');
    // The SDK agent's retry is the replay of the call's own response.
    const agent = await connectClient(`${gw.url}/mcp`);
    cleanups.push(() => agent.close());
    expect(textOf(await agent.client.callTool({ name: 'refund', arguments: { inv: 1 }, _meta: fenced(1, 'inv-1', 'k-id') }))).toBe('mine');
    expect(server.calls()).toBe(1);
  });

  it('read whole (a forwarder that cannot stream): the decoy and the response to another id are dropped from the body, the message event is stored', async () => {
    const inner = createUndiciForwarder();
    const whole: Forwarder = { forward: (r) => inner.forward(r), close: () => inner.close!() };
    const server = sseServer(
      (id) =>
        `event: decoy\ndata: ${result(id, 'decoy')}\n\ndata: ${result(4242, 'someone else')}\n\ndata: ${progress}\n\nevent: message\ndata: ${result(id, 'real')}\n\n`,
    );
    const { gw } = await setup(server.handler, {}, whole);
    const first = await (await rawPost(`${gw.url}/mcp`, toolCall(1, 'refund', { inv: 1 }, fenced(1, 'inv-1', 'k-whole')))).text();
    expect(first).not.toContain('decoy');
    expect(first).not.toContain('someone else');
    expect(first).toContain('notifications/message');
    expect(first).toContain('"real"');
    expect(await post(gw.url, toolCall(2, 'refund', { inv: 1 }, fenced(1, 'inv-1', 'k-whole')))).toMatchObject({
      id: 2,
      result: { content: [{ text: 'real' }] },
    });
    expect(server.calls()).toBe(1);
  });

  it('a JSON answer to another id is not handed on as the answer: -32009 to the call, the retry -32005', async () => {
    let calls = 0;
    const { gw } = await setup((_req, res) => {
      calls++;
      res.writeHead(200, { 'content-type': 'application/json' }).end(result(4242, 'someone else'));
    });
    const first = await (await rawPost(`${gw.url}/mcp`, toolCall(1, 'refund', { inv: 1 }, fenced(1, 'inv-1', 'k-json-id')))).text();
    expect(first).not.toContain('someone else');
    expect(JSON.parse(first)).toMatchObject({ id: 1, error: { code: MCP_ERROR_CODES['upstream-timeout'], data: { type: 'upstream-timeout' } } });
    expect(await post(gw.url, toolCall(2, 'refund', { inv: 1 }, fenced(1, 'inv-1', 'k-json-id')))).toMatchObject({
      id: 2,
      error: { code: MCP_ERROR_CODES['outcome-unknown'] },
    });
    expect(calls).toBe(1);
    expect(gw.decisions().map((d) => d.decision)).toEqual(['upstream-no-response', 'outcome-unknown']);
  });
});
