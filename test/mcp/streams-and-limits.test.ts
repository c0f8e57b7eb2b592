import { request, type ClientRequest } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { createUndiciForwarder } from '../../src/http/forward-undici.js';
import type { Forwarder } from '../../src/http/forward.js';
import { ToolAnnotations } from '../../src/http/mcp/policy.js';
import { SseSplitter } from '../../src/http/mcp/sse.js';
import { fenced, mcpRoute, startMcpGateway } from './harness.js';
import { rawRequest, rawUpstream, toolCall, type Handler } from './raw-upstream.js';

// Pass-through streams beside decided calls (their own pool, cut at
// shutdown), the byte bound of a stored event, refusals of passed messages,
// and the bounds on what is learnt or configured.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** GETs open a server stream that never ends; POSTs answer their call at once. */
const streamsForever: Handler = (req, res, body) => {
  if (req.method === 'GET') {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(': open\n\n');
    return;
  }
  const m = JSON.parse(body);
  res
    .writeHead(200, { 'content-type': 'application/json' })
    .end(JSON.stringify({ jsonrpc: '2.0', id: m.id, result: { content: [{ type: 'text', text: 'done' }] } }));
};

/** Opens a GET event stream through the gateway and resolves once its first bytes are in. */
function openStream(url: string): Promise<{ req: ClientRequest; ended: Promise<void> }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: 'GET', headers: { accept: 'text/event-stream' } });
    req.on('response', (res) => {
      const ended = new Promise<void>((r) => {
        res.on('end', () => r());
        res.on('error', () => r());
        res.on('close', () => r());
      });
      res.once('data', () => resolve({ req, ended }));
    });
    req.on('error', reject);
    req.end();
  });
}

async function gatewayWith(forwarder: Forwarder, route: Record<string, unknown> = {}) {
  const up = await rawUpstream(streamsForever);
  cleanups.push(() => up.close());
  const gw = await startMcpGateway([mcpRoute(up.url, route)], { forwarder });
  return { up, gw };
}

describe('pass-through streams', () => {
  const decidedCall = (url: string) => rawRequest(`${url}/mcp`, 'POST', toolCall(1, 'refund', { inv: 1 }, fenced(1, 'e', 'k-pool')));

  it('a decided call still runs while more GET streams are open than the decided pool has connections', async () => {
    const { gw } = await gatewayWith(createUndiciForwarder({ connections: 2 }), { timeoutMs: 1000 });
    cleanups.push(() => gw.close());
    const streams = await Promise.all([0, 1, 2].map(() => openStream(`${gw.url}/mcp`)));
    cleanups.unshift(async () => void streams.forEach((s) => s.req.destroy()));
    const r = await decidedCall(gw.url);
    expect(JSON.parse(r.text)).toMatchObject({ id: 1, result: { content: [{ text: 'done' }] } });
  });

  it('negative control: streams sent over the decided pool starve the call', async () => {
    const inner = createUndiciForwarder({ connections: 2 });
    const shared: Forwarder = {
      forward: (r) => inner.forward({ ...r, passThrough: false }),
      forwardStreaming: (r, s) => inner.forwardStreaming!({ ...r, passThrough: false }, s),
      close: () => inner.close!(),
    };
    const { up, gw } = await gatewayWith(shared, { timeoutMs: 1000 });
    const streams = await Promise.all([0, 1].map(() => openStream(`${gw.url}/mcp`)));
    const r = await decidedCall(gw.url);
    expect(JSON.parse(r.text).error.data.type).toMatch(/upstream-(unavailable|timeout)/);
    for (const s of streams) s.req.destroy();
    await up.close();
    await gw.close();
  });

  it('shutdown completes with an idle GET stream open, and ends the stream', async () => {
    const { gw } = await gatewayWith(createUndiciForwarder({ passThroughCloseGraceMs: 200 }));
    const stream = await openStream(`${gw.url}/mcp`);
    cleanups.push(async () => void stream.req.destroy());
    const started = Date.now();
    await gw.close();
    expect(Date.now() - started).toBeLessThan(5_000);
    await stream.ended;
  });

  it('negative control: without the cut (a grace longer than the test) shutdown is still waiting after 2 s', async () => {
    const { up, gw } = await gatewayWith(createUndiciForwarder({ passThroughCloseGraceMs: 3_600_000 }));
    const stream = await openStream(`${gw.url}/mcp`);
    const closing = gw.close().then(() => 'closed');
    expect(await Promise.race([closing, new Promise((r) => setTimeout(() => r('waiting'), 2_000))])).toBe('waiting');
    // Ending the upstream's stream lets the shutdown finish.
    stream.req.destroy();
    await up.close();
    expect(await closing).toBe('closed');
  });
});

describe('bounds', () => {
  it('a stored answer is bounded in UTF-8 bytes, as each event completes: a 1,200-byte final event over a 1,000-byte limit is not kept', async () => {
    const event = (id: unknown) => `data: ${JSON.stringify({ jsonrpc: '2.0', id, result: { t: 'é'.repeat(600) } })}\n\n`;
    // Fewer UTF-16 characters than the limit, more bytes.
    expect(event(1).length).toBeLessThan(1000);
    expect(Buffer.byteLength(event(1))).toBeGreaterThan(1000);
    const up = await rawUpstream((_q, res, body) => void res.writeHead(200, { 'content-type': 'text/event-stream' }).end(event(JSON.parse(body).id)));
    cleanups.push(() => up.close());
    const gw = await startMcpGateway([mcpRoute(up.url, { maxResponseBytes: 1000 })]);
    cleanups.push(() => gw.close());
    const r = await rawRequest(`${gw.url}/mcp`, 'POST', toolCall(1, 't', {}, fenced(1, 'e', 'k-big')));
    expect(r.text).toContain('upstream-response-too-large');
    await new Promise((done) => setTimeout(done, 100));
    const rows = gw.sqlite.db.prepare('SELECT length(body) AS bytes FROM idempotency_records').all() as { bytes: number }[];
    expect(rows).toHaveLength(1);
    expect(rows[0]!.bytes).toBeLessThanOrEqual(1000);
    expect(gw.decisions().map((d) => d.decision)).toEqual(['upstream-response-too-large']);
    // Negative control: one whole event in one chunk, counted in characters, would have passed.
    const s = new SseSplitter(1000);
    expect(s.push(new TextEncoder().encode(event(1)))).toBeNull();
    expect(new SseSplitter(2000).push(new TextEncoder().encode(event(1)))).toHaveLength(1);
  });

  it("a passed message's refusal answers its id", async () => {
    const up = await rawUpstream((_q, res, body) => {
      const m = JSON.parse(body);
      res
        .writeHead(200, { 'content-type': 'application/json' })
        .end(JSON.stringify({ jsonrpc: '2.0', id: m.id, result: { tools: Array.from({ length: 200 }, (_, i) => ({ name: `tool_${i}`, inputSchema: {} })) } }));
    });
    cleanups.push(() => up.close());
    const gw = await startMcpGateway([mcpRoute(up.url, { maxResponseBytes: 2000, tools: { search: { readOnly: true } } })]);
    cleanups.push(() => gw.close());
    const list = await rawRequest(`${gw.url}/mcp`, 'POST', JSON.stringify({ jsonrpc: '2.0', id: 41, method: 'tools/list' }));
    expect(JSON.parse(list.text)).toMatchObject({ id: 41, error: { data: { type: 'upstream-response-too-large' } } });
    const call = await rawRequest(
      `${gw.url}/mcp`,
      'POST',
      JSON.stringify({ jsonrpc: '2.0', id: 'q-42', method: 'tools/call', params: { name: 'search', arguments: {} } }),
    );
    expect(JSON.parse(call.text)).toMatchObject({ id: 'q-42', error: { data: { type: 'upstream-response-too-large' } } });
    // A notification has no id to answer.
    const note = await rawRequest(`${gw.url}/mcp`, 'POST', JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }));
    expect(JSON.parse(note.text).id).toBeNull();
  });

  it('tool names no call could carry are not learnt from tools/list (over 256 characters, control characters)', () => {
    const a = new ToolAnnotations();
    const long = 'x'.repeat(257);
    a.learn('r', '/mcp', {
      tools: [
        { name: long, annotations: { readOnlyHint: true } },
        { name: 'a\u0007b' },
        { name: 'ok', annotations: { readOnlyHint: true } },
        { name: 'y'.repeat(256) },
      ],
    });
    expect(a.known('r', '/mcp', long)).toBe(false);
    expect(a.known('r', '/mcp', 'a\u0007b')).toBe(false);
    expect(a.readOnly('r', '/mcp', 'ok')).toBe(true);
    expect(a.known('r', '/mcp', 'y'.repeat(256))).toBe(true);
  });

  it('an mcp route with a method other than POST, GET and DELETE stops start-up', () => {
    const cfg = (methods: string[]) => () =>
      parseConfig({
        store: { sqlite: ':memory:' },
        routes: [{ name: 'm', protocol: 'mcp', match: { path: '/mcp', methods }, upstream: 'http://127.0.0.1:1' }],
      });
    expect(cfg(['POST', 'PUT'])).toThrow(/only POST, GET and DELETE \(not PUT\)/);
    expect(cfg(['POST', 'PATCH', 'HEAD'])).toThrow(/not PATCH, HEAD/);
    expect(cfg(['POST', 'GET', 'DELETE'])).not.toThrow();
    // A plain route keeps any method.
    expect(() =>
      parseConfig({ store: { sqlite: ':memory:' }, routes: [{ name: 'p', match: { path: '/p', methods: ['PUT'] }, upstream: 'http://127.0.0.1:1' }] }),
    ).not.toThrow();
  });
});
