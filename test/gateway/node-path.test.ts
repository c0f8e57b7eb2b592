import { getRequestListener } from '@hono/node-server';
import { createServer, type RequestListener, type Server } from 'node:http';
import { Readable } from 'node:stream';
import type { AddressInfo } from 'node:net';
import { Pool } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { createNodeListener, rawHeaderReader } from '../../src/entry/node-listener.js';
import { createUndiciForwarder } from '../../src/http/forward-undici.js';
import { createGateway, type Gateway } from '../../src/http/gateway.js';
import { SqliteGatewayStore } from '../../src/store/sqlite/gateway-store.js';
import { hsAuth, token } from '../auth/tokens.js';
import { paymentsRoute, snapshot, tempDir } from '../helpers/gateway.js';
import { rawRequest, type RawRequest, type RawResponse } from '../helpers/raw-http.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// The Node entry answers proxied requests without Hono's Request/Response
// (src/entry/node-listener.ts); Workers and `app.fetch` go through Hono.
// The decisions are one function, but each server reads headers, the path
// and the body and writes the answer its own way: the same requests must
// get the same answers, and leave the same rows, on both.

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

interface Side {
  url: string;
  up: FakeUpstream;
  store: SqliteGatewayStore;
  /** Requests the Node listener handed to the Hono app. */
  fellBack: string[];
  /** Requests answered by `gateway.direct`. */
  direct: number;
}

const connections = { count: 0 };

async function listen(listener: RequestListener): Promise<string> {
  const server: Server = createServer(listener);
  server.on('connection', () => connections.count++);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  cleanups.push(() => new Promise<void>((r) => server.close(() => r())));
  cleanups.push(() => server.closeAllConnections());
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function side(kind: 'node' | 'hono', extra: Record<string, unknown> = {}): Promise<Side> {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const tmp = tempDir();
  cleanups.push(() => tmp.cleanup());
  const config = parseConfig({
    listen: { host: '127.0.0.1', port: 0 },
    store: { sqlite: `${tmp.dir}/g.db`, synchronous: 'NORMAL' },
    routes: [
      paymentsRoute(up.url, { maxBodyBytes: 256, replayHeaders: ['content-type', 'location'] }),
      paymentsRoute(up.url, { name: 'lookup', match: { path: '/lookup/*', methods: ['GET', 'HEAD'] }, fence: 'off', idempotency: 'off', mode: 'concurrent' }),
    ],
    ...extra,
  });
  const store = new SqliteGatewayStore({ path: `${tmp.dir}/g.db`, synchronous: 'NORMAL' });
  const gateway: Gateway = createGateway({ config, store, forwarder: createUndiciForwarder(), env: {} });
  cleanups.push(() => gateway.close());
  const s: Side = { url: '', up, store, fellBack: [], direct: 0 };
  const hono = getRequestListener(gateway.app.fetch);
  if (kind === 'hono') {
    s.url = await listen(hono);
    return s;
  }
  const direct = gateway.direct!;
  gateway.direct = (request) => {
    s.direct++;
    return direct(request);
  };
  s.url = await listen(
    createNodeListener(gateway, (req, res) => {
      s.fellBack.push(`${req.method} ${req.url}`);
      return hono(req, res);
    }),
  );
  return s;
}

const cmd = (n: number, key: string, extra: [string, string][] = []): [string, string][] => [
  ['X-Request-Id', `req-${key}-${n}`],
  ['X-Execution-Fence', String(n)],
  ['X-Fence-Entity', 'acct_1'],
  ['Idempotency-Key', key],
  ['Content-Type', 'application/json'],
  ...extra,
];

/** The script: every kind of answer the proxy gives, in order (later requests see earlier state). */
const script: (RawRequest & { behave?: (up: FakeUpstream) => void })[] = [
  { path: '/payments/charges', headers: cmd(1, 'k1'), body: '{"amount":1}' },
  { path: '/payments/charges', headers: cmd(1, 'k1'), body: '{"amount":1}' }, // replay
  { path: '/payments/charges', headers: cmd(1, 'k1'), body: '{"amount":2}' }, // key reused
  { path: '/payments/charges', headers: cmd(0, 'k2'), body: '{}' }, // stale fence
  { path: '/payments/charges?x=%2F&y=1', headers: cmd(2, 'k3'), body: '{}', chunked: 1 }, // chunked body, query kept
  { path: '/payments/charges', headers: cmd(3, 'k4').filter(([n]) => n !== 'X-Fence-Entity'), body: '{}' }, // missing entity
  { path: '/payments/charges', headers: [...cmd(3, 'k5'), ['X-Execution-Fence', '4']], body: '{}' }, // fence repeated
  { path: '/payments/charges', headers: [...cmd(3, 'k6'), ['x-fence-entity', 'acct_1']], body: '{}' }, // entity repeated, other case
  { path: '/payments/charges', headers: cmd(3, 'k7'), body: 'x'.repeat(300) }, // over maxBodyBytes
  { path: '/payments/charges', headers: [...cmd(3, 'k8'), ['Transfer-Encoding', 'gzip']], body: '{}', chunked: 1 }, // "gzip, chunked"
  { path: '/payments/..%2Fadmin', headers: cmd(3, 'k9'), body: '{}' },
  { path: '/nowhere', headers: cmd(3, 'k10'), body: '{}' }, // no route
  { method: 'GET', path: '/payments/charges', headers: cmd(3, 'k11') }, // method not routed
  { path: '/payments/charges', headers: [['X-Request-Id', 'not a valid id!'], ...cmd(3, 'k12').slice(1)], body: '{}' }, // id replaced
  {
    path: '/payments/refunds',
    headers: cmd(5, 'k13'),
    body: '{}',
    behave: (up) =>
      up.behave(() => ({
        kind: 'respond',
        status: 202,
        headers: {
          'content-type': 'text/plain',
          location: '/r/1',
          'set-cookie': ['a=1', 'b=2'],
          'x-request-id': 'upstream-id',
          connection: 'x-drop',
          'x-drop': '1',
        },
        body: 'ok',
      })),
  },
  { path: '/payments/refunds', headers: cmd(5, 'k13'), body: '{}' }, // its replay: only the allow-listed headers
  { path: '/payments/void', headers: cmd(6, 'k14'), body: '', behave: (up) => up.behave(() => ({ kind: 'respond', status: 204 })) },
  { path: '/payments/void', headers: cmd(7, 'k15'), body: '{}', behave: (up) => up.behave(() => ({ kind: 'respond', status: 503, body: 'busy' })) }, // released
  { method: 'HEAD', path: '/lookup/x', headers: [['X-Request-Id', 'req-head-1']], behave: (up) => up.behave(null) }, // no body, and no length claimed
  { method: 'GET', path: '/lookup/x', headers: [['X-Request-Id', 'req-get-1']] },
  { method: 'GET', path: '/_fencegate/health', headers: [] },
  { method: 'GET', path: '/%5Ffencegate/health', headers: [] }, // Hono routes on the decoded path
];

async function play(s: Side): Promise<{ answers: unknown[]; rows: string; upstream: unknown[] }> {
  const answers: unknown[] = [];
  for (const step of script) {
    step.behave?.(s.up);
    const res: RawResponse = await rawRequest(s.url, step);
    const { date: _date, ...headers } = res.headers;
    // A random request id (the one sent was not valid) differs between runs by design.
    const id = /^req-/.test(headers['x-request-id'] ?? '') ? headers['x-request-id'] : '(generated)';
    answers.push({
      step: `${step.method ?? 'POST'} ${step.path}`,
      status: res.status,
      headers: { ...headers, 'x-request-id': id },
      body: res.text.replace(/"request_id":"[0-9a-f-]{36}"/, '"request_id":"(generated)"'),
    });
  }
  // Rows: owner tokens and request ids are random; everything else must match.
  const rows = snapshot(s.store)
    .replace(/"owner_token":"[^"]*"/g, '"owner_token":"*"')
    .replace(/"inflight_owner":"[^"]*"/g, '"inflight_owner":"*"')
    .replace(/"request_id":"[0-9a-f-]{36}"/g, '"request_id":"*"')
    .replace(/"(created_at|expires_at|locked_until|accepted_at|at|inflight_until)":"\d+"/g, '"$1":"*"');
  const upstream = s.up.calls.map((c) => ({
    url: c.url,
    body: c.body.toString(),
    fence: c.fence,
    entity: c.entity,
    key: c.key,
    headers: Object.keys(c.headers).sort(),
  }));
  return { answers, rows, upstream };
}

describe('the Node listener and the Hono app', () => {
  it('give the same answers, leave the same rows and send the upstream the same requests', async () => {
    const node = await side('node');
    const hono = await side('hono');
    const a = await play(node);
    const b = await play(hono);
    // One known difference, the Hono side's: where the upstream's answer
    // has no Content-Type, @hono/node-server adds "text/plain"; the Node
    // path passes the upstream's headers on as they came.
    const invented: number[] = [];
    (b.answers as { headers: Record<string, string> }[]).forEach((h, i) => {
      const mine = (a.answers[i] as { headers: Record<string, string> }).headers;
      if (mine['content-type'] === undefined && h.headers['content-type'] === 'text/plain; charset=UTF-8') {
        invented.push(i);
        delete h.headers['content-type'];
      }
    });
    expect(invented).toEqual([16, 17]); // the 204 and the 503 "busy", both without one upstream
    for (let i = 0; i < script.length; i++) expect(a.answers[i], `step ${i}`).toEqual(b.answers[i]);
    expect(a.rows).toBe(b.rows);
    expect(a.upstream).toEqual(b.upstream);
    const headAnswer = a.answers[18] as { headers: Record<string, string> };
    expect(headAnswer.headers['content-length']).toBeUndefined();
    // Not vacuous: the Node side really took its own path for the proxied
    // requests, and only the admin requests went to Hono.
    expect(node.fellBack).toEqual(['GET /_fencegate/health', 'GET /%5Ffencegate/health']);
    expect(node.direct).toBe(script.length - 2);
    // And the script reached every branch it names.
    expect((a.answers as { status: number }[]).map((x) => x.status)).toEqual([
      201, 201, 422, 409, 201, 400, 400, 400, 413, 400, 400, 404, 404, 201, 202, 202, 204, 503, 201, 201, 200, 200,
    ]);
  });

  it('sends to the Hono app what @hono/node-server must judge: absolute-form targets, a backslash in the query, a bad Host', async () => {
    const node = await side('node');
    await rawRequest(node.url, { method: 'GET', path: 'http://127.0.0.1/payments/x', headers: [] });
    await rawRequest(node.url, { path: '/payments/x?q=\\', headers: cmd(1, 'b1'), body: '{}' });
    expect(node.fellBack).toEqual(['GET http://127.0.0.1/payments/x', 'POST /payments/x?q=\\']);
    expect(node.direct).toBe(0);
  });

  it('answers a backslash in the path itself, 400 invalid-request as problem+json (@hono/node-server would answer a bare 400): neither way in sees it', async () => {
    const node = await side('node');
    const res = await rawRequest(node.url, { path: '/payments\\x', headers: cmd(1, 'b2'), body: '{}' });
    expect(res.status).toBe(400);
    expect(res.headers['content-type']).toBe('application/problem+json');
    expect(JSON.parse(res.text).type).toMatch(/\/invalid-request$/);
    expect(node.fellBack).toEqual([]);
    expect(node.direct).toBe(0);
    expect(node.up.calls).toHaveLength(0);
  });
});

describe('with caller auth', () => {
  it('the Node listener still answers proxied requests itself (auth is a stage of the pipeline), and both ways in agree', async () => {
    const node = await side('node', { auth: hsAuth() });
    const hono = await side('hono', { auth: hsAuth() });
    const proxy = await token();
    const auditOnly = await token({ scope: 'fencegate:audit' });
    const steps: RawRequest[] = [
      { path: '/payments/charges', headers: [['Authorization', `Bearer ${proxy}`], ...cmd(1, 'a1')], body: '{"amount":1}' },
      { path: '/payments/charges', headers: [['Authorization', `Bearer ${proxy}`], ...cmd(1, 'a1')], body: '{"amount":1}' }, // its replay
      { path: '/payments/charges', headers: cmd(2, 'a2'), body: '{}' }, // no token: 401
      { path: '/payments/charges', headers: [['Authorization', `Bearer ${auditOnly}`], ...cmd(3, 'a3')], body: '{}' }, // no proxy scope: 403
      { path: '/nowhere', headers: cmd(4, 'a4'), body: '{}' }, // 404 before auth
    ];
    const answers = async (s: Side) => {
      const out: unknown[] = [];
      for (const step of steps) {
        const res = await rawRequest(s.url, step);
        out.push({
          status: res.status,
          authenticate: res.headers['www-authenticate'] ?? null,
          replayed: res.headers['idempotent-replayed'] ?? null,
          type: res.status >= 400 ? JSON.parse(res.text).type : null,
        });
      }
      return out;
    };
    const a = await answers(node);
    expect(a).toEqual(await answers(hono));
    expect((a as { status: number }[]).map((x) => x.status)).toEqual([201, 201, 401, 403, 404]);
    // The caller's token authenticates it to the gateway, never to the upstream.
    expect(node.up.calls).toHaveLength(1);
    expect(node.up.calls[0]!.headers.authorization).toBeUndefined();
    // Not vacuous: every proxied request, refused or not, took the Node listener's own path.
    expect(node.fellBack).toEqual([]);
    expect(node.direct).toBe(steps.length);
    // The refusals are logged alike on both ways in.
    const reasons = (s: Side) => s.store.db.prepare('SELECT reason, caller FROM rejections ORDER BY id').all() as { reason: string; caller: string | null }[];
    expect(reasons(node)).toEqual([
      { reason: 'unauthorized', caller: null },
      { reason: 'forbidden', caller: 'billing' },
    ]);
    expect(reasons(hono)).toEqual(reasons(node));
  });
});

describe('an unread request body', () => {
  it('is discarded after a refusal that did not need it, and the connection carries the next request', async () => {
    const node = await side('node');
    const pool = new Pool(node.url, { connections: 1 });
    cleanups.push(() => pool.close());
    const before = connections.count;
    // Refused before the body is read (Node's server drops such a body itself).
    const refused = await pool.request({
      method: 'POST',
      path: '/payments/charges',
      headers: { 'x-execution-fence': '1', 'idempotency-key': 'u1' },
      body: 'x'.repeat(200),
    });
    expect(refused.statusCode).toBe(400);
    await refused.body.arrayBuffer();
    // Refused halfway through a chunked body over the route's 256 bytes: the rest is the listener's to discard.
    const chunks = async function* () {
      for (let i = 0; i < 64; i++) yield Buffer.alloc(4096, 120);
    };
    const tooLarge = await pool.request({
      method: 'POST',
      path: '/payments/charges',
      headers: Object.fromEntries(cmd(1, 'u3')),
      body: Readable.from(chunks()),
    });
    expect(tooLarge.statusCode).toBe(413);
    await tooLarge.body.arrayBuffer();
    const next = await pool.request({ method: 'POST', path: '/payments/charges', headers: Object.fromEntries(cmd(1, 'u2')), body: '{}' });
    expect(next.statusCode).toBe(201);
    await next.body.arrayBuffer();
    expect(connections.count - before).toBe(1);
    expect(node.up.effects).toBe(1);
  });
});

describe('rawHeaderReader', () => {
  it('reads as Headers reads: any case, repeated fields joined with ", "', () => {
    const raw = ['X-Fence-Entity', 'a', 'content-type', 'text/plain', 'x-fence-entity', 'b', 'Host', 'h'];
    const mine = rawHeaderReader(raw);
    const web = new Headers();
    for (let i = 0; i < raw.length; i += 2) web.append(raw[i]!, raw[i + 1]!);
    for (const name of ['x-fence-entity', 'X-FENCE-ENTITY', 'content-type', 'host', 'absent']) expect(mine.get(name)).toBe(web.get(name));
    const seen: [string, string][] = [];
    mine.forEach((v, n) => seen.push([n, v]));
    const expected: [string, string][] = [];
    web.forEach((v, n) => expected.push([n, v]));
    expect(seen.sort()).toEqual(expected.sort());
  });
});
