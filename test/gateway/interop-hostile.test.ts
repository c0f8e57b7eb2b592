import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { bodyDigest, sha256Hex } from '../../src/core/fingerprint.js';
import { entityFromJson } from '../../src/http/command.js';
import { warnGlobalKeys } from '../../src/http/key-scope.js';
import type { Logger } from '../../src/http/logger.js';
import { hsAuth } from '../auth/tokens.js';
import { expectProblem, recordRows, snapshot } from '../helpers/gateway.js';
import { inProcessGateway, type InProcessGateway } from '../helpers/in-process.js';

// What a hostile caller (or a careless config) can do with the interop
// options, and the refusals that stop it. Each refusal is shown with the
// check switched off after start-up, or with the reading it replaces
// (negative controls).

const P = '/pay/charges';
const open: InProcessGateway[] = [];
afterEach(async () => {
  for (const g of open.splice(0)) await g.close();
});
function gateway(route: Record<string, unknown> = {}): InProcessGateway {
  const g = inProcessGateway({ routes: [{ name: 'pay', match: { path: '/pay/*' }, fence: 'off', mode: 'concurrent', ...route }] });
  open.push(g);
  return g;
}
const enc = (s: string) => new TextEncoder().encode(s);

describe('keyScope without auth is chosen by the caller', () => {
  const base = { name: 'scoped', match: { path: '/b/*' }, upstream: 'http://127.0.0.1:9', fence: 'off', keyScope: { header: 'X-Tenant-Id' } };
  const warnings = (extra: Record<string, unknown>) => {
    const lines: { msg: string; route?: string; reason?: string }[] = [];
    const logger = { info() {}, error() {}, warn: (msg: string, f?: Record<string, unknown>) => lines.push({ msg, ...(f as object) }) } as unknown as Logger;
    warnGlobalKeys(parseConfig({ store: { sqlite: ':memory:' }, routes: [base], ...extra }), logger);
    return lines.filter((l) => l.msg === 'global-keys');
  };

  it('so start-up still warns, naming the trusted proxy the header needs', () => {
    const [line, ...rest] = warnings({});
    expect(rest).toEqual([]);
    expect(line!.route).toBe('scoped');
    expect(line!.reason).toMatch(/X-Tenant-Id.*trusted proxy that strips the client's copy/);
  });

  it('control: with auth the caller id scopes keys, and there is no warning', () => {
    expect(warnings({ auth: hsAuth() })).toEqual([]);
  });

  it("what the warning is about: a caller who sends another tenant's value is handed its replay", async () => {
    const g = gateway({ keyScope: { header: 'X-Tenant-Id' } });
    const victim = await g.command(P, { key: '1', headers: { 'x-tenant-id': 'acme' }, body: '{"amount":1}' });
    const other = await g.command(P, { key: '1', headers: { 'x-tenant-id': 'acme' }, body: '{"amount":1}' });
    expect(other.headers.get('idempotent-replayed')).toBe('true');
    expect(await other.text()).toBe(await victim.text());
  });
});

describe('idempotencyKeyFrom: a header key and a body key must be one key', () => {
  const route = { idempotencyKeyFrom: { json: '/request_id' } };
  const body = '{"request_id":"order-7","amount":5}';

  it('a per-attempt header key with the body key order-7 is 400, never a second execution of order-7', async () => {
    const g = gateway(route);
    const before = snapshot(g.sqlite);
    await expectProblem(await g.command(P, { key: 'attempt-1', body }), 400, 'invalid-idempotency-key');
    await expectProblem(await g.command(P, { key: 'attempt-2', body }), 400, 'invalid-idempotency-key');
    expect(snapshot(g.sqlite)).toBe(before);
    expect(g.upstream.effects).toBe(0);
  });

  it('negative control: reading the header alone (the check off), order-7 runs twice upstream', async () => {
    const g = gateway(route);
    g.config.routes[0]!.idempotencyKeyFrom = undefined;
    expect((await g.command(P, { key: 'attempt-1', body })).status).toBe(201);
    expect((await g.command(P, { key: 'attempt-2', body })).status).toBe(201);
    expect(g.upstream.effects).toBe(2);
  });
});

describe('idempotencyKeyFrom: a body key that is there but unusable', () => {
  const route = { idempotencyKeyFrom: { json: '/request_id' }, idempotency: 'optional' };

  it.each(['12345678901234567890', '9007199254740992', '1.5', '1.0', '1e0', '-0', 'true', 'false', '{"id":"x"}', '["x"]'])(
    '%s is 400 invalid-idempotency-key, not "no key" (no state, no upstream call)',
    async (v) => {
      const g = gateway(route);
      const before = snapshot(g.sqlite);
      const res = await g.command(P, { body: `{"request_id":${v}}` });
      await expectProblem(res, 400, 'invalid-idempotency-key');
      expect(snapshot(g.sqlite)).toBe(before);
      expect(g.upstream.effects).toBe(0);
    },
  );

  it('a plain integer is the key as written; null is no key', async () => {
    const g = gateway(route);
    expect((await g.command(P, { body: '{"request_id":42}' })).status).toBe(201);
    expect((await g.command(P, { body: '{"request_id":-7}' })).status).toBe(201);
    expect((await g.command(P, { body: '{"request_id":9007199254740991}' })).status).toBe(201);
    expect(recordRows(g.sqlite, '42')).toHaveLength(1);
    expect(recordRows(g.sqlite, '-7')).toHaveLength(1);
    expect(recordRows(g.sqlite, '9007199254740991')).toHaveLength(1);
    expect((await g.command(P, { body: '{"request_id":null}' })).status).toBe(201);
    expect((await g.command(P, { body: '{"request_id":null}' })).headers.get('idempotent-replayed')).toBeNull();
  });

  it('negative control: the JSON.parse reading (the older JSON entity\'s) aliases 1.0 to "1" and -0 to "0"', () => {
    expect(entityFromJson('/id', enc('{"id":1.0}'))).toEqual({ ok: true, entity: '1' });
    expect(entityFromJson('/id', enc('{"id":-0}'))).toEqual({ ok: true, entity: '0' });
  });
});

describe('the JSON fingerprint options read JSON only when the body says it is JSON', () => {
  const mode = { ignore: [] };
  const run = async (ct: string, b1: string, b2: string) => {
    const g = gateway({ fingerprint: mode });
    await g.command(P, { key: 'k', body: b1, headers: { 'content-type': ct } });
    return g.command(P, { key: 'k', body: b2, headers: { 'content-type': ct } });
  };

  it('text/plain or a non-UTF-8 charset: fingerprinted raw (422); application/json and +json: canonical (a replay)', async () => {
    await expectProblem(await run('text/plain', '{"a": 1, "b": 2}', '{"b":2,"a":1}'), 422, 'idempotency-key-reused');
    await expectProblem(await run('application/json; charset=utf-16', '{"a": 1}', '{"a":1}'), 422, 'idempotency-key-reused');
    expect((await run('application/json; charset=UTF-8', '{"a": 1}', '{"a":1}')).headers.get('idempotent-replayed')).toBe('true');
    expect((await run('application/vnd.api+json', '{"a": 1}', '{"a":1}')).headers.get('idempotent-replayed')).toBe('true');
  });

  it('a byte order mark: fingerprinted raw, never one command with the body without it', async () => {
    await expectProblem(await run('application/json', '\uFEFF{"a":1}', '{"a":1}'), 422, 'idempotency-key-reused');
  });

  it('negative control: without the content-type and BOM checks the digests are equal', () => {
    const d = (s: string, ct?: string) => bodyDigest(mode, enc(s), sha256Hex(enc(s)), ct);
    expect(d('{"a": 1, "b": 2}')).toBe(d('{"b":2,"a":1}'));
    expect(d('{"a": 1, "b": 2}', 'text/plain')).not.toBe(d('{"b":2,"a":1}', 'text/plain'));
    expect(d('\uFEFF{"a":1}')).toBe(d('{"a":1}'));
    expect(d('\uFEFF{"a":1}', 'application/json')).not.toBe(d('{"a":1}', 'application/json'));
  });
});

describe('start-up: a key or scope header the upstream would not see as sent, an echo into a significant response header', () => {
  const base = { name: 'r', match: { path: '/r/*' }, upstream: 'http://127.0.0.1:9', fence: 'off' };
  const parse = (route: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
    parseConfig({ store: { sqlite: ':memory:' }, ...extra, routes: [{ ...base, ...route }] });
  const auth = { auth: hsAuth() };

  it.each([
    ['idempotencyHeader', { idempotencyHeader: 'X-Key', stripHeaders: ['x-key'] }, {}],
    ['idempotencyHeader', { idempotencyHeader: 'traceparent' }, {}],
    ['idempotencyHeader', { idempotencyHeader: 'TraceState' }, {}],
    ['idempotencyHeader', { idempotencyHeader: 'Authorization' }, auth],
    ['keyScope\\.header', { keyScope: { header: 'X-Request-Id' } }, {}],
    ['keyScope\\.header', { keyScope: { header: 'traceparent' } }, {}],
    ['keyScope\\.header', { keyScope: { header: 'X-Tenant' }, upstreamHeaders: { 'x-TENANT': 'fixed' } }, {}],
    ['keyScope\\.header', { keyScope: { header: 'X-Tenant' }, stripHeaders: ['X-Tenant'] }, {}],
    ['keyScope\\.header', { keyScope: { header: 'X-Execution-Fence' } }, {}],
    ['keyScope\\.header', { keyScope: { header: 'Content-Length' } }, {}],
    ['keyScope\\.header', { keyScope: { header: 'Authorization' } }, auth],
    ['echoKey', { idempotencyHeader: 'Set-Cookie', echoKey: true }, {}],
    ['echoKey', { idempotencyHeader: 'Location', echoKey: true }, {}],
    ['echoKey', { idempotencyHeader: 'Content-Language', echoKey: true }, {}],
    ['echoKey', { idempotencyHeader: 'Cache-Control', echoKey: true }, {}],
    ['echoKey', { idempotencyHeader: 'Access-Control-Allow-Origin', echoKey: true }, {}],
  ])('refused at routes[0].%s: %j', (field, route, extra) => {
    expect(() => parse(route, extra)).toThrow(new RegExp(`routes\\[0\\]\\.${field}: `));
  });

  it('control: the same headers are accepted where nothing rewrites them', () => {
    expect(parse({ idempotencyHeader: 'Authorization' }).routes).toHaveLength(1);
    expect(parse({ keyScope: { header: 'X-Tenant' }, stripHeaders: ['X-Other'] }).routes).toHaveLength(1);
    expect(parse({ idempotencyHeader: 'Set-Cookie' }).routes).toHaveLength(1);
    expect(parse({ idempotencyHeader: 'X-Idempotency-Key', echoKey: true }).routes).toHaveLength(1);
  });

  it('negative control: past the check, a stripped key or scope header never reaches the upstream', async () => {
    const g = gateway({ keyScope: { header: 'X-Tenant-Id' } });
    g.config.routes[0]!.stripHeaders = ['idempotency-key', 'x-tenant-id'];
    expect((await g.command(P, { key: 'k-1', headers: { 'x-tenant-id': 'acme' } })).status).toBe(201);
    expect(recordRows(g.sqlite, 'k-1')).toHaveLength(1);
    expect(g.upstream.calls[0]!.key).toBeNull();
    expect(g.upstream.calls[0]!.headers.get('x-tenant-id')).toBeNull();
  });

  it('negative control: past the check, echoKey writes the key into Set-Cookie', async () => {
    const g = gateway({ echoKey: true });
    g.config.routes[0]!.idempotencyHeader = 'Set-Cookie';
    const res = await g.command(P, { headers: { 'set-cookie': 'session=attacker' } });
    expect(res.headers.get('set-cookie')).toBe('session=attacker');
  });
});

describe('options that do not apply to an mcp route are refused on one', () => {
  const mcp = { name: 'm', protocol: 'mcp', match: { path: '/mcp' }, upstream: 'http://127.0.0.1:9', fence: 'off' };
  const parse = (route: Record<string, unknown>) => parseConfig({ store: { sqlite: ':memory:' }, routes: [{ ...mcp, ...route }] });

  it.each([
    ['keyScope', { keyScope: { header: 'X-Tenant-Id' } }],
    ['fingerprint', { fingerprint: { ignore: [] } }],
    ['fingerprint', { fingerprint: { json: ['/amount'] } }],
    ['idempotencyKeyFrom', { idempotencyKeyFrom: { json: '/id' } }],
    ['echoKey', { echoKey: true }],
  ])('%s', (field, route) => {
    expect(() => parse(route)).toThrow(new RegExp(`routes\\[0\\]\\.${field}: does not apply to an mcp route`));
  });

  it('control: the mcp route without them, and an http route with them, are accepted', () => {
    expect(parse({ fingerprint: 'raw', echoKey: false }).routes[0]!.protocol).toBe('mcp');
    const http = {
      ...mcp,
      name: 'h',
      protocol: 'http',
      match: { path: '/h/*' },
      keyScope: { header: 'X-Tenant-Id' },
      fingerprint: { ignore: [] },
      idempotencyKeyFrom: { json: '/id' },
      echoKey: true,
    };
    expect(parseConfig({ store: { sqlite: ':memory:' }, routes: [http] }).routes).toHaveLength(1);
  });
});
