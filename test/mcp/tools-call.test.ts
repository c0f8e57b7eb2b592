import { afterEach, describe, expect, it } from 'vitest';
import { connectClient, fenced, mcpRoute, rawPost, startCutProxy, startMcpGateway, textOf, type McpGateway } from './harness.js';
import { startMcpUpstream, type McpUpstream } from './mcp-upstream.js';
import { until } from '../helpers/gateway.js';

// tools/call through an mcp route, with the real SDK on both sides: the
// SDK's McpServer (stateful and stateless, JSON and SSE answers) as the
// upstream on loopback, the SDK's Client as the agent. Every safety check
// runs again through a route with the check off, where the duplicate or
// stale call executes: the test can fail.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(
  mode: { stateful: boolean; json: boolean },
  routeOverrides: Record<string, unknown> = {},
): Promise<{ up: McpUpstream; gw: McpGateway; url: string; offUrl: string }> {
  const up = await startMcpUpstream(mode);
  cleanups.push(() => up.close());
  const gw = await startMcpGateway([
    mcpRoute(up.url, routeOverrides),
    // The negative control: the same upstream with no fence and no key.
    mcpRoute(up.url, { name: 'unchecked', match: { path: '/unchecked' }, fence: 'off', idempotency: 'off', mode: 'concurrent' }),
  ]);
  cleanups.push(() => gw.close());
  return { up, gw, url: `${gw.url}/mcp`, offUrl: `${gw.url}/unchecked` };
}

async function client(url: string, headers?: Record<string, string>) {
  const c = await connectClient(url, { headers });
  cleanups.push(() => c.close());
  return c.client;
}

const MODES = [
  { stateful: true, json: true },
  { stateful: true, json: false },
  { stateful: false, json: true },
  { stateful: false, json: false },
];

describe.each(MODES)('stateful=$stateful json=$json', (mode) => {
  it('a retry after the connection was cut once the tool ran gets the same ticket; without a key it makes a second one', async () => {
    const { up, gw, offUrl } = await setup(mode);
    for (const [url, key, tickets] of [
      [`${gw.url}/mcp`, 'job-1:create', 1],
      [offUrl, 'job-2:create', 3],
    ] as const) {
      const cut = await startCutProxy(gw.url);
      cleanups.push(() => cut.close());
      const path = new URL(url).pathname;
      const agent = await client(`${cut.url}${path}`, { prefer: 'wait=5' });
      // The network fails after the server ran the tool, before its answer reaches the agent.
      up.onRan = () => cut.cutAll();
      const call = { name: 'create_ticket', arguments: { title: 'printer on fire' }, _meta: fenced(1, 'job', key) };
      await expect(agent.callTool(call)).rejects.toThrow();
      up.onRan = null;
      const retried = await agent.callTool(call);
      expect(JSON.parse(textOf(retried)).id).toBe(`T-${up.tickets.length}`);
      expect(up.tickets).toHaveLength(tickets);
    }
    // The decision lines name the tool: forwarded once, then the replay.
    expect(
      gw
        .decisions()
        .filter((d) => d.tool === 'create_ticket')
        .map((d) => d.decision),
    ).toEqual(['forwarded', 'replayed']);
  });

  it('the same key with other arguments is refused as idempotency-key-reused, and no ticket is made; unchecked, a second ticket is', async () => {
    const { up, url, offUrl } = await setup(mode);
    const agent = await client(url);
    await agent.callTool({ name: 'create_ticket', arguments: { title: 'a' }, _meta: fenced(1, 'job', 'k1') });
    await expect(agent.callTool({ name: 'create_ticket', arguments: { title: 'b' }, _meta: fenced(1, 'job', 'k1') })).rejects.toThrow(/idempotency-key-reused/);
    expect(up.tickets.map((t) => t.title)).toEqual(['a']);
    const unchecked = await client(offUrl);
    await unchecked.callTool({ name: 'create_ticket', arguments: { title: 'a' }, _meta: fenced(1, 'job', 'k2') });
    await unchecked.callTool({ name: 'create_ticket', arguments: { title: 'b' }, _meta: fenced(1, 'job', 'k2') });
    expect(up.tickets.map((t) => t.title)).toEqual(['a', 'a', 'b']);
  });

  it('a stale fence is refused as stale-fence and never reaches the server; unchecked, the stale call runs', async () => {
    const { up, url, offUrl } = await setup(mode);
    const agent = await client(url);
    await agent.callTool({ name: 'create_ticket', arguments: { title: 'new owner' }, _meta: fenced(5, 'job-9', 'new-1') });
    const stale = agent.callTool({ name: 'create_ticket', arguments: { title: 'old owner' }, _meta: fenced(3, 'job-9', 'old-1') });
    await expect(stale).rejects.toThrow(/stale-fence/);
    await expect(stale).rejects.toMatchObject({
      code: -32001,
      data: { type: 'stale-fence', status: 409, entity: 'job-9', presented_fence: '3', current_fence: '5' },
    });
    expect(up.callsOf('create_ticket')).toHaveLength(1);
    const unchecked = await client(offUrl);
    await unchecked.callTool({ name: 'create_ticket', arguments: { title: 'old owner' }, _meta: fenced(3, 'job-9', 'old-1') });
    expect(up.tickets.map((t) => t.title)).toEqual(['new owner', 'old owner']);
  });

  it('a retry on a new session gets the stored result; unchecked, it makes another ticket', async () => {
    const { up, url, offUrl } = await setup(mode);
    for (const [u, tickets] of [
      [url, 1],
      [offUrl, 3],
    ] as const) {
      const first = await connectClient(u);
      const a = await first.client.callTool({ name: 'create_ticket', arguments: { title: 'x' }, _meta: fenced(1, 'job', `s-${u}`) });
      await first.close();
      const second = await client(u);
      const b = await second.callTool({ name: 'create_ticket', arguments: { title: 'x' }, _meta: fenced(1, 'job', `s-${u}`) });
      expect(up.tickets).toHaveLength(tickets);
      if (u === url) expect(textOf(b)).toBe(textOf(a));
      else expect(textOf(b)).not.toBe(textOf(a));
    }
  });
});

describe.each(MODES)('timeouts, stateful=$stateful json=$json', (mode) => {
  it('a call that outlives its timeout is outcome unknown: upstream-timeout, then outcome-unknown for the retry, not a second run', async () => {
    const { up, gw, url } = await setup(mode, { tools: { slow_report: { timeoutMs: 300 } } });
    up.gate = new Promise(() => {});
    const agent = await client(url);
    const call = { name: 'slow_report', arguments: { steps: 2 }, _meta: fenced(1, 'job', 'slow-1') };
    await expect(agent.callTool(call, undefined, { onprogress: () => {} })).rejects.toMatchObject({ code: -32009, data: { type: 'upstream-timeout' } });
    await expect(agent.callTool(call)).rejects.toMatchObject({ code: -32005, data: { type: 'outcome-unknown' } });
    expect(up.callsOf('slow_report')).toHaveLength(1);
    expect(gw.sqlite.db.prepare("SELECT state FROM idempotency_records WHERE key = 'slow-1'").get()).toEqual({ state: 'outcome_unknown' });
  });
});

describe('the wire', () => {
  it("fence and key from HTTP headers, the entity from a pointer into the arguments; the replay is application/json under the retry's id", async () => {
    const { up, url } = await setup({ stateful: false, json: false }, { tools: { create_ticket: { entity: { json: '/arguments/title' } } } });
    const headers = { 'x-execution-fence': '2', 'idempotency-key': 'hdr-1' };
    const call = (id: number, title = 'inv-7') =>
      rawPost(url, JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'create_ticket', arguments: { title } } }), headers);
    const first = await call(1);
    expect(first.headers.get('content-type')).toBe('text/event-stream');
    const firstBody = await first.text();
    const replay = await call(2);
    expect(replay.headers.get('content-type')).toBe('application/json');
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    const replayed = (await replay.json()) as any;
    expect(replayed.id).toBe(2);
    expect(firstBody).toContain(JSON.stringify(replayed.result));
    expect(up.tickets).toHaveLength(1);
    expect(up.requests[0]!.headers['x-fence-entity']).toBe('inv-7');
    // The entity is the pointer's: fence 1 for inv-7 is now stale, for inv-8 it is not.
    const staleFor = (title: string) =>
      rawPost(url, JSON.stringify({ jsonrpc: '2.0', id: 3, method: 'tools/call', params: { name: 'create_ticket', arguments: { title } } }), {
        'x-execution-fence': '1',
        'idempotency-key': `hdr-${title}`,
      });
    expect(((await (await staleFor('inv-7')).json()) as any).error.data.type).toBe('stale-fence');
    expect(await (await staleFor('inv-8')).text()).toContain('"result"');
    expect(up.tickets).toHaveLength(2);
  });
});

describe('concurrency', () => {
  it('serial mode: a second call for an entity in flight waits, then entity-busy, never at the server at once; concurrent, both run together', async () => {
    const { up, url, offUrl } = await setup({ stateful: false, json: false }, { serialWaitMs: 200 });
    let open!: () => void;
    up.gate = new Promise<void>((r) => (open = r));
    const agent = await client(url);
    const first = agent.callTool({ name: 'slow_report', arguments: { steps: 2 }, _meta: fenced(1, 'job-s', 'serial-1') }, undefined, { onprogress: () => {} });
    await until(() => up.callsOf('slow_report').length === 1, 'the first call at the server');
    await expect(agent.callTool({ name: 'slow_report', arguments: { steps: 1 }, _meta: fenced(1, 'job-s', 'serial-2') })).rejects.toMatchObject({
      code: -32006,
      data: { type: 'entity-busy' },
    });
    expect(up.callsOf('slow_report')).toHaveLength(1);
    const unchecked = await client(offUrl);
    const second = unchecked.callTool({ name: 'slow_report', arguments: { steps: 1 }, _meta: fenced(1, 'job-s', 'serial-3') });
    await until(() => up.callsOf('slow_report').length === 2, 'both calls at the server');
    open();
    await Promise.all([first, second]);
  });

  it('50 concurrent identical calls run the tool once, all get its result; unchecked, 50 tickets', async () => {
    const { up, url, offUrl } = await setup({ stateful: true, json: false });
    const agent = await client(url, { prefer: 'wait=10' });
    const call = { name: 'create_ticket', arguments: { title: 'dup' }, _meta: fenced(1, 'job', 'same') };
    const results = await Promise.all(Array.from({ length: 50 }, () => agent.callTool(call)));
    expect(up.tickets).toHaveLength(1);
    expect(new Set(results.map(textOf))).toEqual(new Set([JSON.stringify({ id: 'T-1', title: 'dup' })]));
    const unchecked = await client(offUrl);
    await Promise.all(Array.from({ length: 50 }, () => unchecked.callTool(call)));
    expect(up.tickets).toHaveLength(51);
  });
});
