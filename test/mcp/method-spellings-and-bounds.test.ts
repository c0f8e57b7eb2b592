import { afterEach, describe, expect, it } from 'vitest';
import { readMessage } from '../../src/http/mcp/message.js';
import { ToolAnnotations } from '../../src/http/mcp/policy.js';
import { mcpRoute, rawPost, startMcpGateway } from '../mcp/harness.js';
import { rawUpstream, type RawUpstream } from '../mcp/raw-upstream.js';

// Method spellings, a folded `method` member, and the bounds of what is
// learnt per endpoint (docs/mcp.md "What is decided, what passes", "Read-only
// tools", "Limits"), against an upstream that decodes as Go's encoding/json
// does. Each group failed before its check existed: they are their own
// negative controls, and the controls below show the upstream does run what
// the gateway refuses.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** Go encoding/json v1 matching of a struct tag: exact first, else case-insensitive with ſ→s, K→k. */
const goFold = (s: string) =>
  s
    .replace(/\u017f/g, 's')
    .replace(/\u212a/g, 'k')
    .toLowerCase();
function goField(obj: Record<string, unknown>, tag: string): unknown {
  if (Object.hasOwn(obj, tag)) return obj[tag];
  const k = Object.keys(obj).find((key) => goFold(key) === goFold(tag));
  return k === undefined ? undefined : obj[k];
}

/** An MCP server that decodes like a Go server on encoding/json v1 (any server whose decoder matches member names as encoding/json v1 does). */
async function goLikeServer(): Promise<RawUpstream & { ran: string[] }> {
  const ran: string[] = [];
  const up = await rawUpstream((_req, res, body) => {
    const doc = JSON.parse(body) as unknown;
    const msgs = (Array.isArray(doc) ? doc : [doc]) as Record<string, unknown>[];
    const out = msgs.map((m) => {
      const method = goField(m, 'method');
      let result: unknown = {};
      if (method === 'tools/list') result = { tools: [{ name: 'pay', inputSchema: { type: 'object' } }] };
      if (method === 'tools/call') {
        ran.push(String(goField((goField(m, 'params') ?? {}) as Record<string, unknown>, 'name')));
        result = { content: [{ type: 'text', text: 'paid' }] };
      }
      return { jsonrpc: '2.0', id: goField(m, 'id'), result };
    });
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(Array.isArray(doc) ? out : out[0]));
  });
  cleanups.push(() => up.close());
  return Object.assign(up, { ran });
}

async function gateway(up: RawUpstream, match = '/mcp/*') {
  const gw = await startMcpGateway([mcpRoute(up.url, { match: { path: match } })]);
  cleanups.push(() => gw.close());
  return gw;
}

describe('the method member in another case (`Method`) is refused, alone and in a batch', () => {
  const bodies = [
    `{"jsonrpc":"2.0","id":1,"Method":"tools/call","params":{"name":"pay","arguments":{}}}`,
    `{"jsonrpc":"2.0","id":2,"METHOD":"tools/call","params":{"name":"pay","arguments":{}}}`,
    `[{"jsonrpc":"2.0","id":3,"Method":"tools/call","params":{"name":"pay","arguments":{}}}]`,
  ];

  it('a Go-decoding upstream would run `"Method":"tools/call"`: the gateway refuses it, nothing reaches the upstream', async () => {
    const up = await goLikeServer();
    const gw = await gateway(up);
    const types: unknown[] = [];
    for (const b of bodies) {
      const res = await rawPost(`${gw.url}/mcp/a`, b);
      types.push(res.headers.get('x-fencegate-refusal'));
      await res.text();
    }
    expect(up.ran).toEqual([]);
    expect(types).toEqual(['invalid-request', 'invalid-request', 'invalid-request']);
  });

  it('control: the exact `method` is decided (missing-fence), and the upstream does run the folded one sent to it directly', async () => {
    const up = await goLikeServer();
    const gw = await gateway(up);
    const exact = (await (await rawPost(`${gw.url}/mcp/a`, bodies[0]!.replace('"Method"', '"method"'))).json()) as { error: { data: { type: string } } };
    expect(exact.error.data.type).toBe('missing-fence');
    await (await rawPost(`${up.url}/mcp/a`, bodies[0]!)).text();
    expect(up.ran).toEqual(['pay']);
    expect(readMessage(new TextEncoder().encode(bodies[0]!)).kind).toBe('refused');
  });
});

describe('other spellings of tools/call (fullwidth, other separators, invisible marks) are refused too', () => {
  const notCaught = [
    'ｔｏｏｌｓ/ｃａｌｌ',
    'tools／call',
    'tools.call',
    'tools/call/',
    'tools//call',
    'tools/\u202ecall',
    'tools/\u2066call',
    'tools/\u034fcall',
    'tools/\u180ecall',
    'tools/c\ufe0fall',
  ];
  it('each is refused; tools/list and the exact tools/call are not', () => {
    for (const method of notCaught) {
      const body = new TextEncoder().encode(JSON.stringify({ jsonrpc: '2.0', id: 1, method, params: { name: 'pay', arguments: {} } }));
      expect(readMessage(body).kind, JSON.stringify(method)).toBe('refused');
    }
    const other = (method: string) =>
      readMessage(new TextEncoder().encode(JSON.stringify({ jsonrpc: '2.0', id: 1, method, params: { name: 'pay', arguments: {} } }))).kind;
    expect(other('tools/list')).toBe('pass');
    expect(other('tools/call')).toBe('call');
  });
});

describe('what holds', () => {
  it('JSON escapes in the method are the exact tools/call after parsing: decided', async () => {
    const up = await goLikeServer();
    const gw = await gateway(up);
    for (const m of ['"tools\\/call"', '"tools/\\u0063all"', '"\\u0074ools/call"']) {
      const res = (await (await rawPost(`${gw.url}/mcp/a`, `{"jsonrpc":"2.0","id":1,"method":${m},"params":{"name":"pay","arguments":{}}}`)).json()) as {
        error: { data: { type: string } };
      };
      expect(res.error.data.type).toBe('missing-fence');
    }
    expect(up.ran).toEqual([]);
  });

  it('duplicate method members (also folded, also escaped) are refused', () => {
    for (const b of [
      `{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call","params":{"name":"p"}}`,
      `{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call","params":{"name":"p"}}`,
      `{"jsonrpc":"2.0","id":1,"method":"ping","m\\u0065thod":"tools/call","params":{"name":"p"}}`,
      `[{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call"}]`,
    ])
      expect(readMessage(new TextEncoder().encode(b)).kind, b).toBe('refused');
  });

  it('the speed-up kept every refusal of a repeated member in arguments or _meta (any depth, folded)', () => {
    for (const inner of [
      `"arguments":{"a":1,"a":2}`,
      `"arguments":{"a":1,"A":2}`,
      `"arguments":{"x":{"k":1,"\u212a":2}}`,
      `"_meta":{"t":1,"t":2}`,
      `"arguments":{},"Arguments":{}`,
    ]) {
      const b = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"p",${inner}}}`;
      expect(readMessage(new TextEncoder().encode(b)).kind, b).toBe('refused');
    }
  });

  it('a call passes read-only only where the upstream gets exactly the path and query the list was learnt at', async () => {
    // Per path a different server: `x` is read-only only at exactly /mcp/a (no query).
    const ran: string[] = [];
    const up = await rawUpstream((req, res, body) => {
      const m = JSON.parse(body);
      let result: unknown = {};
      if (m.method === 'tools/list') result = { tools: [{ name: 'x', inputSchema: { type: 'object' }, annotations: { readOnlyHint: req.url === '/mcp/a' } }] };
      if (m.method === 'tools/call') ran.push(req.url ?? '');
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: m.id, result }));
    });
    cleanups.push(() => up.close());
    const gw = await gateway(up);
    await (await rawPost(`${gw.url}/mcp/a`, JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/list' }))).text();
    const call = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'x', arguments: {} } });
    const paths = [
      '/mcp/a',
      '/mcp/%61',
      '/mcp/./a',
      '/mcp/b/../a',
      '/mcp/a?',
      '/mcp/a?q=1',
      '/mcp/a/',
      '/mcp//a',
      '/MCP/a',
      '/mcp/a;p',
      '/mcp/a#frag',
      '/mcp/a%2F',
      '/mcp/A',
    ];
    const passed: string[] = [];
    for (const p of paths) {
      const before = ran.length;
      const res = await rawPost(`${gw.url}${p}`, call);
      await res.text();
      if (ran.length > before && res.headers.get('x-fencegate-refusal') === null) passed.push(`${p} -> ${ran[ran.length - 1]}`);
    }
    // Every pass reached exactly the learnt endpoint; every other spelling needed a fence (or was refused).
    for (const line of passed) expect(line.endsWith('-> /mcp/a'), line).toBe(true);
    expect(passed.length).toBeGreaterThan(0);
  });

  it('eviction only ever forgets: a side-effecting tool is never read-only after any sequence of lists', () => {
    const a = new ToolAnnotations();
    a.learn('r', '/b', { tools: [{ name: 'x', annotations: { readOnlyHint: false } }] });
    for (let i = 0; i < 30; i++)
      a.learn('r', `/a?${i}`, { tools: Array.from({ length: 500 }, (_, k) => ({ name: k === 0 ? 'x' : `t${k}`, annotations: { readOnlyHint: true } })) });
    expect(a.readOnly('r', '/b', 'x')).not.toBe(true);
  });
});

describe('what is learnt is bounded in endpoints and bytes, whatever paths and queries callers send', () => {
  it('a list with no tools keeps no endpoint; endpoints are capped', () => {
    const a = new ToolAnnotations();
    for (let i = 0; i < 50_000; i++) a.learn('r', `/mcp?pad=${i}`, { tools: [] });
    const endpoints = (a as unknown as { byRoute: Map<string, { endpoints: Map<string, unknown> }> }).byRoute.get('r')!.endpoints.size;
    expect(endpoints).toBe(0);
    for (let i = 0; i < 5_000; i++) a.learn('r', `/mcp?pad=${i}`, { tools: [{ name: 'x' }] });
    expect((a as unknown as { byRoute: Map<string, { endpoints: Map<string, unknown> }> }).byRoute.get('r')!.endpoints.size).toBe(1_000);
  });

  it('an endpoint listed again is the last to go: 1,000 invented endpoints listed in between do not push it out', () => {
    const list = { tools: [{ name: 'search', annotations: { readOnlyHint: true } }] };
    /** Lists /mcp, then 999 invented endpoints, /mcp again (when `relist`), then one more invented one. */
    const run = (relist: boolean) => {
      const a = new ToolAnnotations();
      a.learn('r', '/mcp', list);
      for (let i = 0; i < 999; i++) a.learn('r', `/mcp?x=${i}`, list);
      if (relist) a.learn('r', '/mcp', list);
      a.learn('r', '/mcp?x=new', list);
      return a;
    };
    const relisted = run(true);
    expect(relisted.readOnly('r', '/mcp', 'search')).toBe(true);
    // The invented endpoint listed longest ago went instead.
    expect(relisted.known('r', '/mcp?x=0', 'search')).toBe(false);
    // Control: without the second list, /mcp is the one listed longest ago and goes.
    expect(run(false).known('r', '/mcp', 'search')).toBe(false);
  });

  it('endpoints with caller-chosen 8 KiB queries are kept as digests, not as their text', () => {
    const a = new ToolAnnotations();
    const pad = 'q'.repeat(8 * 1024);
    for (let i = 0; i < 10_000; i++) a.learn('r', `/mcp?${pad}${i}`, { tools: [{ name: 'x' }] });
    const keys = [...(a as unknown as { byRoute: Map<string, { endpoints: Map<string, unknown> }> }).byRoute.get('r')!.endpoints.keys()];
    const bytes = keys.reduce((n, k) => n + k.length, 0);
    expect(bytes).toBe(keys.length * 64);
    // The last one learnt is still known (the digest is of the whole endpoint, never cut).
    expect(a.readOnly('r', `/mcp?${pad}9999`, 'x')).toBe(false);
    expect(a.known('r', `/mcp?${pad}999`, 'x')).toBe(false);
  });
});

describe('as documented: the endpoint is the path and query; an upstream that picks its server by a header needs readOnly in the config', () => {
  it('with "*": { readOnly: false } tenant b’s side-effecting x is decided although tenant a’s x was listed read-only', async () => {
    const ran: string[] = [];
    const up = await rawUpstream((req, res, body) => {
      const m = JSON.parse(body);
      const tenant = String(req.headers['x-tenant']);
      let result: unknown = {};
      if (m.method === 'tools/list') result = { tools: [{ name: 'x', inputSchema: { type: 'object' }, annotations: { readOnlyHint: tenant === 'a' } }] };
      if (m.method === 'tools/call') ran.push(tenant);
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: m.id, result }));
    });
    cleanups.push(() => up.close());
    const gw = await startMcpGateway([mcpRoute(up.url, { match: { path: '/mcp' }, tools: { '*': { readOnly: false } } })]);
    cleanups.push(() => gw.close());
    await (await rawPost(`${gw.url}/mcp`, JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/list' }), { 'x-tenant': 'a' })).text();
    const res = (await (
      await rawPost(`${gw.url}/mcp`, JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'x', arguments: {}, _meta: {} } }), {
        'x-tenant': 'b',
      })
    ).json()) as { error?: { data?: { type?: string } } };
    expect(ran).toEqual([]);
    expect(res.error?.data?.type).toBe('missing-fence');
  });
});
