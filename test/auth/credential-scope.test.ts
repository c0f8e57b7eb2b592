import { createHash, createHmac } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../../src/config/load.js';
import { createGateway } from '../../src/http/gateway.js';
import { createJsonLogger } from '../../src/http/logger.js';
import type { GatewayStore } from '../../src/store/types.js';
import { delegate } from '../helpers/delegate.js';
import { command, effectOf, paymentsRoute, recordRows, snapshot, startTestGateway, tempDir, type TestGateway } from '../helpers/gateway.js';
import { startPgTestGateway } from '../helpers/pg-gateway.js';
import { POSTGRES_URL } from '../helpers/postgres.js';
import { startUpstream } from '../helpers/upstream.js';
import { bearer, hsAuth, token } from './tokens.js';
import { connectClient, fenced, mcpRoute, startMcpGateway, textOf } from '../mcp/harness.js';
import { startMcpUpstream } from '../mcp/mcp-upstream.js';

// Without gateway auth, the key scope holds a keyed hash of the credentials
// the upstream sees (Authorization, a route's credentialHeaders): two
// callers that an upstream authenticating by key tells apart never share a
// stored answer (Stripe scopes idempotency keys per API key). Real gateway
// on loopback, real SQLite file, recording upstream; on the MCP route the
// SDK's server and client. The negative control is a store that drops the
// credential part of the scope (the scope as it was before): there the
// second caller is handed the first one's answer.

const HASH_KEY = 'k'.repeat(16) + 'credential-hash-key';
const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** The fix switched off: the scope without its credential part, as the store saw it before credentials entered it. */
const CREDENTIAL_PART = /\u0000cred:[0-9a-f]{64}/;
const withoutCredentials = (store: GatewayStore): GatewayStore =>
  delegate(store, {
    admit: (i) => store.admit({ ...i, scope: i.scope.replace(CREDENTIAL_PART, '') }),
    finish: (i) => store.finish({ ...i, scope: i.scope.replace(CREDENTIAL_PART, '') }),
  });

async function gateway(options: { route?: Record<string, unknown>; config?: Record<string, unknown>; wrapStore?: (s: GatewayStore) => GatewayStore; dbPath?: string } = {}) {
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

const charge = (gw: TestGateway, key: string, headers: Record<string, string> = {}) => command(gw.url, '/payments/charges', { key, headers });
const A = { authorization: 'Bearer sk_test_alice_0001' };
const B = { authorization: 'Bearer sk_test_bob_0002' };

describe('plain route: callers told apart by Authorization', () => {
  it('two callers with one key both reach the upstream, each gets its own answer and its own replay; a caller without credentials keeps the route scope', async () => {
    const { gw, up } = await gateway();
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
    const scopes = recordRows(gw.sqlite, 'order-1').map((r) => r.scope).sort();
    expect(scopes).toHaveLength(3);
    expect(scopes).toContain('payments');
  });

  it('negative control: with the credential part dropped from the scope, B is handed A\'s answer and never reaches the upstream', async () => {
    const { gw, up } = await gateway({ wrapStore: withoutCredentials });
    expect((await effectOf(await charge(gw, 'order-1', A))).effect).toBe(1);
    const b = await charge(gw, 'order-1', B);
    expect(b.headers.get('idempotent-replayed')).toBe('true');
    expect((await effectOf(b)).effect).toBe(1);
    expect(up.effects).toBe(1);
  });

  it('nothing of the credential is in the tables: the scope holds HMAC-SHA256 under credentialHashKey, not a digest anyone can recompute', async () => {
    const { gw } = await gateway();
    await charge(gw, 'order-1', A);
    const dump = snapshot(gw.sqlite);
    expect(dump).not.toContain('sk_test_alice');
    const [row] = recordRows(gw.sqlite, 'order-1');
    const material = 'fencegate/key-scope/credentials/v1\u0000' + JSON.stringify([['authorization', A.authorization]]);
    expect(row!.scope).toBe(`payments\u0000cred:${createHmac('sha256', HASH_KEY).update(material).digest('hex')}`);
    expect(row!.scope).not.toContain(createHash('sha256').update(material).digest('hex'));
    expect(row!.scope).not.toContain(createHash('sha256').update(A.authorization).digest('hex'));
  });

  it('without credentialHashKey the hash is a domain-separated SHA-256 and the gateway warns so at start-up; with it, no warning', async () => {
    const { gw, warnings } = await gateway({ config: {} });
    await charge(gw, 'order-1', A);
    const material = 'fencegate/key-scope/credentials/v1\u0000' + JSON.stringify([['authorization', A.authorization]]);
    expect(recordRows(gw.sqlite, 'order-1')[0]!.scope).toBe(`payments\u0000cred:${createHash('sha256').update(material).digest('hex')}`);
    expect(warnings('credential-hash-unkeyed')).toHaveLength(1);
    // Nothing identifies a caller that sends no credentials: the global-keys warning stays.
    expect(warnings('global-keys').map((w) => w.route)).toEqual(['payments']);
    const keyed = await gateway();
    expect(keyed.warnings('credential-hash-unkeyed')).toHaveLength(0);
    expect(keyed.warnings('global-keys').map((w) => w.route)).toEqual(['payments']);
  });

  it('the scope survives a restart and is shared by replicas with the same key: a retry on a second gateway over the same file is a replay', async () => {
    const dir = tempDir();
    cleanups.push(() => dir.cleanup());
    const dbPath = `${dir.dir}/shared.db`;
    const one = await gateway({ dbPath });
    expect((await effectOf(await charge(one.gw, 'order-9', A))).effect).toBe(1);
    const two = await gateway({ dbPath });
    const retry = await charge(two.gw, 'order-9', A);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(two.up.effects).toBe(0);
  });
});

describe.skipIf(!POSTGRES_URL)('plain route on PostgreSQL', () => {
  it('two callers with one key are two executions, each replayed; the row holds the HMAC, not the credential', async () => {
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const gw = await startPgTestGateway({ routes: [paymentsRoute(up.url, { fence: 'off', mode: 'concurrent' })], config: { credentialHashKey: HASH_KEY } });
    cleanups.unshift(() => gw.close());
    const pg = (key: string, headers: Record<string, string>) => command(gw.url, '/payments/charges', { key, headers });
    expect((await effectOf(await pg('order-pg', A))).effect).toBe(1);
    expect((await effectOf(await pg('order-pg', B))).effect).toBe(2);
    expect((await effectOf(await pg('order-pg', A))).effect).toBe(1);
    expect(up.effects).toBe(2);
    const { rows } = await gw.schema.pool.query<{ scope: string }>("SELECT scope FROM idempotency_records WHERE key = 'order-pg'");
    expect(JSON.stringify(rows)).not.toContain('sk_test');
    expect(rows).toHaveLength(2);
  });
});

describe('credentialHeaders', () => {
  const K1 = { 'x-api-key': 'key-one' };
  const K2 = { 'x-api-key': 'key-two' };

  it('a listed header scopes keys: two API keys, one idempotency key, two executions; the same API key replays', async () => {
    const { gw, up } = await gateway({ route: { credentialHeaders: ['X-Api-Key'] } });
    expect((await effectOf(await charge(gw, 'o', K1))).effect).toBe(1);
    expect((await effectOf(await charge(gw, 'o', K2))).effect).toBe(2);
    expect((await effectOf(await charge(gw, 'o', K1))).effect).toBe(1);
    // Authorization and the listed header together are one caller: either differing is another.
    expect((await effectOf(await charge(gw, 'o', { ...K1, ...A }))).effect).toBe(3);
    expect(up.effects).toBe(3);
    expect(snapshot(gw.sqlite)).not.toContain('key-one');
  });

  it('control: a header the route does not list does not scope keys (the second API key is handed the first one\'s answer)', async () => {
    const { gw, up } = await gateway();
    expect((await effectOf(await charge(gw, 'o', K1))).effect).toBe(1);
    expect((await effectOf(await charge(gw, 'o', K2))).effect).toBe(1);
    expect(up.effects).toBe(1);
  });

  it('with gateway auth the caller scopes keys and a listed header still does: one caller, two API keys, two executions', async () => {
    const { gw, up } = await gateway({ route: { credentialHeaders: ['X-Api-Key'] }, config: { auth: hsAuth(), credentialHashKey: HASH_KEY } });
    const alice = bearer(await token({ sub: 'alice' }));
    expect((await effectOf(await charge(gw, 'o', { ...alice, ...K1 }))).effect).toBe(1);
    expect((await effectOf(await charge(gw, 'o', { ...alice, ...K2 }))).effect).toBe(2);
    expect((await effectOf(await charge(gw, 'o', { ...alice, ...K1 }))).effect).toBe(1);
    // A new token of the same caller is the same scope: Authorization is the gateway's, never the upstream's, so it does not enter it.
    expect((await effectOf(await charge(gw, 'o', { ...bearer(await token({ sub: 'alice', expIn: 600 })), ...K1 }))).effect).toBe(1);
    expect(up.effects).toBe(2);
  });

  it('is refused at start-up for a header that does not reach the upstream as sent', () => {
    const base = (route: Record<string, unknown>, extra: Record<string, unknown> = {}) => () =>
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
    expect(() => createGateway({ config, store, forwarder: { forward: async () => ({ kind: 'refused', error: 'x' }) }, env: {} })).toThrow(/credentialHashKey: environment variable FG_CRED_KEY is not set/);
  });
});

describe('mcp route: callers told apart by Authorization', () => {
  async function setup(wrapStore?: (s: GatewayStore) => GatewayStore) {
    const up = await startMcpUpstream({ stateful: false, json: true });
    cleanups.push(() => up.close());
    const gw = await startMcpGateway([mcpRoute(up.url)], { config: { credentialHashKey: HASH_KEY }, ...(wrapStore ? { wrapStore } : {}) });
    cleanups.push(() => gw.close());
    const agent = async (headers: Record<string, string>) => {
      const c = await connectClient(`${gw.url}/mcp`, { headers });
      cleanups.unshift(() => c.close());
      return c.client;
    };
    const ticket = async (client: Awaited<ReturnType<typeof agent>>) =>
      JSON.parse(textOf(await client.callTool({ name: 'create_ticket', arguments: { title: 'printer on fire' }, _meta: fenced(1, 'job-1', 'job-1:create') }))).id as string;
    return { up, gw, agent, ticket };
  }

  it('two agents with different tokens and one key each create their ticket; each retry is its own replay; an agent without a token is a third caller', async () => {
    const { up, gw, agent, ticket } = await setup();
    const [alice, bob, nobody] = [await agent(A), await agent(B), await agent({})];
    expect(await ticket(alice)).toBe('T-1');
    expect(await ticket(bob)).toBe('T-2');
    expect(await ticket(alice)).toBe('T-1');
    expect(await ticket(bob)).toBe('T-2');
    expect(await ticket(nobody)).toBe('T-3');
    expect(await ticket(nobody)).toBe('T-3');
    expect(up.tickets).toHaveLength(3);
    expect(gw.decisions().map((d) => d.decision).filter((d) => d !== 'passed')).toEqual(['forwarded', 'forwarded', 'replayed', 'replayed', 'forwarded', 'replayed']);
    expect(JSON.stringify(gw.sqlite.db.prepare('SELECT scope FROM idempotency_records').all())).not.toContain('sk_test');
  });

  it('negative control: with the credential part dropped from the scope, the second agent is handed the first one\'s ticket', async () => {
    const { up, agent, ticket } = await setup(withoutCredentials);
    const [alice, bob] = [await agent(A), await agent(B)];
    expect(await ticket(alice)).toBe('T-1');
    expect(await ticket(bob)).toBe('T-1');
    expect(up.tickets).toHaveLength(1);
  });
});
