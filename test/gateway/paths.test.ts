import { getRequestListener } from '@hono/node-server';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { createUndiciForwarder } from '../../src/http/forward-undici.js';
import { createGateway, type Gateway } from '../../src/http/gateway.js';
import { alternativeReadings, MAX_READING_CHARS, normalizePath, readingsWithin, removeDotSegments } from '../../src/http/path.js';
import { createFoldedRouter, createRouter, divergentReading } from '../../src/http/router.js';
import { SqliteGatewayStore } from '../../src/store/sqlite/gateway-store.js';
import { paymentsRoute, snapshot, startTestGateway, tempDir, type RouteInput, type TestGateway } from '../helpers/gateway.js';
import { hsAuth, token } from '../auth/tokens.js';
import { rawRequest } from '../helpers/raw-http.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// One route decision per path (DESIGN §3 step 1): the gateway routes and
// forwards the RFC 3986 §6.2.2 normal form, and refuses a path that an
// upstream could read another way that another route would take. Every
// request goes in three ways: raw bytes to the Node listener (startTestGateway,
// `gateway.direct`), raw bytes to the Hono app under @hono/node-server, and
// `gateway.app.request()` (Hono without a socket, as on Workers). Raw sockets,
// because fetch and undici would normalise the very paths under test.

const ROUTES = (up: string): RouteInput[] => [
  paymentsRoute(up),
  paymentsRoute(up, { name: 'invoices', match: { path: '/invoices/:invoice/pay' }, entity: { path: ':invoice' } }),
  paymentsRoute(up, { name: 'tickets', match: { path: '/tickets/*' } }),
  // A broader route with no fence: where a path that skipped /payments/* would land.
  { name: 'rest', match: { path: '/*', methods: ['POST'] }, upstream: up, fence: 'off', idempotency: 'off', mode: 'concurrent' },
];

interface Way {
  name: 'node' | 'hono-server' | 'hono-request';
  up: FakeUpstream;
  store: SqliteGatewayStore;
  send(path: string, headers?: [string, string][], body?: string, method?: string): Promise<{ status: number; type: string | undefined; body: any }>;
}

const ways: Way[] = [];
const cleanups: (() => Promise<void> | void)[] = [];

beforeAll(async () => {
  // Node listener.
  {
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const gw: TestGateway = await startTestGateway({ routes: ROUTES(up.url) });
    cleanups.push(() => gw.close());
    ways.push({ name: 'node', up, store: gw.sqlite, send: rawSender(gw.url) });
  }
  // Hono: one gateway, served by @hono/node-server and called with app.request().
  for (const name of ['hono-server', 'hono-request'] as const) {
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const tmp = tempDir();
    cleanups.push(() => tmp.cleanup());
    const config = parseConfig({ listen: { host: '127.0.0.1', port: 0 }, store: { sqlite: `${tmp.dir}/g.db`, synchronous: 'NORMAL' }, routes: ROUTES(up.url) });
    const store = new SqliteGatewayStore({ path: `${tmp.dir}/g.db`, synchronous: 'NORMAL' });
    const gateway: Gateway = createGateway({ config, store, forwarder: createUndiciForwarder(), env: {} });
    cleanups.push(() => gateway.close());
    if (name === 'hono-server') {
      const server = createServer(getRequestListener(gateway.app.fetch));
      await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
      cleanups.push(() => new Promise<void>((r) => server.close(() => r())));
      ways.push({ name, up, store, send: rawSender(`http://127.0.0.1:${(server.address() as AddressInfo).port}`) });
    } else {
      ways.push({
        name,
        up,
        store,
        async send(path, headers = [], body = '{"amount":1}', method = 'POST') {
          // A full URL: app.request() would merge the slashes of a bare path.
          const res = await gateway.app.request(`http://gateway.test${path}`, { method, headers, ...(method === 'GET' ? {} : { body }) });
          const text = await res.text();
          return { status: res.status, type: res.headers.get('content-type') ?? undefined, body: parse(text) };
        },
      });
    }
  }
});

afterAll(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function rawSender(url: string): Way['send'] {
  return async (path, headers = [], body = '{"amount":1}', method = 'POST') => {
    const res = await rawRequest(url, { method, path, headers, ...(method === 'GET' ? {} : { body }) });
    return { status: res.status, type: res.headers['content-type'], body: parse(res.text) };
  };
}

function parse(text: string): any {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

let n = 0;
/** A complete command: a fresh key and a higher fence each time, so only the path can decide. */
const fenced = (): [string, string][] => {
  n++;
  return [
    ['X-Execution-Fence', String(n)],
    ['X-Fence-Entity', 'acct-1'],
    ['Idempotency-Key', `k-${n}`],
    ['Content-Type', 'application/json'],
  ];
};

describe('the path is routed and forwarded in normal form (RFC 3986 §6.2.2)', () => {
  it('negative control: on the raw path, /%70ayments/a and /payments%2Fa would be the unfenced catch-all route', () => {
    const config = parseConfig({ routes: ROUTES('http://127.0.0.1:1') });
    const raw = createRouter(config.routes);
    expect(raw('POST', '/%70ayments/a')?.route.name).toBe('rest');
    expect(raw('POST', '/payments%2Fa')?.route.name).toBe('rest');
    expect(raw('POST', '/payments;/a')?.route.name).toBe('rest');
    expect(raw('POST', '/payments/a')?.route.name).toBe('payments');
  });

  it('an encoded unreserved character takes the route it spells, fenced; the upstream receives the normal form', async () => {
    for (const way of ways) {
      const before = snapshot(way.store);
      const calls = way.up.calls.length;
      // No fence: the payments route's refusal, not the catch-all's forward.
      const refused = await way.send('/%70ayments/a', [['Content-Type', 'application/json']]);
      expect(refused.status, way.name).toBe(400);
      expect(refused.type, way.name).toBe('application/problem+json');
      expect(refused.body.type, way.name).toMatch(/\/missing-fence$/);
      expect(way.up.calls.length, way.name).toBe(calls);
      expect(snapshot(way.store), way.name).toBe(before);

      const ok = await way.send('/%70%61yments/%63h%41rge%7e?x=%2f', fenced());
      expect(ok.status, way.name).toBe(201);
      expect(way.up.calls.at(-1)!.url, way.name).toBe('/payments/chArge~?x=%2f');
      expect(way.up.calls.at(-1)!.fence, way.name).toBe(String(n));
    }
  });

  it('the hex of other percent-encodings is upper-cased; an encoded slash inside the wildcard keeps the route', async () => {
    for (const way of ways) {
      const ok = await way.send('/payments/caf%c3%a9%2fx', fenced());
      expect(ok.status, way.name).toBe(201);
      expect(way.up.calls.at(-1)!.url, way.name).toBe('/payments/caf%C3%A9%2Fx');
    }
  });

  it('path parameters that do not change the route are forwarded as they are', async () => {
    for (const way of ways) {
      const ok = await way.send('/payments/a;v=1', fenced());
      expect(ok.status, way.name).toBe(201);
      expect(way.up.calls.at(-1)!.url, way.name).toBe('/payments/a;v=1');
    }
  });

  it('control: the catch-all route forwards without a fence (what a skipped route would have got)', async () => {
    for (const way of ways) {
      const ok = await way.send('/other/a', []);
      expect(ok.status, way.name).toBe(201);
      expect(way.up.calls.at(-1)!.url, way.name).toBe('/other/a');
      expect(way.up.calls.at(-1)!.fence, way.name).toBeNull();
    }
  });
});

describe('a path that another reading would route elsewhere: 400 invalid-request, nothing forwarded, nothing stored', () => {
  const AMBIGUOUS = [
    '/payments%2Fa', // %2F decoded to a separator: /payments/a
    '/payments%2fa',
    '/%70ayments%2Fa',
    '/payments%5Ca', // %5C taken for a separator
    '/payments;/a', // ;params dropped (servlet containers)
    '/payments;jsessionid=1/a',
    '/payments/..;/other', // /payments/.. ;-stripped resolves to /other (Tomcat)
    '//payments/a', // merged slashes (nginx)
    '/invoices/inv;x/pay', // same route, other parameter (inv)
    '/invoices/inv-1/pay/', // a trailing slash dropped (Express, most frameworks): the invoices route
    '/Payments/a', // case folded (Express by default, ASP.NET, IIS): the payments route
    '/INVOICES/inv-1/pay',
    '/payments%252Fcharges', // decoded twice: %2F, then a separator
    '/other/%252e%252e/payments/charges', // decoded twice: .., resolved
    '/payments./charges', // trailing dots dropped from a segment (IIS, Windows names)
    '/payments%20/charges', // trailing spaces too
    '/payments.%20./charges',
    '/invoices/inv-1./pay', // same route, other parameter (inv-1)
    '/PAYMENT%C5%BF/charges', // ſ (U+017F) folds to s: /PAYMENTS, case-insensitively /payments
    '/payment%C5%BF/charges',
    '/tic%E2%84%AAets/a', // the Kelvin sign folds to k
    '/%EF%BD%90ayments/charges', // fullwidth p (NFKC, Windows best-fit)
    '/%EF%BC%B0%EF%BC%A1%EF%BC%B9MENTS/charges', // fullwidth PAY, then case
    '/payments%EF%BC%8Fcharges', // fullwidth solidus: a separator once normalised
    '/%EF%BD%89nvoices/inv-1/pay',
    '/payments%u002Fcharges', // %uXXXX decoded (IIS, classic ASP.NET): %2F, then a separator
    '/%u0070ayments/charges', // %u0070 is p
    '/other/%u002e%u002e/payments/charges', // .., resolved
    '/PAYMENT%u017F/charges', // ſ, then folded
  ];
  it.each(AMBIGUOUS)('%s', async (path) => {
    for (const way of ways) {
      const before = snapshot(way.store);
      const calls = way.up.calls.length;
      const res = await way.send(path, fenced());
      expect(res.status, `${way.name} ${path}`).toBe(400);
      expect(res.type, way.name).toBe('application/problem+json');
      expect(res.body.type, way.name).toMatch(/\/invalid-request$/);
      expect(way.up.calls.length, `${way.name} ${path}`).toBe(calls);
      expect(snapshot(way.store), way.name).toBe(before);
    }
  });

  it('control: ordinary paths with dots, spaces, non-ASCII letters or %25 that no reading moves to another route are forwarded in normal form', async () => {
    const OK: [string, string][] = [
      ['/payments/a.json', '/payments/a.json'],
      ['/payments/charge.', '/payments/charge.'],
      ['/payments/caf%c3%a9', '/payments/caf%C3%A9'],
      ['/payments/100%25', '/payments/100%25'],
      ['/payments/a%252Fb', '/payments/a%252Fb'],
      ['/payments/%C5%BF', '/payments/%C5%BF'],
      ['/invoices/inv.1/pay', '/invoices/inv.1/pay'],
      ['/payments/x%u0041', '/payments/x%u0041'],
    ];
    for (const way of ways) {
      for (const [path, forwarded] of OK) {
        const res = await way.send(path, fenced());
        expect(res.status, `${way.name} ${path}`).toBe(201);
        expect(way.up.calls.at(-1)!.url, `${way.name} ${path}`).toBe(forwarded);
      }
      // And on the unfenced catch-all, readings that stay on it.
      for (const path of ['/other/v1.', '/other/%C5%BF', '/other/%EF%BD%90', '/other/a%2520b']) {
        const res = await way.send(path, []);
        expect(res.status, `${way.name} ${path}`).toBe(201);
      }
    }
  });

  it('a raw backslash in the path (a separator to URL parsing, a character to many upstreams): refused on Node, as problem+json by the listener', async () => {
    for (const path of ['/payments\\a', '/payments/a\\b']) {
      for (const way of ways.filter((w) => w.name !== 'hono-request')) {
        const before = snapshot(way.store);
        const calls = way.up.calls.length;
        const res = await way.send(path, fenced());
        expect(res.status, `${way.name} ${path}`).toBe(400);
        // The Node entry answers in the contract's format; the bare Hono app under @hono/node-server refuses it itself.
        if (way.name === 'node') expect(res.body.type, way.name).toMatch(/\/invalid-request$/);
        expect(way.up.calls.length, way.name).toBe(calls);
        expect(snapshot(way.store), way.name).toBe(before);
      }
    }
  });

  it('control: a backslash in the query is no path: forwarded as sent', async () => {
    const way = ways.find((w) => w.name === 'node')!;
    const res = await way.send('/payments/a?q=\\', fenced());
    expect(res.status).toBe(201);
    expect(way.up.calls.at(-1)!.url).toBe('/payments/a?q=\\');
  });
});

describe('the cost of the readings is bounded (MAX_READING_CHARS): a path with too many, too long, is 400 unread', () => {
  // Every kind of ambiguity in each segment, repeated to ~8 KB: 191
  // readings of 8 KB each (~45 ms of the event loop per request unbounded).
  const SEGMENT = '/a./b%20/c%252F%5C;x//%EF%BD%90/';
  const hostile = `/payments${SEGMENT.repeat(Math.floor(8000 / SEGMENT.length))}`;

  it('the crafted path: refused with the bound named, nothing forwarded, nothing stored', async () => {
    expect(hostile.length).toBeGreaterThan(7900);
    for (const way of ways) {
      const before = snapshot(way.store);
      const calls = way.up.calls.length;
      const res = await way.send(hostile, fenced());
      expect(res.status, way.name).toBe(400);
      expect(res.type, way.name).toBe('application/problem+json');
      expect(res.body.type, way.name).toMatch(/\/invalid-request$/);
      expect(res.body.detail, way.name).toContain(`bound of ${MAX_READING_CHARS} characters`);
      expect(way.up.calls.length, way.name).toBe(calls);
      expect(snapshot(way.store), way.name).toBe(before);
    }
  });

  it('control: an 8 KB path with few readings, and the crafted segment once, are checked and forwarded as before', async () => {
    for (const way of ways) {
      const long = `/payments/${'x'.repeat(8000)}/a%2Fb;v=1`;
      const res = await way.send(long, fenced());
      expect(res.status, way.name).toBe(201);
      expect(way.up.calls.at(-1)!.url, way.name).toBe(long);
      // One copy of the segment: every reading computed, and one of them is another route's.
      const once = await way.send(`/other${SEGMENT}`, []);
      expect(once.status, way.name).toBe(201);
    }
  });

  it('readingsWithin (unit): the same readings under the bound, null past it', () => {
    const short = normalizePath(`/a${SEGMENT}`);
    expect(readingsWithin(short)).toEqual(alternativeReadings(short));
    expect(readingsWithin(short)!.length).toBeGreaterThan(100);
    expect(readingsWithin(short, short.length * 10)).toBeNull();
    expect(readingsWithin(normalizePath(hostile))).toBeNull();
    expect(alternativeReadings(normalizePath(hostile)).length).toBe(191);
  });
});

describe('the admin prefix: the same decision on both ways in', () => {
  it.each(['/_fencegate/health', '/%5Ffencegate/health', '/%5ffencegate/health', '/_fencegat%65/health'])(
    '%s is the admin API, never proxied',
    async (path) => {
      for (const way of ways) {
        const calls = way.up.calls.length;
        const res = await way.send(path, [], '', 'GET');
        expect(res.status, `${way.name} ${path}`).toBe(200);
        expect(res.body, way.name).toEqual({ status: 'ok' });
        // POST is routed by the catch-all for any other path: not for these.
        const post = await way.send(path, []);
        expect(post.status, `${way.name} POST ${path}`).not.toBe(201);
        expect(way.up.calls.length, way.name).toBe(calls);
      }
    },
  );
});

describe('the proxy never takes an admin path, whoever hands it one', () => {
  it('gateway.direct with /_fencegate/… (or an encoding of it) and a catch-all route: 404 no-route, not forwarded', async () => {
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const tmp = tempDir();
    cleanups.push(() => tmp.cleanup());
    const config = parseConfig({ store: { sqlite: `${tmp.dir}/g.db`, synchronous: 'NORMAL' }, routes: ROUTES(up.url) });
    const gateway = createGateway({
      config,
      store: new SqliteGatewayStore({ path: `${tmp.dir}/g.db`, synchronous: 'NORMAL' }),
      forwarder: createUndiciForwarder(),
      env: {},
    });
    cleanups.push(() => gateway.close());
    const direct = (pathname: string) =>
      gateway.direct!({
        method: 'POST',
        pathname,
        search: '',
        headers: new Headers({ 'content-type': 'application/json' }),
        body: null,
        signal: new AbortController().signal,
      });
    for (const path of ['/_fencegate/v1/rejections', '/%5Ffencegate/v1/rejections', '/_fencegate']) {
      const reply = await direct(path);
      expect(reply.status, path).toBe(404);
      expect(JSON.parse(String(reply.body)).type).toMatch(/\/no-route$/);
    }
    expect(up.calls).toHaveLength(0);
    // Control: a path beside the prefix is the catch-all's.
    expect((await direct('/_fencegatex/a')).status).toBe(201);
  });
});

describe('caller auth decides on the same route as the proxy', () => {
  it('/%70ayments/a without a token is 401, not forwarded: the auth step routes the normal form too', async () => {
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const gw = await startTestGateway({ routes: [paymentsRoute(up.url)], config: { auth: hsAuth() } });
    cleanups.push(() => gw.close());
    for (const path of ['/%70ayments/a', '/payments/%61']) {
      const res = await rawRequest(gw.url, { path, headers: fenced(), body: '{}' });
      expect(res.status, path).toBe(401);
      expect(JSON.parse(res.text).type).toMatch(/\/unauthorized$/);
    }
    expect(up.calls).toHaveLength(0);
    // Control: with a token the same path is routed, fenced and forwarded in normal form.
    const ok = await rawRequest(gw.url, { path: '/%70ayments/a', headers: [...fenced(), ['Authorization', `Bearer ${await token()}`]], body: '{}' });
    expect(ok.status).toBe(201);
    expect(up.calls[0]!.url).toBe('/payments/a');
  });
});

describe('normalizePath, alternativeReadings (unit)', () => {
  it('decodes unreserved characters only, upper-cases the rest, never decodes twice', () => {
    expect(normalizePath('/%70ayments/%41%5a%61%7a%30%39%2d%2e%5f%7e')).toBe('/payments/AZaz09-._~');
    expect(normalizePath('/a%2fb%3a%25%c3%a9')).toBe('/a%2Fb%3A%25%C3%A9');
    expect(normalizePath('/a%252e')).toBe('/a%252e');
    expect(normalizePath('/a%zz%4')).toBe('/a%zz%4');
    expect(normalizePath('/payments/x')).toBe('/payments/x');
  });

  it('removes the dot segments decoding produced (RFC 3986 §5.2.4)', () => {
    expect(normalizePath('/payments/%2E%2E/admin')).toBe('/admin');
    expect(normalizePath('/a/%2e/b')).toBe('/a/b');
    expect(removeDotSegments('/a/b/..')).toBe('/a/');
    expect(removeDotSegments('/..')).toBe('/');
    expect(removeDotSegments('/a/.hidden/..x')).toBe('/a/.hidden/..x');
  });

  it('lists the readings an upstream might apply, alone and combined', () => {
    expect(alternativeReadings('/payments/a')).toEqual([]);
    expect(alternativeReadings('/payments%2Fa')).toEqual(['/payments/a']);
    expect(new Set(alternativeReadings('/a%2Fb;x/c'))).toEqual(new Set(['/a/b;x/c', '/a%2Fb/c', '/a/b/c']));
    expect(new Set(alternativeReadings('//a;x'))).toEqual(new Set(['//a', '/a;x', '/a']));
    // A trailing slash dropped (Express and most frameworks ignore it); never added.
    expect(alternativeReadings('/payments/a/')).toEqual(['/payments/a']);
    expect(alternativeReadings('/')).toEqual([]);
  });

  it('decoding twice, trailing dots and spaces, and Unicode folding are readings too (combined with the others)', () => {
    expect(alternativeReadings('/payments%252Fcharges')).toEqual(expect.arrayContaining(['/payments%2Fcharges', '/payments/charges']));
    expect(alternativeReadings('/other/%252e%252e/payments/charges')).toContain('/payments/charges');
    expect(alternativeReadings('/payments./charges')).toEqual(['/payments/charges']);
    expect(alternativeReadings('/payments%20/charges')).toEqual(['/payments/charges']);
    expect(alternativeReadings('/a/.../b')).toEqual(expect.arrayContaining(['/a//b', '/a/b']));
    expect(alternativeReadings('/payment%C5%BF/a')).toEqual(['/payments/a']);
    expect(alternativeReadings('/tic%E2%84%AAets/a')).toEqual(['/ticKets/a']);
    expect(alternativeReadings('/%EF%BD%90ayments%EF%BC%8Fa')).toEqual(expect.arrayContaining(['/payments/a']));
    // Dotless i upper-cases to I; é has no ASCII form and stays as it is.
    expect(alternativeReadings('/%C4%B1nvoices')).toEqual(['/Invoices']);
    expect(alternativeReadings('/caf%C3%A9')).toEqual([]);
    expect(alternativeReadings('/payments%u002Fa')).toEqual(['/payments%2Fa', '/payments/a']);
    expect(alternativeReadings('/%u0070ayments/a')).toEqual(['/payments/a']);
    expect(alternativeReadings('/x%uD800')).toEqual(['/x%EF%BF%BD']);
    expect(alternativeReadings('/x%u00')).toEqual([]);
    expect(alternativeReadings('/a%ZZ%C5')).toEqual([]);
  });

  it('negative control: without these readings the router sends such spellings to the unfenced catch-all, and case folding of the path alone does not object', () => {
    const routes = parseConfig({ routes: ROUTES('http://127.0.0.1:1') }).routes;
    const router = createRouter(routes);
    const folded = createFoldedRouter(routes);
    for (const path of [
      '/payments%252Fcharges',
      '/other/%252e%252e/payments/charges',
      '/payments./charges',
      '/payments%20/charges',
      '/payment%C5%BF/charges',
      '/tic%E2%84%AAets/a',
      '/%EF%BD%90ayments/charges',
    ]) {
      const m = router('POST', path)!;
      expect(m.route.name, path).toBe('rest');
      expect(divergentReading(router, 'POST', m, [], folded, path), path).toBeNull();
      expect(divergentReading(router, 'POST', m, alternativeReadings(path), folded, path), path).not.toBeNull();
    }
  });

  it('case: a path another route takes once folded is refused, a parameter keeps its case; negative control: without the folded router it passes', () => {
    const routes = parseConfig({ routes: ROUTES('http://127.0.0.1:1') }).routes;
    const router = createRouter(routes);
    const folded = createFoldedRouter(routes);
    const upper = router('POST', '/Payments/a')!;
    expect(upper.route.name).toBe('rest');
    expect(divergentReading(router, 'POST', upper, alternativeReadings('/Payments/a'), folded, '/Payments/a')).toBe('/payments/a');
    expect(divergentReading(router, 'POST', upper, alternativeReadings('/Payments/a'))).toBeNull();
    // The trailing slash: the catch-all takes /invoices/inv-1/pay/ here, an upstream the invoices route.
    const slashed = router('POST', '/invoices/inv-1/pay/')!;
    expect(slashed.route.name).toBe('rest');
    expect(divergentReading(router, 'POST', slashed, alternativeReadings('/invoices/inv-1/pay/'))).toBe('/invoices/inv-1/pay');
    expect(divergentReading(router, 'POST', slashed, [])).toBeNull();
    const id = router('POST', '/invoices/INV-1/pay')!;
    expect(id.params).toEqual({ invoice: 'INV-1' });
    expect(divergentReading(router, 'POST', id, alternativeReadings('/invoices/INV-1/pay'), folded, '/invoices/INV-1/pay')).toBeNull();
  });

  it('an encoded slash inside a parameter is accepted while no route takes the decoded path', () => {
    const withoutCatchAll = createRouter(parseConfig({ routes: ROUTES('http://127.0.0.1:1').slice(0, 2) }).routes);
    const m = withoutCatchAll('POST', '/invoices/inv%2F10/pay')!;
    expect(m.params).toEqual({ invoice: 'inv/10' });
    expect(divergentReading(withoutCatchAll, 'POST', m, alternativeReadings('/invoices/inv%2F10/pay'))).toBeNull();
    const withCatchAll = createRouter(parseConfig({ routes: ROUTES('http://127.0.0.1:1') }).routes);
    expect(divergentReading(withCatchAll, 'POST', withCatchAll('POST', '/invoices/inv%2F10/pay')!, alternativeReadings('/invoices/inv%2F10/pay'))).toBe(
      '/invoices/inv/10/pay',
    );
  });
});
