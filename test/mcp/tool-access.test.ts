import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { createFetchForwarder } from '../../src/http/forward-fetch.js';
import { createUndiciForwarder } from '../../src/http/forward-undici.js';
import { createGateway } from '../../src/http/gateway.js';
import { silentLogger } from '../../src/http/logger.js';
import { SqliteGatewayStore } from '../../src/store/sqlite/gateway-store.js';
import { compileToolAccess, filterToolsList, foldToolName } from '../../src/http/mcp/access.js';
import { connectClient, fenced, mcpRoute, rawPost, startMcpGateway, textOf, type McpGateway } from './harness.js';
import { startMcpUpstream, type McpUpstream } from './mcp-upstream.js';
import { rawUpstream } from './raw-upstream.js';

// An mcp route's `toolAccess` (docs/mcp.md "Allowed tools"), with the real
// SDK on both sides: the agent is shown only the allowed tools, a denied
// call is refused and never reaches the server, an allowed one runs. The
// negative control is the same upstream behind a route without the lists
// (`/open`), where every tool is listed and the denied one runs.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** Allowed: create_ticket, search_tickets, slow_report. failing_tool matches an allow pattern but is denied (deny wins). */
const ACCESS = { allow: ['create_ticket', 'search_*', 'slow_report', 'failing_*'], deny: ['failing_*'] };
const ALL = ['create_ticket', 'failing_tool', 'search_tickets', 'slow_report'];
const ALLOWED = ['create_ticket', 'search_tickets', 'slow_report'];

async function setup(
  mode: { stateful: boolean; json: boolean },
  options: Parameters<typeof startMcpGateway>[1] = {},
): Promise<{ up: McpUpstream; gw: McpGateway }> {
  const up = await startMcpUpstream(mode);
  cleanups.push(() => up.close());
  const gw = await startMcpGateway([mcpRoute(up.url, { toolAccess: ACCESS }), mcpRoute(up.url, { name: 'open', match: { path: '/open' } })], options);
  cleanups.push(() => gw.close());
  return { up, gw };
}

async function agent(url: string) {
  const c = await connectClient(url);
  cleanups.push(() => c.close());
  return c.client;
}

const names = (list: { tools: { name: string }[] }) => list.tools.map((t) => t.name).sort();

const MODES = [
  { stateful: true, json: true },
  { stateful: true, json: false },
  { stateful: false, json: true },
  { stateful: false, json: false },
];

describe.each(MODES)('stateful=$stateful json=$json', (mode) => {
  it('listTools shows only the allowed tools; a denied callTool is refused and never runs; an allowed one runs; without the lists everything is listed and callable', async () => {
    const { up, gw } = await setup(mode);
    const guarded = await agent(`${gw.url}/mcp`);
    expect(names(await guarded.listTools())).toEqual(ALLOWED);
    // With a fence and a key: without the check the call would be admitted and run.
    await expect(guarded.callTool({ name: 'failing_tool', arguments: { n: 1 }, _meta: fenced(1, 'job-d', 'k-d') })).rejects.toMatchObject({
      code: -32013,
      data: { type: 'tool-denied', status: 403 },
    });
    expect(up.callsOf('failing_tool')).toHaveLength(0);
    expect(up.failures).toBe(0);
    const made = await guarded.callTool({ name: 'create_ticket', arguments: { title: 'allowed' }, _meta: fenced(1, 'job', 'k-1') });
    expect(JSON.parse(textOf(made)).id).toBe('T-1');
    // A read-only tool that is allowed passes as before.
    await guarded.callTool({ name: 'search_tickets', arguments: { q: 'allowed' } });

    // The negative control: no lists, every tool listed, the same call runs.
    const open = await agent(`${gw.url}/open`);
    expect(names(await open.listTools())).toEqual(ALL);
    const ran = await open.callTool({ name: 'failing_tool', arguments: { n: 1 }, _meta: fenced(1, 'job-o', 'k-o') });
    expect(ran.isError).toBe(true);
    expect(up.failures).toBe(1);

    // Logged with its tool, counted, in the decision line.
    const rows = await gw.sqlite.listRejections({ reason: 'tool-denied', limit: 10 });
    expect(rows.items.map((r) => r.tool)).toEqual(['failing_tool']);
    expect(rows.items[0]!.detail).toContain('denied by "failing_*"');
    expect(gw.decisions().filter((d) => d.decision === 'tool-denied')).toEqual([expect.objectContaining({ tool: 'failing_tool' })]);
    const metrics = await (await fetch(`${gw.url}/_fencegate/metrics`)).text();
    expect(metrics).toContain('fencegate_rejections_total{route="tickets",reason="tool-denied"} 1');
    expect(metrics).toContain('fencegate_rejections_total{route="open",reason="tool-denied"} 0');
  });
});

it('read whole (a forwarder that cannot stream), an event-stream tools/list answer is filtered too', async () => {
  const undici = createUndiciForwarder();
  const { gw } = await setup({ stateful: false, json: false }, { forwarder: { forward: undici.forward, close: undici.close } });
  expect(names(await (await agent(`${gw.url}/mcp`)).listTools())).toEqual(ALLOWED);
  expect(names(await (await agent(`${gw.url}/open`)).listTools())).toEqual(ALL);
});

it('through the Hono app (app.fetch, the fetch forwarder, as on Workers): the same list and the same refusal', async () => {
  const up = await startMcpUpstream({ stateful: true, json: false });
  cleanups.push(() => up.close());
  const config = parseConfig({ store: { sqlite: ':memory:' }, routes: [mcpRoute(up.url, { toolAccess: ACCESS })] });
  const gateway = createGateway({
    config,
    store: new SqliteGatewayStore({ path: ':memory:' }),
    forwarder: createFetchForwarder(),
    env: {},
    logger: silentLogger,
  });
  cleanups.push(() => gateway.close());
  const viaApp = ((input: string | URL | Request, init?: RequestInit) => Promise.resolve(gateway.app.fetch(new Request(input, init)))) as typeof fetch;
  const c = await connectClient('http://gateway.test/mcp', { fetch: viaApp });
  cleanups.push(() => c.close());
  expect(names(await c.client.listTools())).toEqual(ALLOWED);
  await expect(c.client.callTool({ name: 'failing_tool', arguments: { n: 1 } })).rejects.toMatchObject({ code: -32013 });
  expect(up.failures).toBe(0);
});

describe('an event stream, event by event', () => {
  const LIST = '{"jsonrpc":"2.0","id":7,"method":"tools/list"}';
  const progress = 'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}\n\n';
  // The response over two data lines, with an event id (for resumption) and a comment.
  const listEvent =
    'id: ev-1\r\n: a comment\r\nevent: message\r\ndata: {"jsonrpc":"2.0","id":7,\r\ndata: "result":{"tools":[{"name":"a"},{"name":"failing_x"},{"name":"b"}]}}\r\n\r\n';

  async function streaming(events: string, maxResponseBytes?: number) {
    const up = await rawUpstream(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      // In small pieces: events are cut across chunks.
      for (let i = 0; i < events.length; i += 7) {
        res.write(events.slice(i, i + 7));
        await new Promise((r) => setImmediate(r));
      }
      res.end();
    });
    cleanups.push(() => up.close());
    const gw = await startMcpGateway([
      mcpRoute(up.url, { toolAccess: { deny: ['failing_*'] }, ...(maxResponseBytes ? { maxResponseBytes } : {}) }),
      mcpRoute(up.url, { name: 'open', match: { path: '/open' } }),
    ]);
    cleanups.push(() => gw.close());
    return gw;
  }

  it('other events pass byte for byte; the list event loses the denied tool and keeps its id; without the lists it passes as it came', async () => {
    const gw = await streaming(progress + listEvent);
    const text = await (await rawPost(`${gw.url}/mcp`, LIST)).text();
    expect(text).toBe(
      `${progress}id: ev-1\n: a comment\nevent: message\ndata: {"jsonrpc":"2.0","id":7,\ndata: "result":{"tools":[{"name":"a"},{"name":"b"}]}}\n\n`,
    );
    expect(await (await rawPost(`${gw.url}/open`, LIST)).text()).toBe(progress + listEvent);
  });

  it("a list response under another id, or replayed on the server's GET stream (resumption), is narrowed too; other messages pass as they came", async () => {
    const replayed = 'id: ev-9\nevent: message\ndata: {"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"a"},{"name":"failing_x"}]}}\n\n';
    const other = 'event: message\ndata: {"jsonrpc":"2.0","id":4,"result":{"content":[{"type":"text","text":"failing_x"}]}}\n\n';
    const gw = await streaming(progress + replayed + other);
    const narrowed = `${progress}id: ev-9\nevent: message\ndata: {"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"a"}]}}\n\n${other}`;
    const get = await fetch(`${gw.url}/mcp`, { headers: { accept: 'text/event-stream' } });
    expect(await get.text()).toBe(narrowed);
    expect(await (await rawPost(`${gw.url}/mcp`, LIST)).text()).toBe(narrowed);
    // The negative control.
    expect(await (await fetch(`${gw.url}/open`, { headers: { accept: 'text/event-stream' } })).text()).toBe(progress + replayed + other);
  });

  it('an event over maxResponseBytes ends the stream with an error to the list, never the list unfiltered', async () => {
    const big = `event: message\ndata: {"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"failing_x","description":"${'d'.repeat(4096)}"}]}}\n\n`;
    const gw = await streaming(progress + big, 2048);
    const text = await (await rawPost(`${gw.url}/mcp`, LIST)).text();
    expect(text.startsWith(progress)).toBe(true);
    expect(text).not.toContain('failing_x');
    expect(text).toContain('"code":-32010');
  });
});

describe("the answer stays the upstream's, but for the denied tools", () => {
  const LIST = '{"jsonrpc":"2.0","id":7,"method":"tools/list"}';
  it.each([false, true])(
    'json=%s: the filtered text is the upstream text with the denied element cut; with nothing denied it is byte for byte',
    async (json) => {
      const { up, gw } = await setup({ stateful: false, json });
      const guarded = await (await rawPost(`${gw.url}/mcp`, LIST)).text();
      const original = up.requests.at(-1)!.response();
      const open = await (await rawPost(`${gw.url}/open`, LIST)).text();
      expect(open).toBe(up.requests.at(-1)!.response());
      expect(guarded).not.toBe(original);
      const dataOf = (t: string) => (json ? t : /^data: (.*)$/m.exec(t)![1]!);
      const upstreamMsg = JSON.parse(dataOf(original)) as { result: { tools: { name: string }[] } };
      const msg = JSON.parse(dataOf(guarded)) as { result: { tools: { name: string }[] } };
      expect(msg).toEqual({ ...upstreamMsg, result: { ...upstreamMsg.result, tools: upstreamMsg.result.tools.filter((t) => t.name !== 'failing_tool') } });
      // Every kept tool's text is in the answer exactly as the upstream wrote it.
      for (const t of upstreamMsg.result.tools.filter((x) => x.name !== 'failing_tool')) expect(guarded).toContain(JSON.stringify(t));
      if (!json) expect(guarded.startsWith('event: message\n')).toBe(true);
    },
  );
});

describe('another case or spelling of a denied tool', () => {
  it('is refused (deny compared folded; allow exact), never forwarded; on the open route the exact name runs', async () => {
    const { up, gw } = await setup({ stateful: false, json: true });
    const call = (name: string, id = 1) =>
      JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: { n: 1 }, _meta: fenced(1, 'job-r', `k-${id}`) } });
    for (const name of ['Failing_Tool', 'FAILING_TOOL', 'failing_tool\u200b', ' failing_tool', 'ｆａｉｌｉｎｇ_tool', 'failinG_tooL']) {
      const res = await rawPost(`${gw.url}/mcp`, call(name));
      const body = (await res.json()) as { error?: { code: number; data: { type: string } } };
      expect(body.error, name).toMatchObject({ code: -32013, data: { type: 'tool-denied' } });
    }
    // A variant of an allowed name is not allowed: allow is matched as written.
    const variant = (await (await rawPost(`${gw.url}/mcp`, call('Create_Ticket'))).json()) as { error: { data: { detail: string } } };
    expect(variant.error.data.detail).toContain('not in the allow list');
    expect(up.requests.filter((r) => r.body.includes('tools/call'))).toHaveLength(0);
    // Negative control.
    const ran = (await (await rawPost(`${gw.url}/open`, call('failing_tool'))).json()) as { result?: { isError: boolean } };
    expect(ran.result?.isError).toBe(true);
  });

  it('a tools/list the route could not filter (in a batch, another spelling, no usable id) is refused; on the open route it passes', async () => {
    const { up, gw } = await setup({ stateful: false, json: true });
    const bodies = [
      '[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]',
      '{"jsonrpc":"2.0","id":1,"method":"Tools/List"}',
      '{"jsonrpc":"2.0","id":1,"method":"tools/list "}',
      '{"jsonrpc":"2.0","id":null,"method":"tools/list"}',
      '{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}',
    ];
    for (const b of bodies) {
      const res = await rawPost(`${gw.url}/mcp`, b);
      expect(res.headers.get('x-fencegate-refusal'), b).toBe('invalid-request');
    }
    expect(up.requests).toHaveLength(0);
    await rawPost(`${gw.url}/open`, bodies[0]!);
    expect(up.requests).toHaveLength(1);
  });
});

describe('units', () => {
  const access = (a: { allow?: string[]; deny?: string[] }) =>
    compileToolAccess(
      parseConfig({ routes: [{ name: 'm', protocol: 'mcp', match: { path: '/mcp' }, upstream: 'http://127.0.0.1:1', toolAccess: a }] }).routes[0]!,
    )!;

  it('globs match the whole name; deny wins; no lists is no access check', () => {
    const a = access({ allow: ['get_*', 'list'], deny: ['*_secret', 'get_*_admin*'] });
    expect(a.denial('get_user')).toBeNull();
    expect(a.denial('list')).toBeNull();
    expect(a.denial('listing')).toBe('not in the allow list');
    expect(a.denial('xget_user')).toBe('not in the allow list');
    expect(a.denial('get_secret')).toContain('denied by "*_secret"');
    expect(a.denial('get_x_admin_y')).toContain('denied by "get_*_admin*"');
    expect(a.denial('GET_SECRET')).toContain('denied by "*_secret"');
    expect(access({ deny: ['*'] }).denial('anything')).not.toBeNull();
    expect(access({ deny: ['x'] }).denial('y')).toBeNull();
    expect(
      compileToolAccess(parseConfig({ routes: [{ name: 'm', protocol: 'mcp', match: { path: '/mcp' }, upstream: 'http://127.0.0.1:1' }] }).routes[0]!),
    ).toBeNull();
    // A fullwidth asterisk in a pattern is literal after folding, not a wildcard.
    expect(access({ deny: ['a＊'] }).denial('abc')).toBeNull();
    expect(foldToolName('ｄｅｌｅｔｅ_\u200bUser ')).toBe('DELETE_USER');
  });

  it('filterToolsList keeps the text around the removed elements, and refuses what it cannot read', () => {
    const a = access({ deny: ['b'] });
    const text = '{"jsonrpc":"2.0","id":1,"result":{"tools":[ {"name":"a", "x":1.0} , {"name":"b"},{"name":"c","n":9007199254740993}],"nextCursor":"z"}}';
    expect(filterToolsList(text, a)).toBe(
      '{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a", "x":1.0},{"name":"c","n":9007199254740993}],"nextCursor":"z"}}',
    );
    const none = '{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a"}]}}';
    expect(filterToolsList(none, a)).toBe(none);
    expect(filterToolsList('{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"x"}}', a)).not.toBeNull();
    expect(filterToolsList('not json', a)).toBeNull();
    expect(filterToolsList('{"jsonrpc":"2.0","id":1,"result":{"tools":{"0":{"name":"b"}}}}', a)).toBeNull();
    // A tool without a readable name is not shown.
    expect(JSON.parse(filterToolsList('{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a"},{"title":"?"}]}}', a)!).result.tools).toEqual([{ name: 'a' }]);
  });

  it('the config refuses lists on a plain route and an empty toolAccess', () => {
    expect(() => parseConfig({ routes: [{ name: 'p', match: { path: '/p' }, upstream: 'http://127.0.0.1:1', toolAccess: { deny: ['x'] } }] })).toThrow(
      /toolAccess/,
    );
    expect(() => parseConfig({ routes: [{ name: 'm', protocol: 'mcp', match: { path: '/mcp' }, upstream: 'http://127.0.0.1:1', toolAccess: {} }] })).toThrow(
      /toolAccess/,
    );
  });
});
