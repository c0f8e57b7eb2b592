import { gzipSync } from 'node:zlib';
import { afterEach, describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../../src/config/load.js';
import { createFetchForwarder } from '../../src/http/forward-fetch.js';
import { createGateway } from '../../src/http/gateway.js';
import { SqliteGatewayStore } from '../../src/store/sqlite/gateway-store.js';
import { expectProblem, paymentsRoute, snapshot, startTestGateway, type RouteInput, type TestGateway } from '../helpers/gateway.js';
import { rawRequest } from '../helpers/raw-http.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// Path and method overrides (X-Original-URL, X-HTTP-Method-Override, a
// `_method` query, …) never reach an upstream that could act on them under
// another route's policy, unless the route names them in `allowOverrides`
// (DESIGN §3.3, §3.6). Real gateway on loopback (undici forwarder) and the
// Hono app with the fetch forwarder, real SQLite files, recording upstream.

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** The fenced route, and a broader unfenced one on the same upstream: what an override would cross from. */
function routes(up: string, other: Record<string, unknown> = {}): RouteInput[] {
  return [
    paymentsRoute(up),
    {
      name: 'other',
      match: { path: '/other/*', methods: ['POST', 'GET'] },
      upstream: up,
      fence: 'off',
      idempotency: 'off',
      entity: { header: 'X-Fence-Entity' },
      ...other,
    },
  ];
}

async function setup(other: Record<string, unknown> = {}): Promise<{ up: FakeUpstream; gw: TestGateway }> {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const gw = await startTestGateway({ routes: routes(up.url, other) });
  cleanups.push(() => gw.close());
  return { up, gw };
}

const OVERRIDES: [string, string][] = [
  ['X-Original-URL', '/payments/a'],
  ['X-Rewrite-URL', '/payments/b'],
  ['X-HTTP-Method-Override', 'DELETE'],
  ['X-HTTP-Method', 'PUT'],
  ['X-Method-Override', 'PATCH'],
  // CGI-style stacks read `_` as `-` (both are HTTP_X_ORIGINAL_URL).
  ['X_Original_URL', '/payments/c'],
  ['x-http_method-OVERRIDE', 'DELETE'],
];
const OVERRIDE_NAMES = OVERRIDES.map(([n]) => n.toLowerCase());

function forwardedOverrides(up: FakeUpstream): string[] {
  return Object.keys(up.calls.at(-1)!.headers).filter((n) => OVERRIDE_NAMES.includes(n));
}

describe('override headers', () => {
  it('Node (undici forwarder): none reaches the upstream; other headers do', async () => {
    const { up, gw } = await setup();
    const res = await rawRequest(gw.url, { path: '/other/x', headers: [...OVERRIDES, ['X-Keep', 'yes'], ['Content-Type', 'application/json']], body: '{}' });
    expect(res.status).toBe(201);
    expect(up.calls).toHaveLength(1);
    expect(up.calls[0]!.url).toBe('/other/x');
    expect(up.calls[0]!.method).toBe('POST');
    expect(forwardedOverrides(up)).toEqual([]);
    expect(up.calls[0]!.headers['x-keep']).toBe('yes');
  });

  it('Hono app with the fetch forwarder (the Workers forwarder): the same', async () => {
    const up = await startUpstream();
    cleanups.push(() => up.close());
    // The Hono app alone (as on Workers), its store in memory: only the forwarder matters here.
    const g = createGateway({
      config: parseConfig({ routes: routes(up.url) }),
      store: new SqliteGatewayStore({ path: ':memory:' }),
      forwarder: createFetchForwarder(),
      env: {},
    });
    cleanups.push(() => g.close());
    const res = await g.app.request('/other/x', {
      method: 'POST',
      headers: [...OVERRIDES, ['X-Keep', 'yes'], ['Content-Type', 'application/json']],
      body: '{}',
    });
    expect(res.status).toBe(201);
    expect(forwardedOverrides(up)).toEqual([]);
    expect(up.calls[0]!.headers['x-keep']).toBe('yes');
  });

  it('a route that names some in allowOverrides forwards those (any case), and still strips the rest', async () => {
    const { up, gw } = await setup({ allowOverrides: ['x-http-method-override', 'X-Original-URL'] });
    const res = await rawRequest(gw.url, { path: '/other/x', headers: [...OVERRIDES, ['Content-Type', 'application/json']], body: '{}' });
    expect(res.status).toBe(201);
    expect(forwardedOverrides(up).sort()).toEqual(['x-http-method-override', 'x-http_method-override', 'x-original-url', 'x_original_url']);
    // Only the route that allows them: the fenced route still strips all.
    const fenced = await rawRequest(gw.url, {
      path: '/payments/x',
      headers: [...OVERRIDES, ['Content-Type', 'application/json'], ['X-Execution-Fence', '1'], ['X-Fence-Entity', 'e'], ['Idempotency-Key', 'k']],
      body: '{}',
    });
    expect(fenced.status).toBe(201);
    expect(forwardedOverrides(up)).toEqual([]);
  });
});

describe('a _method query parameter', () => {
  const REFUSED = [
    '?_method=DELETE',
    '?a=1&_method=PUT',
    '?%5Fmethod=PUT',
    '?_%6Dethod=PUT',
    '?_METHOD=PUT',
    '?_method[]=PUT',
    '?.method=PUT',
    '?+_method=PUT',
    '?%20_method=PUT',
    '?_method%00x=PUT',
    '?a=1;_method=PUT',
    '?_method',
  ];

  it.each(REFUSED)('POST /other/x%s: 400 invalid-request, not forwarded, nothing stored', async (query) => {
    const { up, gw } = await setup();
    const before = snapshot(gw.sqlite);
    const res = await fetch(`${gw.url}/other/x${query}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    const body = await expectProblem(res, 400, 'invalid-request');
    expect(body.detail).toContain('_method');
    expect(up.calls).toHaveLength(0);
    expect(snapshot(gw.sqlite)).toBe(before);
  });

  it('control: parameters that are not _method are forwarded as sent', async () => {
    const { up, gw } = await setup();
    for (const query of ['?method=DELETE', '?x_method=1', '?_methods=1', '?+method=1', '?a=_method', '?q=%5Fmethod']) {
      const res = await fetch(`${gw.url}/other/x${query}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
      expect(res.status, query).toBe(201);
      expect(up.calls.at(-1)!.url).toBe(`/other/x${query}`);
    }
  });

  it('a route with "_method" in allowOverrides forwards it as sent', async () => {
    const { up, gw } = await setup({ allowOverrides: ['_method'] });
    const res = await fetch(`${gw.url}/other/x?_method=DELETE`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    expect(res.status).toBe(201);
    expect(up.calls[0]!.url).toBe('/other/x?_method=DELETE');
  });
});

describe('a _method field in a POST body (Rails, Symfony, Laravel read it there)', () => {
  const MULTIPART = (name: string) =>
    `--b\r\nContent-Disposition: form-data; name="amount"\r\n\r\n1\r\n--b\r\nContent-Disposition: form-data; ${name}\r\n\r\nDELETE\r\n--b--\r\n`;
  const REFUSED: [string, string | null, string][] = [
    ['form', 'application/x-www-form-urlencoded', '_method=DELETE'],
    ['form, after another field, any case', 'application/x-www-form-urlencoded; charset=utf-8', 'a=1&_METHOD=put'],
    ['form, encoded name', 'Application/X-WWW-Form-Urlencoded', 'a=1&%5Fmethod=PUT'],
    ['form, PHP array name', 'application/x-www-form-urlencoded', '_method[]=PUT'],
    ['no Content-Type (Rack reads a form)', null, '_method=DELETE'],
    ['multipart, quoted name', 'multipart/form-data; boundary=b', MULTIPART('name="_method"')],
    ['multipart, bare name', 'multipart/form-data; boundary=b', MULTIPART('name=_method')],
    ['multipart, .method (PHP reads _method)', 'multipart/form-data; boundary=b', MULTIPART('name=".method"')],
    ['JSON (Laravel)', 'application/json', '{"amount":1,"_method":"DELETE"}'],
    ['JSON, escaped name', 'application/json', '{"\\u005fmethod":"DELETE"}'],
    ['+json', 'application/vnd.api+json', '{"_method":"PATCH"}'],
  ];

  it.each(REFUSED)('%s: 400 invalid-request, not forwarded, nothing stored', async (_label, type, body) => {
    const { up, gw } = await setup();
    const before = snapshot(gw.sqlite);
    const res = await rawRequest(gw.url, { path: '/other/x', headers: type === null ? [] : [['Content-Type', type]], body });
    expect(res.status).toBe(400);
    expect(res.headers['content-type']).toBe('application/problem+json');
    const problem = JSON.parse(res.text);
    expect(problem.type).toMatch(/\/invalid-request$/);
    expect(problem.detail).toContain('"_method" field');
    expect(up.calls).toHaveLength(0);
    expect(snapshot(gw.sqlite)).toBe(before);
  });

  it('the fenced route too, and the Hono app alone (the Workers path)', async () => {
    const { up, gw } = await setup();
    const fenced = await rawRequest(gw.url, {
      path: '/payments/x',
      headers: [
        ['Content-Type', 'application/x-www-form-urlencoded'],
        ['X-Execution-Fence', '1'],
        ['X-Fence-Entity', 'e'],
        ['Idempotency-Key', 'k'],
      ],
      body: '_method=DELETE',
    });
    expect(fenced.status).toBe(400);
    expect(up.calls).toHaveLength(0);
    const g = createGateway({
      config: parseConfig({ routes: routes(up.url) }),
      store: new SqliteGatewayStore({ path: ':memory:' }),
      forwarder: createFetchForwarder(),
      env: {},
    });
    cleanups.push(() => g.close());
    const res = await g.app.request('/other/x', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"_method":"DELETE"}' });
    expect(res.status).toBe(400);
    expect(up.calls).toHaveLength(0);
  });

  it('control: bodies where no framework reads _method as the method are forwarded as sent', async () => {
    const { up, gw } = await setup({ match: { path: '/other/*', methods: ['POST', 'PUT'] } });
    const FORWARDED: [string | null, string, string?][] = [
      ['application/json', '{"amount":1,"nested":{"_method":"DELETE"}}'],
      ['application/json', '[{"_method":"DELETE"}]'],
      ['application/json', '{"method":"DELETE","x_method":1,"payment_method":"pm_1"}'],
      ['application/x-www-form-urlencoded', 'method=DELETE&a=_method&_methods=1'],
      ['text/plain', '_method=DELETE'],
      ['multipart/form-data; boundary=b', MULTIPART('name="file"; filename="_method"')],
      // Every framework overrides POST only.
      ['application/x-www-form-urlencoded', '_method=DELETE', 'PUT'],
    ];
    for (const [type, body, method] of FORWARDED) {
      const res = await rawRequest(gw.url, { method: method ?? 'POST', path: '/other/x', headers: type === null ? [] : [['Content-Type', type]], body });
      expect(res.status, `${type} ${body}`).toBe(201);
      expect(up.calls.at(-1)!.method).toBe(method ?? 'POST');
      expect(up.calls.at(-1)!.body.toString(), `${type} ${body}`).toBe(body);
    }
  });

  it('a coded body (Content-Encoding gzip) of a type the scan reads is refused, since a server that decodes it may find _method; control: identity, another type, PUT, and allowOverrides are forwarded', async () => {
    const { up, gw } = await setup({ match: { path: '/other/*', methods: ['POST', 'PUT'] } });
    const zipped = gzipSync('_method=DELETE');
    for (const [type, coding] of [
      ['application/x-www-form-urlencoded', 'gzip'],
      ['application/json', 'br'],
      [null, 'identity, gzip'],
      ['multipart/form-data; boundary=b', 'deflate'],
    ] as const) {
      const before = snapshot(gw.sqlite);
      const res = await rawRequest(gw.url, {
        path: '/other/x',
        headers: [...(type === null ? [] : [['Content-Type', type] as [string, string]]), ['Content-Encoding', coding]],
        body: zipped,
      });
      expect(res.status, `${type} ${coding}`).toBe(400);
      const problem = JSON.parse(res.text);
      expect(problem.type).toMatch(/\/invalid-request$/);
      expect(problem.detail).toContain('Content-Encoding');
      expect(snapshot(gw.sqlite)).toBe(before);
    }
    expect(up.calls).toHaveLength(0);
    const FORWARDED: [string, string, string][] = [
      ['application/x-www-form-urlencoded', 'identity', 'POST'],
      ['text/plain', 'gzip', 'POST'],
      ['application/json', 'gzip', 'PUT'],
    ];
    for (const [type, coding, method] of FORWARDED) {
      const res = await rawRequest(gw.url, {
        method,
        path: '/other/x',
        headers: [
          ['Content-Type', type],
          ['Content-Encoding', coding],
        ],
        body: coding === 'identity' ? 'a=1' : zipped,
      });
      expect(res.status, `${type} ${coding} ${method}`).toBe(201);
    }
    const { up: up2, gw: allowed } = await setup({ allowOverrides: ['_method'] });
    const res = await rawRequest(allowed.url, {
      path: '/other/x',
      headers: [
        ['Content-Type', 'application/x-www-form-urlencoded'],
        ['Content-Encoding', 'gzip'],
      ],
      body: zipped,
    });
    expect(res.status).toBe(201);
    expect(up2.calls[0]!.body.equals(zipped)).toBe(true);
  });

  it('a route with "_method" in allowOverrides forwards such a body as sent', async () => {
    const { up, gw } = await setup({ allowOverrides: ['_method'] });
    const res = await rawRequest(gw.url, { path: '/other/x', headers: [['Content-Type', 'application/x-www-form-urlencoded']], body: '_method=DELETE' });
    expect(res.status).toBe(201);
    expect(up.calls[0]!.body.toString()).toBe('_method=DELETE');
  });
});

describe('allowOverrides in the config', () => {
  it('a name that is not an override field stops start-up, naming the field and the choices', () => {
    const route = { ...routes('http://127.0.0.1:9')[1]!, allowOverrides: ['X-Forwarded-Host'] };
    expect(() => parseConfig({ routes: [route] })).toThrow(ConfigError);
    expect(() => parseConfig({ routes: [route] })).toThrow(
      /allowOverrides.*must be one of X-Original-URL, X-Rewrite-URL, X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override, _method/s,
    );
  });

  it('a key header that is an override header is refused at start-up (it would not reach the upstream), unless allowed', () => {
    const route = paymentsRoute('http://127.0.0.1:9', { idempotencyHeader: 'X-Method-Override' });
    expect(() => parseConfig({ routes: [route] })).toThrow(/X-Method-Override.*override header/s);
    expect(parseConfig({ routes: [{ ...route, allowOverrides: ['X-Method-Override'] }] }).routes[0]!.idempotencyHeader).toBe('X-Method-Override');
  });

  it('defaults to none', () => {
    expect(parseConfig({ routes: routes('http://127.0.0.1:9') }).routes[1]!.allowOverrides).toEqual([]);
  });
});
