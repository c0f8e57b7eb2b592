import { createHash, createHmac } from 'node:crypto';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { ConfigError, parseConfig } from '../../src/config/load.js';
import { fingerprint } from '../../src/core/fingerprint.js';
import { createGateway } from '../../src/http/gateway.js';
import { createJsonLogger } from '../../src/http/logger.js';
import type { GatewayStore } from '../../src/store/types.js';
import { delegate } from '../helpers/delegate.js';
import { command, effectOf, expectProblem, paymentsRoute, recordRows, snapshot, startTestGateway, tempDir, type TestGateway } from '../helpers/gateway.js';
import { startPgTestGateway } from '../helpers/pg-gateway.js';
import { POSTGRES_URL } from '../helpers/postgres.js';
import { startUpstream } from '../helpers/upstream.js';
import { bearer, hsAuth, token } from './tokens.js';
import { connectClient, fenced, mcpRoute, startMcpGateway, textOf } from '../mcp/harness.js';
import { startMcpUpstream } from '../mcp/mcp-upstream.js';

// Without gateway auth, a keyed hash of the credentials the upstream sees
// (Authorization, a route's credentialHeaders) binds a key's record (DESIGN
// §2 G2). By default (`credentialBinding: "fingerprint"`) it is in the
// request fingerprint: another caller under the key, or the same caller with
// a refreshed token, is 422, never handed the first answer and never run a
// second time. With `"scope"` it is in the key scope: each credential set its
// own key space (Stripe's rule), and a refreshed token's retry runs again.
// Real gateway on loopback, real SQLite file (or PostgreSQL), recording
// upstream; on the MCP route the SDK's server and client. Negative controls:
// the fingerprint without its credential part (a mutant of
// src/core/fingerprint.ts, switched on per test), and for "scope" a store that
// drops the credential part of the scope; in both the second caller is
// handed the first one's answer.

const mutant = vi.hoisted(() => ({ dropCredentials: false }));
vi.mock('../../src/core/fingerprint.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../../src/core/fingerprint.js')>();
  return {
    ...real,
    // The fix switched off: the fingerprint as it was before credentials entered it.
    fingerprint: (m: string, p: string, c: string, b: string, e: string | null, cred: string | null = null) =>
      real.fingerprint(m, p, c, b, e, mutant.dropCredentials ? null : cred),
  };
});

const HASH_KEY = 'k'.repeat(16) + 'credential-hash-key';
const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  mutant.dropCredentials = false;
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** The fix of the "scope" binding switched off: the scope without its credential part, as the store saw it before credentials entered it. */
const CREDENTIAL_PART = /\u0000cred:[0-9a-f]{64}/;
const withoutCredentials = (store: GatewayStore): GatewayStore =>
  delegate(store, {
    admit: (i) => store.admit({ ...i, scope: i.scope.replace(CREDENTIAL_PART, '') }),
    finish: (i) => store.finish({ ...i, scope: i.scope.replace(CREDENTIAL_PART, '') }),
  });

async function gateway(
  options: { route?: Record<string, unknown>; config?: Record<string, unknown>; wrapStore?: (s: GatewayStore) => GatewayStore; dbPath?: string } = {},
) {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const logs: string[] = [];
  const gw = await startTestGateway({
    routes: [paymentsRoute(up.url, { fence: 'off', entity: { header: 'X-Fence-Entity' }, mode: 'concurrent', ...options.route })],
    config: options.config ?? { credentialHashKey: HASH_KEY },
    logger: createJsonLogger({ write: (l) => logs.push(l) }),
    ...(options.wrapStore ? { wrapStore: options.wrapStore } : {}),
    ...(options.dbPath ? { dbPath: options.dbPath } : {}),
  });
  cleanups.unshift(() => gw.close());
  const warnings = (msg: string) => logs.map((l) => JSON.parse(l)).filter((l) => l.level === 'warn' && l.msg === msg);
  return { gw, up, warnings };
}

const BODY = '{"amount":1200}';
const charge = (gw: TestGateway, key: string, headers: Record<string, string> = {}) => command(gw.url, '/payments/charges', { key, headers, body: BODY });
const A = { authorization: 'Bearer sk_test_alice_0001' };
const A_REFRESHED = { authorization: 'Bearer sk_test_alice_0001_refreshed' };
const B = { authorization: 'Bearer sk_test_bob_0002' };
const SCOPE = { credentialBinding: 'scope' };

const MATERIAL = (pairs: [string, string | null][]) => 'fencegate/key-scope/credentials/v1\u0000' + JSON.stringify(pairs);
const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');
/** The 4 public fields of a charge's fingerprint (DESIGN §3.4), as the gateway joins them. */
const PUBLIC_FIELDS = `POST\u0000/payments/charges\u0000application/json\u0000${sha256(BODY)}`;
const fingerprintRow = (gw: TestGateway, key: string) =>
  gw.sqlite.db.prepare('SELECT scope, fingerprint FROM idempotency_records WHERE key = ?').all(key) as { scope: string; fingerprint: string }[];

/** A 422 idempotency-key-reused that says credentials may be what differs and carries nothing of the record's answer. */
async function expectReused(res: Response) {
  const body = await expectProblem(res, 422, 'idempotency-key-reused');
  expect(body.detail).toMatch(/credentials/);
  expect(JSON.stringify(body)).not.toMatch(/effect|sk_test/);
  expect(res.headers.get('idempotent-replayed')).toBeNull();
}

describe('plain route, default binding (fingerprint): a record answers only the credentials that made it', () => {
  it("two callers with different Authorization and one key: the upstream executes once, B gets 422 and never A's body, A's retry replays", async () => {
    const { gw, up } = await gateway();
    const a1 = await effectOf(await charge(gw, 'order-1', A));
    expect(a1.effect).toBe(1);
    await expectReused(await charge(gw, 'order-1', B));
    await expectReused(await charge(gw, 'order-1', B));
    const a2 = await charge(gw, 'order-1', A);
    expect(a2.headers.get('idempotent-replayed')).toBe('true');
    expect((await effectOf(a2)).effect).toBe(1);
    expect(up.effects).toBe(1);
    // One record, in the route's scope: the credentials are in its fingerprint, not its scope.
    expect(recordRows(gw.sqlite, 'order-1').map((r) => r.scope)).toEqual(['payments']);
  });

  it('a caller whose token changed between two attempts gets 422, and the upstream count stays 1', async () => {
    const { gw, up } = await gateway();
    expect((await effectOf(await charge(gw, 'order-2', A))).effect).toBe(1);
    await expectReused(await charge(gw, 'order-2', A_REFRESHED));
    expect(up.effects).toBe(1);
  });

  it('no credentials after credentials is 422, and credentials after none is 422', async () => {
    const { gw, up } = await gateway();
    expect((await effectOf(await charge(gw, 'order-3', A))).effect).toBe(1);
    await expectReused(await charge(gw, 'order-3'));
    expect((await effectOf(await charge(gw, 'order-4'))).effect).toBe(2);
    await expectReused(await charge(gw, 'order-4', A));
    expect(up.effects).toBe(2);
  });

  it('requests without credentials keep the fingerprint and the scope they had, and keep replaying', async () => {
    const { gw, up } = await gateway();
    expect((await effectOf(await charge(gw, 'order-5'))).effect).toBe(1);
    const again = await charge(gw, 'order-5');
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect((await effectOf(again)).effect).toBe(1);
    expect((await effectOf(await charge(gw, 'order-6', { 'x-fence-entity': 'cust-1' }))).effect).toBe(2);
    expect((await charge(gw, 'order-6', { 'x-fence-entity': 'cust-1' })).headers.get('idempotent-replayed')).toBe('true');
    expect(up.effects).toBe(2);
    // The 4- and 5-field forms of DESIGN §3.4, byte for byte: records stored before credentials counted still match.
    expect(fingerprintRow(gw, 'order-5')).toEqual([{ scope: 'payments', fingerprint: sha256(PUBLIC_FIELDS) }]);
    expect(fingerprintRow(gw, 'order-6')).toEqual([{ scope: 'payments', fingerprint: sha256(`${PUBLIC_FIELDS}\u0000cust-1`) }]);
  });

  it('the encoding with credentials is never a 4- or 5-field one, even for an entity that reads cred:<hash>', () => {
    const h = 'ab'.repeat(32);
    const args = ['POST', '/p', 'application/json', 'd'] as const;
    const forms = [
      fingerprint(...args, null),
      fingerprint(...args, `cred:${h}`),
      fingerprint(...args, null, h),
      fingerprint(...args, `cred:${h}`, h),
      fingerprint(...args, 'e', h),
    ];
    expect(new Set(forms).size).toBe(forms.length);
    expect(fingerprint(...args, null, h)).toBe(sha256(`POST\u0000/p\u0000application/json\u0000d\u0000\u0000cred:${h}`));
  });

  it('nothing of the credential is in the tables: the fingerprint is a digest over the public fields and the HMAC under credentialHashKey, which no one without the key can recompute from a guess', async () => {
    const { gw } = await gateway();
    await charge(gw, 'order-7', A);
    await charge(gw, 'order-7', B); // a 422: a rejection row too
    const dump = snapshot(gw.sqlite);
    expect(dump).not.toContain('sk_test_alice');
    expect(dump).not.toContain('sk_test_bob');
    const material = MATERIAL([['authorization', A.authorization]]);
    const [row] = fingerprintRow(gw, 'order-7');
    expect(row!.fingerprint).toBe(sha256(`${PUBLIC_FIELDS}\u0000\u0000cred:${createHmac('sha256', HASH_KEY).update(material).digest('hex')}`));
    // What a reader with a guess and no key could compute:
    expect(row!.fingerprint).not.toBe(sha256(`${PUBLIC_FIELDS}\u0000\u0000cred:${sha256(material)}`));
    expect(dump).not.toContain(createHmac('sha256', HASH_KEY).update(material).digest('hex'));
  });

  it('without credentialHashKey the hash is a domain-separated SHA-256 and the gateway warns so at start-up; with it, no warning', async () => {
    const { gw, warnings } = await gateway({ config: {} });
    await charge(gw, 'order-8', A);
    expect(fingerprintRow(gw, 'order-8')[0]!.fingerprint).toBe(
      sha256(`${PUBLIC_FIELDS}\u0000\u0000cred:${sha256(MATERIAL([['authorization', A.authorization]]))}`),
    );
    expect(warnings('credential-hash-unkeyed')).toHaveLength(1);
    // Callers that send no credentials still share one key space: the global-keys warning stays, and says what the binding does.
    const [global] = warnings('global-keys');
    expect(global.route).toBe('payments');
    expect(global.reason).toMatch(/a record answers only the credentials \(Authorization\) that made it, others get 422/);
    const keyed = await gateway();
    expect(keyed.warnings('credential-hash-unkeyed')).toHaveLength(0);
    expect(keyed.warnings('global-keys').map((w) => w.route)).toEqual(['payments']);
  });

  it('the binding survives a restart and is shared by replicas with the same key: a retry on a second gateway over the same file is a replay', async () => {
    const dir = tempDir();
    cleanups.push(() => dir.cleanup());
    const dbPath = `${dir.dir}/shared.db`;
    const one = await gateway({ dbPath });
    expect((await effectOf(await charge(one.gw, 'order-9', A))).effect).toBe(1);
    const two = await gateway({ dbPath });
    const retry = await charge(two.gw, 'order-9', A);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    await expectReused(await charge(two.gw, 'order-9', B));
    expect(two.up.effects).toBe(0);
  });

  it("negative control: with the credential part dropped from the fingerprint, B is handed A's answer and never reaches the upstream", async () => {
    mutant.dropCredentials = true;
    const { gw, up } = await gateway();
    expect((await effectOf(await charge(gw, 'order-1', A))).effect).toBe(1);
    const b = await charge(gw, 'order-1', B);
    expect(b.headers.get('idempotent-replayed')).toBe('true');
    expect((await effectOf(b)).effect).toBe(1);
    expect(up.effects).toBe(1);
  });

  it('credentialBinding is validated', () => {
    const parse = (credentialBinding: unknown) => () =>
      parseConfig({ store: { sqlite: ':memory:' }, routes: [paymentsRoute('http://127.0.0.1:1', { credentialBinding })] });
    expect(parse('hash')).toThrow(ConfigError);
    expect(parse('hash')).toThrow(/credentialBinding/);
    expect(parse('scope')).not.toThrow();
    expect(parseConfig({ store: { sqlite: ':memory:' }, routes: [paymentsRoute('http://127.0.0.1:1')] }).routes[0]!.credentialBinding).toBe('fingerprint');
  });
});

describe('plain route, credentialBinding "scope": each credential set its own key space', () => {
  it('two callers with one key both reach the upstream, each gets its own answer and its own replay; a caller without credentials keeps the route scope', async () => {
    const { gw, up } = await gateway({ route: SCOPE });
    const a1 = await effectOf(await charge(gw, 'order-1', A));
    const b1 = await effectOf(await charge(gw, 'order-1', B));
    expect([a1.effect, b1.effect]).toEqual([1, 2]);
    const a2 = await charge(gw, 'order-1', A);
    expect(a2.headers.get('idempotent-replayed')).toBe('true');
    expect((await effectOf(a2)).effect).toBe(1);
    expect((await effectOf(await charge(gw, 'order-1', B))).effect).toBe(2);
    // No credentials: the scope is the route's name alone, as before credentials entered it, and replays work.
    const n1 = await effectOf(await charge(gw, 'order-1'));
    expect(n1.effect).toBe(3);
    const n2 = await charge(gw, 'order-1');
    expect(n2.headers.get('idempotent-replayed')).toBe('true');
    expect((await effectOf(n2)).effect).toBe(3);
    expect(up.effects).toBe(3);
    const scopes = recordRows(gw.sqlite, 'order-1')
      .map((r) => r.scope)
      .sort();
    expect(scopes).toHaveLength(3);
    expect(scopes).toContain('payments');
    // The fingerprint is the one without credentials: they are in the scope only.
    expect(new Set(fingerprintRow(gw, 'order-1').map((r) => r.fingerprint))).toEqual(new Set([sha256(PUBLIC_FIELDS)]));
  });

  it('the rotation hazard, as documented: a retry with a refreshed token is in another scope and is executed again', async () => {
    const { gw, up } = await gateway({ route: SCOPE });
    expect((await effectOf(await charge(gw, 'order-2', A))).effect).toBe(1);
    const retry = await charge(gw, 'order-2', A_REFRESHED);
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    expect((await effectOf(retry)).effect).toBe(2);
    expect(up.effects).toBe(2);
  });

  it("negative control: with the credential part dropped from the scope, B is handed A's answer and never reaches the upstream", async () => {
    const { gw, up } = await gateway({ route: SCOPE, wrapStore: withoutCredentials });
    expect((await effectOf(await charge(gw, 'order-1', A))).effect).toBe(1);
    const b = await charge(gw, 'order-1', B);
    expect(b.headers.get('idempotent-replayed')).toBe('true');
    expect((await effectOf(b)).effect).toBe(1);
    expect(up.effects).toBe(1);
  });

  it('nothing of the credential is in the tables: the scope holds HMAC-SHA256 under credentialHashKey, not a digest anyone can recompute', async () => {
    const { gw, warnings } = await gateway({ route: SCOPE });
    await charge(gw, 'order-1', A);
    expect(snapshot(gw.sqlite)).not.toContain('sk_test_alice');
    const [row] = recordRows(gw.sqlite, 'order-1');
    const material = MATERIAL([['authorization', A.authorization]]);
    expect(row!.scope).toBe(`payments\u0000cred:${createHmac('sha256', HASH_KEY).update(material).digest('hex')}`);
    expect(row!.scope).not.toContain(sha256(material));
    expect(row!.scope).not.toContain(sha256(A.authorization));
    expect(warnings('global-keys')[0].reason).toMatch(/keys are scoped by the caller's credentials \(Authorization\) only/);
  });
});

describe.skipIf(!POSTGRES_URL)('plain route on PostgreSQL', () => {
  async function pgGateway(route: Record<string, unknown> = {}) {
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const gw = await startPgTestGateway({
      routes: [paymentsRoute(up.url, { fence: 'off', mode: 'concurrent', ...route })],
      config: { credentialHashKey: HASH_KEY },
    });
    cleanups.unshift(() => gw.close());
    const pg = (key: string, headers: Record<string, string>) => command(gw.url, '/payments/charges', { key, headers, body: BODY });
    const rows = async (key: string) =>
      (await gw.schema.pool.query<{ scope: string; fingerprint: string }>('SELECT scope, fingerprint FROM idempotency_records WHERE key = $1', [key])).rows;
    return { up, pg, rows };
  }

  it('default binding: two callers with one key are one execution, B gets 422, A replays; the row holds a digest over the HMAC, not the credential', async () => {
    const { up, pg, rows } = await pgGateway();
    expect((await effectOf(await pg('order-pg', A))).effect).toBe(1);
    await expectReused(await pg('order-pg', B));
    await expectReused(await pg('order-pg', A_REFRESHED));
    const again = await pg('order-pg', A);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect((await effectOf(again)).effect).toBe(1);
    expect(up.effects).toBe(1);
    const hmac = createHmac('sha256', HASH_KEY)
      .update(MATERIAL([['authorization', A.authorization]]))
      .digest('hex');
    expect(await rows('order-pg')).toEqual([{ scope: 'payments', fingerprint: sha256(`${PUBLIC_FIELDS}\u0000\u0000cred:${hmac}`) }]);
  });

  it("negative control: with the credential part dropped from the fingerprint, B is handed A's answer", async () => {
    mutant.dropCredentials = true;
    const { up, pg } = await pgGateway();
    expect((await effectOf(await pg('order-pg', A))).effect).toBe(1);
    const b = await pg('order-pg', B);
    expect(b.headers.get('idempotent-replayed')).toBe('true');
    expect((await effectOf(b)).effect).toBe(1);
    expect(up.effects).toBe(1);
  });

  it('"scope": two callers with one key are two executions, each replayed; the row holds the HMAC, not the credential', async () => {
    const { up, pg, rows } = await pgGateway(SCOPE);
    expect((await effectOf(await pg('order-pg', A))).effect).toBe(1);
    expect((await effectOf(await pg('order-pg', B))).effect).toBe(2);
    expect((await effectOf(await pg('order-pg', A))).effect).toBe(1);
    expect(up.effects).toBe(2);
    const found = await rows('order-pg');
    expect(JSON.stringify(found)).not.toContain('sk_test');
    expect(found).toHaveLength(2);
  });
});

describe("an Authorization the upstream never sees binds nothing (the gateway's own credential, or stripped)", () => {
  // The control is the rotation hazard above: the same retry on a route that forwards Authorization is executed again under "scope".
  it.each([
    ['upstreamHeaders sets Authorization', { upstreamHeaders: { Authorization: 'Bearer sk_gateway_own' } }, 'Bearer sk_gateway_own'],
    ['stripHeaders lists Authorization', { stripHeaders: ['Authorization'] }, undefined],
  ] as const)(
    '%s: under either binding, a retry whose caller-side token changed is a replay, one execution, and the row has no credential part',
    async (_, route, seen) => {
      for (const binding of ['fingerprint', 'scope'] as const) {
        const { gw, up, warnings } = await gateway({ route: { ...route, credentialBinding: binding } });
        expect(warnings('global-keys').map((w) => w.reason)).toEqual([expect.stringContaining('no credential of the caller reaches the upstream')]);
        expect((await effectOf(await charge(gw, 'order-gw', A))).effect).toBe(1);
        const retry = await charge(gw, 'order-gw', A_REFRESHED);
        expect(retry.headers.get('idempotent-replayed')).toBe('true');
        expect((await effectOf(retry)).effect).toBe(1);
        expect(up.effects).toBe(1);
        expect(up.calls[0]!.headers.authorization).toBe(seen);
        expect(fingerprintRow(gw, 'order-gw')).toEqual([{ scope: 'payments', fingerprint: sha256(PUBLIC_FIELDS) }]);
      }
    },
  );
});

describe('credentialHeaders', () => {
  const K1 = { 'x-api-key': 'key-one' };
  const K2 = { 'x-api-key': 'key-two' };

  it('a listed header binds the record: a second API key under one idempotency key is 422; the same API key replays', async () => {
    const { gw, up } = await gateway({ route: { credentialHeaders: ['X-Api-Key'] } });
    expect((await effectOf(await charge(gw, 'o', K1))).effect).toBe(1);
    await expectReused(await charge(gw, 'o', K2));
    expect((await effectOf(await charge(gw, 'o', K1))).effect).toBe(1);
    // Authorization and the listed header together are one caller: either differing is another.
    await expectReused(await charge(gw, 'o', { ...K1, ...A }));
    expect(up.effects).toBe(1);
    expect(snapshot(gw.sqlite)).not.toContain('key-one');
  });

  it('with "scope", a listed header scopes keys: two API keys, one idempotency key, two executions', async () => {
    const { gw, up } = await gateway({ route: { credentialHeaders: ['X-Api-Key'], ...SCOPE } });
    expect((await effectOf(await charge(gw, 'o', K1))).effect).toBe(1);
    expect((await effectOf(await charge(gw, 'o', K2))).effect).toBe(2);
    expect((await effectOf(await charge(gw, 'o', K1))).effect).toBe(1);
    expect((await effectOf(await charge(gw, 'o', { ...K1, ...A }))).effect).toBe(3);
    expect(up.effects).toBe(3);
  });

  it("control: a header the route does not list does not bind the record (the second API key is handed the first one's answer)", async () => {
    const { gw, up } = await gateway();
    expect((await effectOf(await charge(gw, 'o', K1))).effect).toBe(1);
    expect((await effectOf(await charge(gw, 'o', K2))).effect).toBe(1);
    expect(up.effects).toBe(1);
  });

  it('with gateway auth the caller scopes keys and a listed header binds the record; a new token of the same caller is a replay', async () => {
    const { gw, up } = await gateway({ route: { credentialHeaders: ['X-Api-Key'] }, config: { auth: hsAuth(), credentialHashKey: HASH_KEY } });
    const alice = bearer(await token({ sub: 'alice' }));
    expect((await effectOf(await charge(gw, 'o', { ...alice, ...K1 }))).effect).toBe(1);
    await expectReused(await charge(gw, 'o', { ...alice, ...K2 }));
    expect((await effectOf(await charge(gw, 'o', { ...alice, ...K1 }))).effect).toBe(1);
    // Authorization is the gateway's, never the upstream's: it enters neither the scope nor the fingerprint.
    const refreshed = await charge(gw, 'o', { ...bearer(await token({ sub: 'alice', expIn: 900 })), ...K1 });
    expect(refreshed.headers.get('idempotent-replayed')).toBe('true');
    expect((await effectOf(refreshed)).effect).toBe(1);
    expect(up.effects).toBe(1);
    expect(recordRows(gw.sqlite, 'o').map((r) => r.scope)).toEqual(['payments\u0000alice']);
  });

  it('with gateway auth and "scope": one caller, two API keys, two executions; a new token of the same caller is the same scope', async () => {
    const { gw, up } = await gateway({ route: { credentialHeaders: ['X-Api-Key'], ...SCOPE }, config: { auth: hsAuth(), credentialHashKey: HASH_KEY } });
    const alice = bearer(await token({ sub: 'alice' }));
    expect((await effectOf(await charge(gw, 'o', { ...alice, ...K1 }))).effect).toBe(1);
    expect((await effectOf(await charge(gw, 'o', { ...alice, ...K2 }))).effect).toBe(2);
    expect((await effectOf(await charge(gw, 'o', { ...bearer(await token({ sub: 'alice', expIn: 900 })), ...K1 }))).effect).toBe(1);
    expect(up.effects).toBe(2);
  });

  it('is refused at start-up for a header that does not reach the upstream as sent', () => {
    const base =
      (route: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
      () =>
        parseConfig({ store: { sqlite: ':memory:' }, ...extra, routes: [paymentsRoute('http://127.0.0.1:1', route)] });
    expect(base({ credentialHeaders: ['Content-Length'] })).toThrow(/credentialHeaders/);
    expect(base({ credentialHeaders: ['X-Api-Key'], stripHeaders: ['x-api-key'] })).toThrow(/credentialHeaders.*stripHeaders|stripHeaders/);
    expect(base({ credentialHeaders: ['Idempotency-Key'] })).toThrow(/idempotencyHeader/);
    expect(base({ credentialHeaders: ['Authorization'] }, { auth: hsAuth() })).toThrow(/credentialHeaders.*does not forward|does not forward/);
    expect(base({ credentialHeaders: ['Bad Header'] })).toThrow(ConfigError);
    expect(base({ credentialHeaders: ['X-Api-Key'] })).not.toThrow();
  });

  it('a credentialHashKey from the environment must be set', () => {
    const config = parseConfig({ store: { sqlite: ':memory:' }, credentialHashKey: { env: 'FG_CRED_KEY' }, routes: [paymentsRoute('http://127.0.0.1:1')] });
    const store = {} as GatewayStore;
    expect(() => createGateway({ config, store, forwarder: { forward: async () => ({ kind: 'refused', error: 'x' }) }, env: {} })).toThrow(
      /credentialHashKey: environment variable FG_CRED_KEY is not set/,
    );
  });
});

describe('mcp route: callers told apart by Authorization', () => {
  async function setup(options: { route?: Record<string, unknown>; wrapStore?: (s: GatewayStore) => GatewayStore } = {}) {
    const up = await startMcpUpstream({ stateful: false, json: true });
    cleanups.push(() => up.close());
    const gw = await startMcpGateway([mcpRoute(up.url, options.route)], {
      config: { credentialHashKey: HASH_KEY },
      ...(options.wrapStore ? { wrapStore: options.wrapStore } : {}),
    });
    cleanups.push(() => gw.close());
    const agent = async (headers: Record<string, string>) => {
      const c = await connectClient(`${gw.url}/mcp`, { headers });
      cleanups.unshift(() => c.close());
      return c.client;
    };
    const call = (client: Awaited<ReturnType<typeof agent>>) =>
      client.callTool({ name: 'create_ticket', arguments: { title: 'printer on fire' }, _meta: fenced(1, 'job-1', 'job-1:create') });
    const ticket = async (client: Awaited<ReturnType<typeof agent>>) => JSON.parse(textOf(await call(client))).id as string;
    /** The route's JSON-RPC error for idempotency-key-reused, without the other agent's ticket. */
    const reused = async (client: Awaited<ReturnType<typeof agent>>) => {
      // A result (another agent's ticket) reads as its text, so a failure shows what was handed out.
      const outcome = await call(client).then(
        (r) => `result: ${textOf(r)}`,
        (e: Error) => `error: ${e.message}`,
      );
      expect(outcome).toMatch(/^error: .*idempotency-key-reused/);
      expect(outcome).not.toMatch(/T-\d/);
    };
    return { up, gw, agent, ticket, reused };
  }

  it("default binding: a second agent with another token, the first with a refreshed token, and an agent without one are refused; the server makes one ticket; the first agent's retry replays", async () => {
    const { up, gw, agent, ticket, reused } = await setup();
    const [alice, bob, refreshed, nobody] = [await agent(A), await agent(B), await agent(A_REFRESHED), await agent({})];
    expect(await ticket(alice)).toBe('T-1');
    await reused(bob);
    await reused(refreshed);
    await reused(nobody);
    expect(await ticket(alice)).toBe('T-1');
    expect(up.tickets).toHaveLength(1);
    expect(
      gw
        .decisions()
        .map((d) => d.decision)
        .filter((d) => d !== 'passed'),
    ).toEqual(['forwarded', 'idempotency-key-reused', 'idempotency-key-reused', 'idempotency-key-reused', 'replayed']);
    expect(JSON.stringify(gw.sqlite.db.prepare('SELECT * FROM idempotency_records').all())).not.toContain('sk_test');
  });

  it("negative control: with the credential part dropped from the fingerprint, the second agent is handed the first one's ticket", async () => {
    mutant.dropCredentials = true;
    const { up, agent, ticket } = await setup();
    const [alice, bob] = [await agent(A), await agent(B)];
    expect(await ticket(alice)).toBe('T-1');
    expect(await ticket(bob)).toBe('T-1');
    expect(up.tickets).toHaveLength(1);
  });

  it('"scope": two agents with different tokens and one key each create their ticket; each retry is its own replay; an agent without a token is a third caller', async () => {
    const { up, gw, agent, ticket } = await setup({ route: SCOPE });
    const [alice, bob, nobody] = [await agent(A), await agent(B), await agent({})];
    expect(await ticket(alice)).toBe('T-1');
    expect(await ticket(bob)).toBe('T-2');
    expect(await ticket(alice)).toBe('T-1');
    expect(await ticket(bob)).toBe('T-2');
    expect(await ticket(nobody)).toBe('T-3');
    expect(await ticket(nobody)).toBe('T-3');
    expect(up.tickets).toHaveLength(3);
    expect(
      gw
        .decisions()
        .map((d) => d.decision)
        .filter((d) => d !== 'passed'),
    ).toEqual(['forwarded', 'forwarded', 'replayed', 'replayed', 'forwarded', 'replayed']);
    expect(JSON.stringify(gw.sqlite.db.prepare('SELECT scope FROM idempotency_records').all())).not.toContain('sk_test');
  });

  it('"scope", the rotation hazard: an agent whose token was refreshed creates a second ticket', async () => {
    const { up, agent, ticket } = await setup({ route: SCOPE });
    expect(await ticket(await agent(A))).toBe('T-1');
    expect(await ticket(await agent(A_REFRESHED))).toBe('T-2');
    expect(up.tickets).toHaveLength(2);
  });

  it('"scope" negative control: with the credential part dropped from the scope, the second agent is handed the first one\'s ticket', async () => {
    const { up, agent, ticket } = await setup({ route: SCOPE, wrapStore: withoutCredentials });
    const [alice, bob] = [await agent(A), await agent(B)];
    expect(await ticket(alice)).toBe('T-1');
    expect(await ticket(bob)).toBe('T-1');
    expect(up.tickets).toHaveLength(1);
  });
});
