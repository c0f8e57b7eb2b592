import { afterEach, describe, expect, it } from 'vitest';
import { createUndiciForwarder } from '../../src/http/forward-undici.js';
import type { Forwarder } from '../../src/http/forward.js';
import { MCP_ERROR_CODES } from '../../src/protocol/mcp.js';
import type { GatewayStore } from '../../src/store/types.js';
import { snapshot } from '../helpers/gateway.js';
import { connectClient, fenced, mcpRoute, startMcpGateway, textOf } from './harness.js';
import { startMcpUpstream } from './mcp-upstream.js';
import { echoTool, gzipRelay, rawRequest, rawUpstream, toolCall, type Handler } from './raw-upstream.js';

// What makes two calls one command (the endpoint, the arguments as
// written), what an upstream answer means for the key (compressed answers,
// 4xx), and how GET/DELETE bodies are refused.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(handler: Handler, route: Record<string, unknown> = {}, options: Parameters<typeof startMcpGateway>[1] = {}) {
  const up = await rawUpstream(handler);
  cleanups.push(() => up.close());
  const gw = await startMcpGateway([mcpRoute(up.url, route)], options);
  cleanups.push(() => gw.close());
  return { up, gw };
}

const rpc = (text: string) => JSON.parse(text) as { id: unknown; result?: { content: { text: string }[] }; error?: { code: number; data: { type: string } } };

/** The store with admit and finish seeing another scope and fingerprint (a negative control's "check off"). */
function rewriting(inner: GatewayStore, scope: (s: string) => string, fp: (f: string, key: string | null) => string): GatewayStore {
  return new Proxy(inner, {
    get(target, prop) {
      if (prop === 'admit')
        return (input: Parameters<GatewayStore['admit']>[0]) =>
          target.admit({ ...input, scope: scope(input.scope), fingerprint: fp(input.fingerprint, input.key) });
      if (prop === 'finish') return (input: Parameters<GatewayStore['finish']>[0]) => target.finish({ ...input, scope: scope(input.scope) });
      const v = Reflect.get(target, prop) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
}

describe('the endpoint is part of the command', () => {
  async function twoTenants(wrapStore?: (s: GatewayStore) => GatewayStore) {
    const tool = echoTool();
    const { up, gw } = await setup(tool.handler, { match: { path: '/mcp/*' } }, wrapStore ? { wrapStore } : {});
    const meta = fenced(1, 'job-1', 'k-1');
    const a = await rawRequest(`${gw.url}/mcp/tenant-a?ws=1`, 'POST', toolCall(1, 'export_data', { what: 'all' }, meta));
    const b = await rawRequest(`${gw.url}/mcp/tenant-b?ws=2`, 'POST', toolCall(2, 'export_data', { what: 'all' }, meta));
    const q = await rawRequest(`${gw.url}/mcp/tenant-a?ws=3`, 'POST', toolCall(3, 'export_data', { what: 'all' }, meta));
    const again = await rawRequest(`${gw.url}/mcp/tenant-a?ws=1`, 'POST', toolCall(4, 'export_data', { what: 'all' }, meta));
    return { up, a, b, q, again, runs: tool.runs() };
  }

  it('the same key on another path is another key space; another query under one key is idempotency-key-reused; the same endpoint replays', async () => {
    const { up, a, b, q, again, runs } = await twoTenants();
    expect(rpc(a.text).result!.content[0]!.text).toBe('run 1 at /mcp/tenant-a?ws=1');
    expect(b.headers['idempotent-replayed']).toBeUndefined();
    expect(rpc(b.text).result!.content[0]!.text).toBe('run 2 at /mcp/tenant-b?ws=2');
    expect(rpc(q.text).error).toMatchObject({ code: MCP_ERROR_CODES['idempotency-key-reused'], data: { type: 'idempotency-key-reused' } });
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(rpc(again.text)).toMatchObject({ id: 4, result: { content: [{ text: 'run 1 at /mcp/tenant-a?ws=1' }] } });
    expect(runs).toBe(2);
    expect(up.seen.map((s) => s.url)).toEqual(['/mcp/tenant-a?ws=1', '/mcp/tenant-b?ws=2']);
  });

  it("negative control: with the path out of the scope and the fingerprint, tenant-b is answered with tenant-a's stored result", async () => {
    const { b, runs } = await twoTenants((s) =>
      rewriting(
        s,
        (scope) => scope.replace(/\u0000path:.*$/, ''),
        (_f, key) => `same:${key}`,
      ),
    );
    expect(b.headers['idempotent-replayed']).toBe('true');
    expect(rpc(b.text).result!.content[0]!.text).toBe('run 1 at /mcp/tenant-a?ws=1');
    expect(runs).toBe(1);
  });
});

describe('arguments as written', () => {
  it('9007199254740993 and 9007199254740992 are two commands (reused key refused, one execution); a repeated member deep in arguments is refused before the upstream', async () => {
    const tool = echoTool();
    const { up, gw } = await setup(tool.handler, { entity: { json: '/arguments/account' } });
    const meta = { 'io.fencegate/fence': '1', 'io.fencegate/idempotency-key': 'k-big' };
    const mk = (id: number, args: string) =>
      `{"jsonrpc":"2.0","id":${id},"method":"tools/call","params":{"name":"transfer","arguments":${args},"_meta":${JSON.stringify(meta)}}}`;
    await rawRequest(`${gw.url}/mcp`, 'POST', mk(1, '{"account":"a1","amount":9007199254740993}'));
    const second = await rawRequest(`${gw.url}/mcp`, 'POST', mk(2, '{"account":"a1","amount":9007199254740992}'));
    expect(rpc(second.text).error!.data.type).toBe('idempotency-key-reused');
    // Whitespace and member order are not the command: replayed.
    const same = await rawRequest(`${gw.url}/mcp`, 'POST', mk(3, '{ "amount" : 9007199254740993, "account" : "a1" }'));
    expect(same.headers['idempotent-replayed']).toBe('true');
    expect(tool.runs()).toBe(1);

    const before = snapshot(gw.sqlite);
    const dup = await rawRequest(`${gw.url}/mcp`, 'POST', mk(4, '{"account":"a5","to":{"iban":"ATTACKER","iban":"VICTIM"}}').replace('k-big', 'k-dup'));
    expect(dup.status).toBe(200);
    expect(rpc(dup.text)).toMatchObject({ id: 4, error: { code: MCP_ERROR_CODES['invalid-request'], data: { type: 'invalid-request' } } });
    expect(up.seen).toHaveLength(1);
    expect(snapshot(gw.sqlite)).toBe(before);
  });
});

describe('compressed answers', () => {
  async function sdkBehindGzip(forwarder?: Forwarder, force = false) {
    const server = await startMcpUpstream({ stateful: true, json: true });
    cleanups.push(() => server.close());
    const relay = await gzipRelay(server.url, { force });
    cleanups.push(() => relay.close());
    const gw = await startMcpGateway([mcpRoute(relay.url)], forwarder ? { forwarder } : {});
    cleanups.push(() => gw.close());
    // The SDK client over Node's fetch offers gzip, as every agent using it does.
    const c = await connectClient(`${gw.url}/mcp`);
    cleanups.push(() => c.close());
    const callOnce = () =>
      c.client
        .callTool({ name: 'create_ticket', arguments: { title: 'printer on fire' }, _meta: fenced(1, 'job-z', 'k-zip') })
        .then(textOf, (e: { code?: number }) => `error ${e.code}`);
    return { server, relay, gw, callOnce };
  }

  it('the upstream is asked for identity: a gzip middleware leaves the answer alone, the result is stored and replayed, one ticket', async () => {
    const { server, relay, gw, callOnce } = await sdkBehindGzip();
    expect(await callOnce()).toContain('T-1');
    expect(await callOnce()).toContain('T-1');
    expect(server.tickets).toHaveLength(1);
    expect(relay.gzipped()).toBe(0);
    expect(relay.seen.every((s) => s.headers['accept-encoding'] === 'identity')).toBe(true);
    expect(
      gw
        .decisions()
        .filter((d) => d.tool === 'create_ticket')
        .map((d) => d.decision),
    ).toEqual(['forwarded', 'replayed']);
  });

  it("negative control: the caller's gzip forwarded, the result is unreadable: outcome unknown, the retry gets -32005", async () => {
    const gzipAgain = (f: Forwarder): Forwarder => ({
      forward: (r) => f.forward({ ...r, headers: { ...r.headers, 'accept-encoding': 'gzip' } }),
      forwardStreaming: (r, s) => f.forwardStreaming!({ ...r, headers: { ...r.headers, 'accept-encoding': 'gzip' } }, s),
      close: () => f.close!(),
    });
    const { server, relay, gw, callOnce } = await sdkBehindGzip(gzipAgain(createUndiciForwarder()));
    // The caller decodes what it was sent (the content coding passes through), so it sees its ticket…
    expect(await callOnce()).toContain('T-1');
    // …but the gateway could not read it: not stored.
    expect(await callOnce()).toBe(`error ${MCP_ERROR_CODES['outcome-unknown']}`);
    expect(server.tickets).toHaveLength(1);
    expect(relay.gzipped()).toBeGreaterThan(0);
    expect(
      gw
        .decisions()
        .filter((d) => d.tool === 'create_ticket')
        .map((d) => d.decision),
    ).toEqual(['upstream-no-response', 'outcome-unknown']);
  });

  it('an upstream that gzips anyway (an event stream too) is passed on intact and recorded as outcome unknown', async () => {
    const { gunzipSync, gzipSync } = await import('node:zlib');
    const event = (id: unknown) =>
      `event: message\ndata: ${JSON.stringify({ jsonrpc: '2.0', id, result: { content: [{ type: 'text', text: 'refund done' }] } })}\n\n`;
    const { gw } = await setup(
      (_q, res, body) => void res.writeHead(200, { 'content-type': 'text/event-stream', 'content-encoding': 'gzip' }).end(gzipSync(event(JSON.parse(body).id))),
    );
    const r = await rawRequest(`${gw.url}/mcp`, 'POST', toolCall(1, 'refund', { inv: 1 }, fenced(1, 'job-s', 'k-sse')));
    expect(r.headers['content-encoding']).toBe('gzip');
    expect(gunzipSync(r.body).toString()).toBe(event(1));
    expect(gw.decisions().map((d) => d.decision)).toEqual(['upstream-no-response']);
  });
});

describe('4xx from the upstream', () => {
  const answering =
    (status: number, body: (id: unknown) => string | null): Handler =>
    (_q, res, raw) => {
      const text = body(JSON.parse(raw).id);
      res.writeHead(status, text === null ? {} : { 'content-type': 'application/json' }).end(text ?? '');
    };
  const twice = async (gw: { url: string }) => {
    const one = await rawRequest(`${gw.url}/mcp`, 'POST', toolCall(1, 'refund', { inv: 7 }, fenced(1, 'e', 'k-4xx')));
    const two = await rawRequest(`${gw.url}/mcp`, 'POST', toolCall(2, 'refund', { inv: 7 }, fenced(1, 'e', 'k-4xx')));
    return [one, two];
  };

  it.each([
    ['a proxy 408 (no JSON-RPC error)', 408, () => 'Request Timeout'],
    ["a 400 answering the call's id", 400, (id: unknown) => JSON.stringify({ jsonrpc: '2.0', id, error: { code: -32602, message: 'bad arguments' } })],
  ])('%s may come after the tool ran: stored and replayed, one execution', async (_name, status, body) => {
    const { up, gw } = await setup(answering(status, body));
    const [one, two] = await twice(gw);
    expect(one!.status).toBe(status);
    expect(two!.status).toBe(status);
    expect(two!.headers['idempotent-replayed']).toBe('true');
    expect(up.seen).toHaveLength(1);
  });

  it.each([
    ['404, unknown session, id null', 404, () => JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Session not found' } })],
    ['406, no body', 406, () => null],
  ])('a transport refusal (%s) proves nothing ran: released, the retry is forwarded', async (_name, status, body) => {
    const { up, gw } = await setup(answering(status, body));
    const [, two] = await twice(gw);
    expect(two!.headers['idempotent-replayed']).toBeUndefined();
    expect(up.seen).toHaveLength(2);
  });

  it('negative control: with 408 in releaseStatuses the key is released and the tool runs again', async () => {
    const { up, gw } = await setup(
      answering(408, () => 'Request Timeout'),
      { releaseStatuses: [408] },
    );
    await twice(gw);
    expect(up.seen).toHaveLength(2);
  });
});

describe('GET and DELETE', () => {
  it.each(['GET', 'DELETE'])('a %s with a body is refused invalid-request and never forwarded; without one it passes', async (method) => {
    const { up, gw } = await setup((_q, res) => void res.writeHead(method === 'GET' ? 405 : 200).end());
    const before = snapshot(gw.sqlite);
    const smuggled = await rawRequest(`${gw.url}/mcp`, method, toolCall(1, 'refund_payment', { invoice: 'inv-1' }));
    expect(smuggled.status).toBe(400);
    expect(smuggled.headers['x-fencegate-refusal']).toBe('invalid-request');
    expect(up.seen).toHaveLength(0);
    expect(snapshot(gw.sqlite)).toBe(before);
    // Negative control: the same request without the body reaches the upstream.
    await rawRequest(`${gw.url}/mcp`, method, '');
    expect(up.seen.map((s) => s.method)).toEqual([method]);
  });
});
