import { afterEach, describe, expect, it } from 'vitest';
import { createUndiciForwarder } from '../../src/http/forward-undici.js';
import { snapshot } from '../helpers/gateway.js';
import { freePort } from '../helpers/upstream.js';
import { connectClient, fenced, mcpRoute, rawPost, startMcpGateway, textOf } from './harness.js';
import { startMcpUpstream } from './mcp-upstream.js';

// What an mcp route does not decide passes through as it came, and what it
// cannot read is refused before the upstream, with no state change.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(
  mode: { stateful: boolean; json: boolean },
  routes?: (upstream: string) => Record<string, unknown>[],
  options: Parameters<typeof startMcpGateway>[1] = {},
) {
  const up = await startMcpUpstream(mode);
  cleanups.push(() => up.close());
  const gw = await startMcpGateway(routes ? routes(up.url) : [mcpRoute(up.url)], options);
  cleanups.push(() => gw.close());
  return { up, gw, url: `${gw.url}/mcp` };
}

async function client(url: string, headers?: Record<string, string>) {
  const c = await connectClient(url, { headers });
  cleanups.push(() => c.close());
  return c.client;
}

const INIT = JSON.stringify({
  jsonrpc: '2.0',
  id: 'init-1',
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '0' } },
});

describe('pass-through', () => {
  it.each([
    { stateful: true, json: true },
    { stateful: true, json: false },
  ])('initialize, notifications and tools/list reach the server and come back byte for byte, and nothing is stored (json=$json)', async (mode) => {
    const { up, gw, url } = await setup(mode);
    const before = snapshot(gw.sqlite);
    const init = await rawPost(url, INIT);
    const initText = await init.text();
    const sid = init.headers.get('mcp-session-id');
    expect(sid).toBeTruthy();
    const headers = { 'mcp-session-id': sid!, 'mcp-protocol-version': '2025-06-18' };
    const notified = await rawPost(url, '{"jsonrpc":"2.0","method":"notifications/initialized"}', headers);
    expect(notified.status).toBe(202);
    const list = await rawPost(url, ' {"jsonrpc":"2.0","id":7,"method":"tools/list"}', headers);
    const listText = await list.text();
    expect(up.requests.map((r) => r.body)).toEqual([
      INIT,
      '{"jsonrpc":"2.0","method":"notifications/initialized"}',
      ' {"jsonrpc":"2.0","id":7,"method":"tools/list"}',
    ]);
    expect(initText).toBe(up.requests[0]!.response());
    expect(listText).toBe(up.requests[2]!.response());
    expect(listText).toContain('search_tickets');
    expect(init.headers.get('content-type')).toContain(mode.json ? 'application/json' : 'text/event-stream');
    expect(up.requests[1]!.headers['mcp-session-id']).toBe(sid);
    expect(up.requests[1]!.headers['mcp-protocol-version']).toBe('2025-06-18');
    expect(snapshot(gw.sqlite)).toBe(before);
    // GET (the server's stream) and DELETE (the session's end) pass too.
    const del = await fetch(url, { method: 'DELETE', headers });
    expect(del.status).toBe(up.requests.at(-1)!.status());
    expect(up.requests.at(-1)!.method).toBe('DELETE');
  });

  it('a read-only tool (readOnlyHint) passes without fence or key once tools/list was seen; before, and against config, it is decided', async () => {
    const { up, url } = await setup({ stateful: true, json: false }, (u) => [
      mcpRoute(u),
      mcpRoute(u, { name: 'strict', match: { path: '/strict' }, tools: { search_tickets: { readOnly: false }, create_ticket: { readOnly: true } } }),
    ]);
    const agent = await client(url);
    // Never listed: side-effecting by default.
    await expect(agent.callTool({ name: 'search_tickets', arguments: { q: 'x' } })).rejects.toThrow(/missing-fence/);
    await agent.listTools();
    expect(JSON.parse(textOf(await agent.callTool({ name: 'search_tickets', arguments: { q: 'x' } })))).toEqual([]);
    // Still decided: create_ticket is not read-only.
    await expect(agent.callTool({ name: 'create_ticket', arguments: { title: 'x' } })).rejects.toThrow(/missing-fence/);
    expect(up.tickets).toHaveLength(0);
    // Config wins over the hint, both ways.
    const strict = await client(url.replace('/mcp', '/strict'));
    await strict.listTools();
    await expect(strict.callTool({ name: 'search_tickets', arguments: { q: 'x' } })).rejects.toThrow(/missing-fence/);
    await strict.callTool({ name: 'create_ticket', arguments: { title: 'unfenced' } });
    expect(up.tickets).toHaveLength(1);
  });

  it('progress notifications reach the agent while the tool still runs; read whole (no streaming forwarder) they do not', async () => {
    for (const streaming of [true, false]) {
      const undici = createUndiciForwarder();
      const forwarder = streaming ? undici : { forward: undici.forward, close: undici.close };
      const { up, url } = await setup({ stateful: true, json: false }, undefined, { forwarder });
      let open!: () => void;
      up.gate = new Promise<void>((r) => (open = r));
      const agent = await client(url);
      const progress: number[] = [];
      let first!: () => void;
      const firstSeen = new Promise<void>((r) => (first = r));
      const call = agent.callTool({ name: 'slow_report', arguments: { steps: 3 }, _meta: fenced(1, 'job', `report-${streaming}`) }, undefined, {
        onprogress: (p) => {
          progress.push(p.progress);
          first();
        },
      });
      // The tool waits for the gate after its first notification: only a streamed one can open it.
      const seen = await Promise.race([firstSeen.then(() => true), new Promise((r) => setTimeout(() => r(false), streaming ? 10_000 : 1_000))]);
      expect(seen).toBe(streaming);
      open();
      expect(textOf(await call)).toBe('report of 3 steps');
      expect(progress).toEqual([1, 2, 3]);
    }
  });

  it('metrics count tools/call per tool', async () => {
    const { gw, url } = await setup({ stateful: false, json: true });
    const agent = await client(url);
    await agent.listTools();
    await agent.callTool({ name: 'create_ticket', arguments: { title: 'm' }, _meta: fenced(1, 'job', 'm1') });
    await agent.callTool({ name: 'create_ticket', arguments: { title: 'm' }, _meta: fenced(1, 'job', 'm1') });
    await expect(agent.callTool({ name: 'no_such_tool', arguments: {} })).rejects.toThrow(/missing-fence/);
    const text = await (await fetch(`${gw.url}/_fencegate/metrics`)).text();
    expect(text).toContain('fencegate_mcp_tool_calls_total{route="tickets",tool="create_ticket",outcome="accepted"} 1');
    expect(text).toContain('fencegate_mcp_tool_calls_total{route="tickets",tool="create_ticket",outcome="replayed"} 1');
    expect(text).toContain('fencegate_mcp_tool_calls_total{route="tickets",tool="_unlisted",outcome="invalid"} 1');
  });
});

describe('refused before the upstream', () => {
  it('a batch holding tools/call is refused; a batch without one passes', async () => {
    const { up, gw, url } = await setup({ stateful: false, json: true });
    const before = snapshot(gw.sqlite);
    const batch = JSON.stringify([
      { jsonrpc: '2.0', id: 1, method: 'tools/list' },
      { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'create_ticket', arguments: { title: 'b' }, _meta: fenced(1, 'job', 'b1') } },
    ]);
    const res = await rawPost(url, batch);
    expect(res.status).toBe(200);
    expect(res.headers.get('x-fencegate-refusal')).toBe('invalid-request');
    const body = (await res.json()) as any;
    expect(body).toMatchObject({ jsonrpc: '2.0', id: null, error: { code: -32007, data: { type: 'invalid-request', status: 400 } } });
    expect(body.error.message).toMatch(/^invalid-request: a JSON-RPC batch/);
    expect(up.requests).toHaveLength(0);
    expect(snapshot(gw.sqlite)).toBe(before);
    // The control: the same batch without the call reaches the server.
    await rawPost(url, JSON.stringify([{ jsonrpc: '2.0', id: 1, method: 'ping' }]));
    expect(up.requests).toHaveLength(1);
  });

  it.each([
    ['not JSON', '{"jsonrpc":"2.0",'],
    ['a name that is not a string', JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 5, _meta: fenced(1, 'job', 'x') } })],
    [
      'arguments that are not an object',
      JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'create_ticket', arguments: ['t'], _meta: fenced(1, 'job', 'x') } }),
    ],
    [
      'a tools/call without an id',
      JSON.stringify({ jsonrpc: '2.0', method: 'tools/call', params: { name: 'create_ticket', arguments: { title: 't' }, _meta: fenced(1, 'job', 'x') } }),
    ],
    [
      'a repeated method (a parser keeping the first reads tools/call)',
      '{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"ping","params":{"name":"create_ticket","arguments":{"title":"t"}}}',
    ],
    [
      'a repeated member on the entity path',
      `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_ticket","arguments":{"title":"a","title":"b"},"_meta":${JSON.stringify(fenced(1, 'job', 'x'))}}}`,
    ],
    [
      'the key in _meta and params.idempotencyKey differ',
      JSON.stringify({
        jsonrpc: '2.0',
        id: 1,
        method: 'tools/call',
        params: { name: 'create_ticket', arguments: { title: 't' }, idempotencyKey: 'other', _meta: fenced(1, 'job', 'x') },
      }),
    ],
  ])('%s: a -32007 JSON-RPC error, never forwarded, no state change', async (_what, body) => {
    const { up, gw, url } = await setup({ stateful: false, json: true }, (u) => [
      mcpRoute(u, { tools: { create_ticket: { entity: { json: '/arguments/title' } } } }),
    ]);
    const before = snapshot(gw.sqlite);
    const res = await rawPost(url, body);
    expect(res.status).toBe(200);
    const answer = (await res.json()) as any;
    expect(answer.error.code).toBe(-32007);
    expect(['invalid-request', 'invalid-entity', 'invalid-idempotency-key']).toContain(answer.error.data.type);
    expect(up.requests).toHaveLength(0);
    expect(snapshot(gw.sqlite)).toBe(before);
  });

  it('a tool result with isError: true ran: stored and replayed, not run again', async () => {
    const { up, url } = await setup({ stateful: true, json: false });
    const agent = await client(url);
    const call = { name: 'failing_tool', arguments: { n: 1 }, _meta: fenced(1, 'job', 'fail-1') };
    const a = await agent.callTool(call);
    const b = await agent.callTool(call);
    expect(a.isError).toBe(true);
    expect(b).toEqual(a);
    expect(up.failures).toBe(1);
  });

  it('an upstream that refuses the connection: upstream-unavailable, the key released', async () => {
    const port = await freePort();
    const gw = await startMcpGateway([mcpRoute(`http://127.0.0.1:${port}`)]);
    cleanups.push(() => gw.close());
    const res = await rawPost(
      `${gw.url}/mcp`,
      JSON.stringify({
        jsonrpc: '2.0',
        id: 'c1',
        method: 'tools/call',
        params: { name: 'create_ticket', arguments: { title: 't' }, _meta: fenced(1, 'job', 'down-1') },
      }),
    );
    const body = (await res.json()) as any;
    expect(body).toMatchObject({ id: 'c1', error: { code: -32008, data: { type: 'upstream-unavailable', status: 502 } } });
    expect(gw.sqlite.db.prepare("SELECT count(*) AS n FROM idempotency_records WHERE key = 'down-1'").get()).toEqual({ n: 0 });
  });
});
