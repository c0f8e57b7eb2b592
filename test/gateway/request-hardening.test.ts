import Database from 'better-sqlite3';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { duplicateOnPointerPath } from '../../src/core/json-duplicates.js';
import { fingerprint } from '../../src/core/fingerprint.js';
import { createUndiciForwarder } from '../../src/http/forward-undici.js';
import { connectionTokens } from '../../src/http/forward.js';
import { createGateway } from '../../src/http/gateway.js';
import { createJsonLogger } from '../../src/http/logger.js';
import { SqliteGatewayStore } from '../../src/store/sqlite/gateway-store.js';
import type { AdmitInput, GatewayStore } from '../../src/store/types.js';
import { bearer, hsAuth, token } from '../auth/tokens.js';
import {
  command,
  effectOf,
  expectProblem,
  paymentsRoute,
  rejectionRows,
  snapshot,
  startTestGateway,
  tempDir,
  type RouteInput,
  type TestGateway,
} from '../helpers/gateway.js';
import { rawRequest } from '../helpers/raw-http.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// The request side, hardened: no query string kept anywhere, a Connection
// header cannot strip what the gateway decided with, a key cannot be replayed
// across entities, and a body that names its entity twice is refused. Real
// gateway server on loopback, real SQLite file, recording upstream.

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function upstream(): Promise<FakeUpstream> {
  const u = await startUpstream();
  cleanups.push(() => u.close());
  return u;
}

async function gateway(
  routes: RouteInput[],
  options: { config?: Record<string, unknown>; wrapStore?: (s: GatewayStore) => GatewayStore; dbPath?: string } = {},
): Promise<TestGateway & { logs: string[] }> {
  const logs: string[] = [];
  const gw = await startTestGateway({ routes, logger: createJsonLogger({ write: (l) => logs.push(l) }), ...options });
  cleanups.push(() => gw.close());
  return Object.assign(gw, { logs });
}

/** The database as bytes on disk (main file and WAL), and every row of every table read through a connection of its own. */
function onDisk(dbPath: string): string {
  const bytes = [dbPath, `${dbPath}-wal`].filter(existsSync).map((p) => readFileSync(p).toString('latin1'));
  const db = new Database(dbPath, { readonly: true });
  try {
    const tables = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all() as { name: string }[];
    const rows = tables.map(({ name }) =>
      JSON.stringify(db.prepare(`SELECT * FROM "${name}"`).safeIntegers(true).all(), (_k, v) =>
        typeof v === 'bigint' ? v.toString() : Buffer.isBuffer(v) ? v.toString('latin1') : v,
      ),
    );
    return [...bytes, ...rows].join('\n');
  } finally {
    db.close();
  }
}

describe('no query string is stored or logged', () => {
  it('refusals of a request with ?access_token=SECRET leave no SECRET in the rejection table, the audit API or the log lines', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], { config: { auth: hsAuth() } });
    const proxyToken = bearer(await token({ sub: 'billing' }));
    const q = '?access_token=SECRET-0123&x=1';

    // 401 from the auth middleware (security.ts), then the proxy's own refusals (its AuditInfo).
    await expectProblem(await command(gw.url, `/payments/charges${q}`, { fence: 1, entity: 'e', key: 'k0' }), 401, 'unauthorized');
    expect((await command(gw.url, '/payments/charges', { fence: 5, entity: 'e', key: 'k1', headers: proxyToken })).status).toBe(201);
    await expectProblem(await command(gw.url, `/payments/charges${q}`, { fence: 4, entity: 'e', key: 'k2', headers: proxyToken }), 409, 'stale-fence');
    await expectProblem(
      await command(gw.url, `/payments/charges${q}`, { fence: 5, entity: 'e', key: 'k1', headers: proxyToken, body: '{"amount":2}' }),
      422,
      'idempotency-key-reused',
    );
    // Control: a stored field (the key) does reach the disk, the audit API and the log, so the scans below can see what is there.
    await expectProblem(await command(gw.url, `/payments/charges${q}`, { fence: 3, entity: 'e', key: 'CANARY-7', headers: proxyToken }), 409, 'stale-fence');

    const rows = rejectionRows(gw.sqlite) as unknown as { reason: string; path: string }[];
    expect(rows.map((r) => r.reason)).toEqual(['unauthorized', 'stale-fence', 'idempotency-key-reused', 'stale-fence']);
    expect(rows.every((r) => r.path === '/payments/charges')).toBe(true);

    const auditToken = bearer(await token({ sub: 'auditor', scope: 'fencegate:audit' }));
    const audit: string[] = [];
    for (const accept of ['application/json', 'application/x-ndjson', 'text/csv']) {
      const res = await fetch(`${gw.url}/_fencegate/v1/rejections`, { headers: { ...auditToken, accept } });
      expect(res.status).toBe(200);
      audit.push(await res.text());
    }
    const disk = onDisk(gw.dbPath);
    const logs = gw.logs.join('\n');
    for (const [where, text] of [
      ['disk', disk],
      ['audit', audit.join('\n')],
      ['logs', logs],
    ] as const) {
      expect(text, where).toContain('CANARY-7');
      expect(text, where).not.toContain('SECRET');
      expect(text, where).not.toContain('access_token');
    }
    // The decision log names the path (without the query) of every refusal.
    expect(gw.logs.filter((l) => JSON.parse(l).msg === 'decision' && JSON.parse(l).path === '/payments/charges').length).toBeGreaterThanOrEqual(4);
  });

  it('the upstream still gets the query, and the fingerprint still covers it', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    expect((await command(gw.url, '/payments/charges?a=1', { fence: 1, entity: 'e', key: 'k' })).status).toBe(201);
    expect(up.calls[0]!.url).toBe('/payments/charges?a=1');
    await expectProblem(await command(gw.url, '/payments/charges?a=2', { fence: 1, entity: 'e', key: 'k' }), 422, 'idempotency-key-reused');
    expect(up.effects).toBe(1);
  });
});

describe('Connection cannot strip the fields the gateway decided with', () => {
  const CONNECTION = 'close, Idempotency-Key, Content-Type, X-Execution-Fence, X-Customer, X-Fence-Entity, Content-Encoding, X-Drop-Me';
  const route = (up: string) => paymentsRoute(up, { entity: { header: 'X-Customer' } });
  const headers: [string, string][] = [
    ['Connection', CONNECTION],
    ['X-Execution-Fence', '3'],
    ['X-Customer', 'cust:A'],
    ['Idempotency-Key', 'key-1'],
    ['Content-Type', 'application/json'],
    ['Content-Encoding', 'identity'],
    ['X-Drop-Me', 'hop'],
  ];
  const expectKept = (up: FakeUpstream) => {
    const h = up.calls.at(-1)!.headers;
    expect(h['idempotency-key']).toBe('key-1');
    expect(h['x-execution-fence']).toBe('3');
    expect(h['x-customer']).toBe('cust:A');
    expect(h['x-fence-entity']).toBe('cust:A');
    expect(h['content-type']).toBe('application/json');
    expect(h['content-encoding']).toBe('identity');
    // Control: Connection still works for a field the gateway does not rely on.
    expect(h['x-drop-me']).toBeUndefined();
  };

  it('Node listener (raw socket): the upstream receives the key, fence, entity and content type', async () => {
    const up = await upstream();
    const gw = await gateway([route(up.url)]);
    const res = await rawRequest(gw.url, { path: '/payments/charges', headers, body: '{"amount":1}' });
    expect(res.status).toBe(201);
    expectKept(up);
  });

  it('Hono app (app.request): the same', async () => {
    const up = await upstream();
    const tmp = tempDir();
    cleanups.push(() => tmp.cleanup());
    const config = parseConfig({ store: { sqlite: `${tmp.dir}/g.db`, synchronous: 'NORMAL' }, routes: [route(up.url)] });
    const g = createGateway({
      config,
      store: new SqliteGatewayStore({ path: `${tmp.dir}/g.db`, synchronous: 'NORMAL' }),
      forwarder: createUndiciForwarder(),
      env: {},
    });
    cleanups.push(() => g.close());
    const res = await g.app.request('/payments/charges', { method: 'POST', headers, body: '{"amount":1}' });
    expect(res.status).toBe(201);
    expectKept(up);
  });

  it('negative control: without the fields to keep, the Connection tokens name them (what the forward dropped before)', () => {
    const all = connectionTokens(CONNECTION);
    expect([...all]).toEqual(expect.arrayContaining(['idempotency-key', 'content-type', 'x-execution-fence', 'x-customer']));
    const kept = connectionTokens(CONNECTION, ['Idempotency-Key', 'content-type', 'X-Execution-Fence', 'X-Customer', 'x-fence-entity', 'content-encoding']);
    expect([...kept].sort()).toEqual(['close', 'x-drop-me']);
  });
});

describe('a replay never crosses entities', () => {
  const route = (up: string) => paymentsRoute(up, { entity: { header: 'X-Customer' } });
  const send = (gw: TestGateway, customer: string, fence: number, key = 'pay-1') =>
    command(gw.url, '/payments/charges', { fence, key, headers: { 'x-customer': customer }, body: '{"amount":1200}' });

  it("the same key for another entity is 422 idempotency-key-reused (logged), never the other entity's stored answer", async () => {
    const up = await upstream();
    const gw = await gateway([route(up.url)]);
    const first = await send(gw, 'cust:A', 1);
    expect(first.status).toBe(201);
    expect((await effectOf(first)).entity).toBe('cust:A');

    await expectProblem(await send(gw, 'cust:B', 1), 422, 'idempotency-key-reused', { idempotency_key: 'pay-1' });
    // Even after cust:A moved on to a higher fence.
    expect((await send(gw, 'cust:A', 2, 'pay-2')).status).toBe(201);
    await expectProblem(await send(gw, 'cust:B', 7), 422, 'idempotency-key-reused');
    expect(rejectionRows(gw.sqlite, 'idempotency-key-reused').map((r) => r.entity)).toEqual(['cust:B', 'cust:B']);

    // Control: the same entity still gets its replay.
    const again = await send(gw, 'cust:A', 2);
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(await effectOf(again)).toMatchObject({ effect: 1, entity: 'cust:A' });
    expect(up.effects).toBe(2);
  });

  it("negative control: with the fingerprint of before (no entity), cust:B is replayed cust:A's charge", async () => {
    const up = await upstream();
    const gw = await gateway([route(up.url)], { wrapStore: withoutEntityInFingerprint });
    expect((await send(gw, 'cust:A', 1)).status).toBe(201);
    const crossed = await send(gw, 'cust:B', 1);
    expect(crossed.status).toBe(201);
    expect(crossed.headers.get('idempotent-replayed')).toBe('true');
    expect((await effectOf(crossed)).entity).toBe('cust:A');
    expect(up.effects).toBe(1);
  });

  it('a record stored before the entity was fingerprinted answers a retry with an entity 422, never a second execution', async () => {
    const up = await upstream();
    const tmp = tempDir();
    cleanups.push(() => tmp.cleanup());
    const dbPath = `${tmp.dir}/g.db`;
    const old = await gateway([route(up.url)], { wrapStore: withoutEntityInFingerprint, dbPath });
    expect((await send(old, 'cust:A', 1)).status).toBe(201);
    await old.close();
    const upgraded = await gateway([route(up.url)], { dbPath });
    await expectProblem(await send(upgraded, 'cust:A', 1), 422, 'idempotency-key-reused');
    expect(up.effects).toBe(1);
  });

  it('fingerprint: the entity is one more field, and no entity is the fingerprint of before', () => {
    const base = ['POST', '/p', 'application/json', 'ab'] as const;
    expect(fingerprint(...base, null)).not.toBe(fingerprint(...base, 'cust:A'));
    expect(fingerprint(...base, 'cust:A')).not.toBe(fingerprint(...base, 'cust:B'));
    // The formula of DESIGN §3.4 before the entity counted.
    expect(fingerprint(...base, null)).toBe(createHash('sha256').update('POST\0/p\0application/json\0ab').digest('hex'));
  });
});

/**
 * Test-only: the store sees the fingerprint the gateway computed before the
 * entity was part of it (method, path, content type, body; these tests send
 * no query and JSON only).
 */
function withoutEntityInFingerprint(inner: GatewayStore): GatewayStore {
  return new Proxy(inner, {
    get(target, prop) {
      if (prop === 'admit') {
        return (i: AdmitInput) =>
          target.admit({ ...i, fingerprint: fingerprint(i.audit.method, i.audit.path, 'application/json', i.audit.payloadSha256, null) });
      }
      const v = Reflect.get(target, prop, target);
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
}

describe('a JSON body that names its entity twice is refused', () => {
  const route = (up: string) => paymentsRoute(up, { name: 'orders', match: { path: '/orders/*' }, entity: { json: '/order/customer' } });
  const REPEATS = [
    '{"order":{"customer":"A","customer":"B"},"amount":1}',
    '{"order":{"customer":"A"},"order":{"customer":"B"}}',
    '{"order":{"customer":"A","\\u0063ustomer":"B"}}',
    '{"amount":1,"amount":2,"order":{"customer":"B"}}',
    '{ "order" : { "note" : "x", "note" : "y", "customer" : "B" } }',
  ];

  it.each(REPEATS)('%s: 400 invalid-entity, nothing forwarded, nothing stored', async (body) => {
    const up = await upstream();
    const gw = await gateway([route(up.url)]);
    const before = snapshot(gw.sqlite);
    await expectProblem(await command(gw.url, '/orders/pay', { fence: 1, key: 'k', body }), 400, 'invalid-entity');
    expect(up.calls).toHaveLength(0);
    expect(snapshot(gw.sqlite)).toBe(before);
  });

  it('negative control: JSON.parse fences B while a parser that keeps the first name acts on A', () => {
    const body = REPEATS[0]!;
    expect(JSON.parse(body).order.customer).toBe('B');
    expect(/"customer":"([^"]*)"/.exec(body)![1]).toBe('A');
  });

  it('control: a repeat off the pointer path is accepted, and so is the unambiguous body', async () => {
    const up = await upstream();
    const gw = await gateway([route(up.url)]);
    expect((await command(gw.url, '/orders/pay', { fence: 1, key: 'k1', body: '{"order":{"customer":"A"},"meta":{"x":1,"x":2}}' })).status).toBe(201);
    expect((await command(gw.url, '/orders/pay', { fence: 1, key: 'k2', body: '{"order":{"customer":"A","items":[{"sku":1,"sku":2}]}}' })).status).toBe(201);
    expect(up.calls.map((c) => c.entity)).toEqual(['A', 'A']);
  });

  it('duplicateOnPointerPath (unit): arrays, escapes, nesting, strings that look like structure', () => {
    expect(duplicateOnPointerPath('{"a":1,"a":2}', ['a'])).toEqual({ object: '', name: 'a' });
    expect(duplicateOnPointerPath('{"a":{"b":1}}', ['a', 'b'])).toBeNull();
    expect(duplicateOnPointerPath('{"items":[{"id":1},{"id":2,"id":3}]}', ['items', '1', 'id'])).toEqual({ object: '/items/1', name: 'id' });
    expect(duplicateOnPointerPath('{"items":[{"id":1},{"id":2,"id":3}]}', ['items', '0', 'id'])).toBeNull();
    expect(duplicateOnPointerPath('{"x":"}\\",\\"a\\":","a":1}', ['a'])).toBeNull();
    expect(duplicateOnPointerPath('{"a/b":{"c":1,"c":2}}', ['a/b', 'c'])).toEqual({ object: '/a~1b', name: 'c' });
    expect(duplicateOnPointerPath('{"a":[1,2]}', ['a', '5'])).toBeNull();
    expect(duplicateOnPointerPath('{}', ['a'])).toBeNull();
    // Names differing only in case are one member to Go's encoding/json and ASP.NET Core.
    expect(duplicateOnPointerPath('{"customer":"A","Customer":"B"}', ['customer'])).toEqual({ object: '', name: 'Customer' });
    expect(duplicateOnPointerPath('{"a":{"x":1},"b":{"X":1,"x":2}}', ['a', 'x'])).toBeNull();
    const deep = '['.repeat(100_000) + ']'.repeat(100_000);
    expect(duplicateOnPointerPath(`{"z":${deep},"z":1}`, ['z'])).toEqual({ object: '', name: 'z' });
  });
});
