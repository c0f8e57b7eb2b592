import { afterEach, describe, expect, it } from 'vitest';
import { readMessage } from '../../src/http/mcp/message.js';
import { ToolAnnotations } from '../../src/http/mcp/policy.js';
import { fenced, mcpRoute, rawPost, startMcpGateway } from './harness.js';
import { rawUpstream, type RawUpstream } from './raw-upstream.js';

// Two ways a side-effecting call could pass undecided: a method that is
// tools/call to a lenient upstream but not to the gateway, and a
// readOnlyHint learnt from one MCP server applied to another behind the
// same `/mcp/*` route.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/**
 * An MCP server that folds the method's case and drops whitespace and
 * zero-width spaces in it (as lenient JSON-RPC dispatchers do), with a different server per path: at `/mcp/a`
 * the tool `x` is read-only, at `/mcp/b` it is not. Every call it runs is
 * counted in `ran` (path and method as received).
 */
async function lenientServers(): Promise<RawUpstream & { ran: { path: string; method: string }[] }> {
  const ran: { path: string; method: string }[] = [];
  const up = await rawUpstream((req, res, body) => {
    const msg = JSON.parse(body) as { id: unknown; method: string };
    const method = msg.method.replace(/[\s\u200b]/g, '').toUpperCase();
    const path = (req.url ?? '').split('?')[0]!;
    let result: unknown;
    if (method === 'TOOLS/LIST') result = { tools: [{ name: 'x', inputSchema: { type: 'object' }, annotations: { readOnlyHint: path === '/mcp/a' } }] };
    else if (method === 'TOOLS/CALL') {
      ran.push({ path, method: msg.method });
      result = { content: [{ type: 'text', text: `ran on ${path}` }] };
    } else result = {};
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result }));
  });
  cleanups.push(() => up.close());
  return Object.assign(up, { ran });
}

async function gateway(up: RawUpstream) {
  const gw = await startMcpGateway([mcpRoute(up.url, { match: { path: '/mcp/*' } })]);
  cleanups.push(() => gw.close());
  return gw;
}

/** The JSON-RPC answer to a raw POST (JSON.parse's value: read as the test expects). */
const answer = async (url: string, body: string) => JSON.parse(await (await rawPost(url, body)).text());

const call = (id: number, method: string, meta: Record<string, string> = {}) =>
  JSON.stringify({ jsonrpc: '2.0', id, method, params: { name: 'x', arguments: {}, _meta: meta } });

describe('a method that is tools/call in another spelling', () => {
  const variants = [
    'Tools/call',
    'TOOLS/CALL',
    ' tools/call',
    'tools/call\n',
    '\ttools/call ',
    'tools/\u200bcall',
    'toolſ/call',
    `tools/call${' '.repeat(1000)}`,
  ];

  it('is refused (-32007 invalid-request) before the upstream, which would have run it; the exact tools/call is decided', async () => {
    const up = await lenientServers();
    const gw = await gateway(up);
    for (const [i, method] of variants.entries()) {
      const res = await rawPost(`${gw.url}/mcp/b`, call(i + 1, method, fenced(1, 'e:1', `k-${i}`)));
      expect(res.status).toBe(200);
      expect(res.headers.get('x-fencegate-refusal')).toBe('invalid-request');
      expect(await res.json()).toMatchObject({ id: i + 1, error: { code: -32007, data: { type: 'invalid-request' } } });
    }
    // In a batch too (a batch with an exact tools/call is refused already).
    const batch = await rawPost(`${gw.url}/mcp/b`, `[${call(90, 'TOOLS/CALL')}]`);
    expect(JSON.parse(await batch.text()).error.data.type).toBe('invalid-request');
    expect(up.seen).toHaveLength(0);
    // Other methods still pass, and the exact spelling is decided (fenced, then forwarded).
    expect((await answer(`${gw.url}/mcp/b`, JSON.stringify({ jsonrpc: '2.0', id: 91, method: 'Tools/List' }))).result).toBeDefined();
    expect((await answer(`${gw.url}/mcp/b`, call(92, 'tools/call'))).error.data.type).toBe('missing-fence');
    expect((await answer(`${gw.url}/mcp/b`, call(93, 'tools/call', fenced(1, 'e:1', 'k-exact')))).result).toBeDefined();
    expect(up.ran).toEqual([{ path: '/mcp/b', method: 'tools/call' }]);
  });

  it('negative control: this upstream runs every variant as a call, and with the check off the gateway classifies them as messages to pass', async () => {
    const up = await lenientServers();
    for (const [i, method] of variants.entries()) await (await rawPost(`${up.url}/mcp/b`, call(i + 1, method))).text();
    expect(up.ran).toHaveLength(variants.length);
    for (const method of variants) {
      const body = new TextEncoder().encode(call(1, method));
      expect(readMessage(body).kind).toBe('refused');
      expect(readMessage(body, () => false).kind).toBe('pass');
    }
  });
});

describe('readOnlyHint is learnt per endpoint', () => {
  async function listBoth(url: string) {
    for (const path of ['/mcp/a', '/mcp/b']) await (await rawPost(`${url}${path}`, JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/list' }))).text();
  }

  it('x read-only on /mcp/a passes there; on /mcp/b (x side-effecting) it needs a fence and key', async () => {
    const up = await lenientServers();
    const gw = await gateway(up);
    await listBoth(gw.url);
    expect((await answer(`${gw.url}/mcp/a`, call(1, 'tools/call'))).result.content[0].text).toBe('ran on /mcp/a');
    expect((await answer(`${gw.url}/mcp/b`, call(2, 'tools/call'))).error.data.type).toBe('missing-fence');
    // Another query is another endpoint: nothing was learnt there.
    expect((await answer(`${gw.url}/mcp/a?server=2`, call(3, 'tools/call'))).error.data.type).toBe('missing-fence');
    expect(up.ran.map((r) => r.path)).toEqual(['/mcp/a']);
    expect(gw.decisions().map((d) => d.decision)).toContain('passed-read-only');
  });

  it('negative control: with the endpoint left out of what is learnt, the call on /mcp/b passes unfenced and runs', async () => {
    const proto = ToolAnnotations.prototype;
    const saved = { learn: proto.learn, readOnly: proto.readOnly, known: proto.known };
    proto.learn = function (route, _endpoint, result) {
      return saved.learn.call(this, route, '', result);
    };
    proto.readOnly = function (route, _endpoint, tool) {
      return saved.readOnly.call(this, route, '', tool);
    };
    proto.known = function (route, _endpoint, tool) {
      return saved.known.call(this, route, '', tool);
    };
    cleanups.push(async () => void Object.assign(proto, saved));
    const up = await lenientServers();
    const gw = await gateway(up);
    // /mcp/a listed last: its "read-only" overwrites /mcp/b's answer.
    for (const path of ['/mcp/b', '/mcp/a']) await (await rawPost(`${gw.url}${path}`, JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/list' }))).text();
    expect((await answer(`${gw.url}/mcp/b`, call(2, 'tools/call'))).result.content[0].text).toBe('ran on /mcp/b');
    expect(up.ran.map((r) => r.path)).toEqual(['/mcp/b']);
  });

  it('the endpoints of a route share one bound; the endpoint learnt longest ago is forgotten first', () => {
    const a = new ToolAnnotations();
    const many = (n: number, prefix: string) => ({
      tools: Array.from({ length: n }, (_, i) => ({ name: `${prefix}${i}`, annotations: { readOnlyHint: true } })),
    });
    a.learn('r', '/one', many(6000, 'a'));
    a.learn('r', '/two', many(3000, 'b'));
    expect(a.readOnly('r', '/one', 'a1')).toBe(true);
    a.learn('r', '/three', many(2000, 'c'));
    expect(a.known('r', '/one', 'a1')).toBe(false);
    expect(a.readOnly('r', '/two', 'b1')).toBe(true);
    expect(a.readOnly('r', '/three', 'c1999')).toBe(true);
    // Another route has a budget of its own.
    a.learn('s', '/one', many(1, 'a'));
    expect(a.readOnly('s', '/one', 'a0')).toBe(true);
    expect(a.readOnly('s', '/two', 'a0')).toBeUndefined();
  });
});
