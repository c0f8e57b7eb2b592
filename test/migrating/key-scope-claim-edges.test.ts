import { CompactSign, SignJWT } from 'jose';
import { afterEach, describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../../src/config/load.js';
import { command, expectProblem, recordRows, rejectionRows, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { AUDIENCE, bearer, hsAuth, ISSUER, SECRET } from '../auth/tokens.js';

// The edges of `keyScope: { claim }` (docs/http-api.md "Key rules", DESIGN §3.5),
// through the real Node server on loopback and a real upstream. The first
// two groups failed when a numeric claim was read after JSON.parse and any
// claim name was accepted: they are their own negative controls.

const P = '/pay/charges';
const open: { close(): Promise<void> }[] = [];
afterEach(async () => {
  for (const o of open.splice(0).reverse()) await o.close();
});

async function setup(route: Record<string, unknown> = {}, config: Record<string, unknown> = {}): Promise<{ g: TestGateway; up: FakeUpstream }> {
  const up = await startUpstream();
  open.push(up);
  const g = await startTestGateway({
    routes: [{ name: 'pay', match: { path: '/pay/*' }, upstream: up.url, fence: 'off', mode: 'concurrent', keyScope: { claim: 'tid' }, ...route }],
    config: { auth: hsAuth(), ...config },
  });
  open.push(g);
  return { g, up };
}

/** A proxy token whose payload is `extra` spliced in as raw JSON text (so `-0`, `42.0`, `4.2e1` stay as written). */
async function rawToken(extra: string, sub = 'billing'): Promise<string> {
  const now = Math.floor(Date.now() / 1000);
  const payload = `{"scope":"fencegate:proxy","iss":${JSON.stringify(ISSUER)},"aud":${JSON.stringify(AUDIENCE)},"sub":${JSON.stringify(sub)},"iat":${now - 5},"exp":${now + 600}${extra === '' ? '' : `,${extra}`}}`;
  return new CompactSign(new TextEncoder().encode(payload)).setProtectedHeader({ alg: 'HS256' }).sign(new TextEncoder().encode(SECRET));
}

async function tenantToken(claims: Record<string, unknown>, sub = 'billing'): Promise<string> {
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT({ scope: 'fencegate:proxy', ...claims })
    .setProtectedHeader({ alg: 'HS256' })
    .setIssuer(ISSUER)
    .setAudience(AUDIENCE)
    .setSubject(sub)
    .setIssuedAt(now - 5)
    .setExpirationTime(now + 600)
    .sign(new TextEncoder().encode(SECRET));
}

describe('a numeric claim counts as written: no other number names the same tenant', () => {
  // Two different claim texts, one stored answer: the second tenant is handed the first one's replay.
  it.each([
    ['a fraction above 2^52 and its rounded neighbour', '"tid":4503599627370498.4', '"tid":4503599627370498'],
    ['-0 and 0', '"tid":-0', '"tid":0'],
    ['4.2e1 and 42', '"tid":4.2e1', '"tid":42'],
    ['42.0 and 42', '"tid":42.0', '"tid":42'],
  ])("%s: the second is never the first one's replay (refused 403, as idempotencyKeyFrom refuses such numbers)", async (_what, first, second) => {
    const { g, up } = await setup();
    const a = await command(g.url, P, { key: 'k1', headers: bearer(await rawToken(first)) });
    // What the key rules do for the same lexeme (docs/configuration.md, idempotencyKeyFrom: "1.0, 1e0, -0 … are refused, never read as another key").
    expect(a.status).toBe(403);
    const b = await command(g.url, P, { key: 'k1', headers: bearer(await rawToken(second)) });
    expect(b.headers.get('idempotent-replayed')).toBeNull();
    expect(up.effects).toBe(1);
  });

  it('a claim name the payload repeats is refused 403: parsers disagree on which one counts', async () => {
    const { g, up } = await setup();
    const a = await command(g.url, P, { key: 'k1', headers: bearer(await rawToken('"tid":"acme","tid":"globex"')) });
    expect(a.status).toBe(403);
    expect(up.effects).toBe(0);
    expect(recordRows(g.sqlite, 'k1')).toHaveLength(0);
  });
});

describe('a claim that changes with a new token or sign-in is refused as a key scope', () => {
  it.each(['jti', 'iat', 'exp', 'nbf', 'auth_time', 'nonce', 'at_hash', 'c_hash', 'sid', 'uti'])(
    'keyScope { claim: "%s" } is refused at start-up (a retry with a refreshed token would run twice)',
    (name) => {
      const parse = () =>
        parseConfig({
          store: { sqlite: ':memory:' },
          auth: hsAuth(),
          routes: [{ name: 'pay', match: { path: '/pay/*' }, upstream: 'http://127.0.0.1:9', fence: 'off', keyScope: { claim: name } }],
        });
      expect(parse).toThrow(ConfigError);
    },
  );

  it('control: a claim that names the tenant is accepted by the same config', () => {
    const config = parseConfig({
      store: { sqlite: ':memory:' },
      auth: hsAuth(),
      routes: [{ name: 'pay', match: { path: '/pay/*' }, upstream: 'http://127.0.0.1:9', fence: 'off', keyScope: { claim: 'tid' } }],
    });
    expect(config.routes[0]!.keyScope).toEqual({ claim: 'tid' });
  });
});

describe('what holds through the Node server (startGateway, loopback)', () => {
  it('one sub, two tenants, one key: two effects; each tenant replays its own answer; the Authorization never reaches the upstream', async () => {
    const { g, up } = await setup();
    const a = await command(g.url, P, { key: 'k1', headers: bearer(await tenantToken({ tid: 'acme' })) });
    const b = await command(g.url, P, { key: 'k1', headers: bearer(await tenantToken({ tid: 'globex' })) });
    expect(b.headers.get('idempotent-replayed')).toBeNull();
    const ra = await command(g.url, P, { key: 'k1', headers: bearer(await tenantToken({ tid: 'acme' })) });
    const rb = await command(g.url, P, { key: 'k1', headers: bearer(await tenantToken({ tid: 'globex' })) });
    expect(await ra.text()).toBe(await a.text());
    expect(await rb.text()).toBe(await b.text());
    expect(up.effects).toBe(2);
    expect(up.calls.every((c) => c.headers.authorization === undefined)).toBe(true);
  });

  it("a sub holding NUL and the mark cannot reach another tenant's scope (the claim is the last part and has no NUL)", async () => {
    const { g, up } = await setup();
    await command(g.url, P, { key: 'k1', headers: bearer(await tenantToken({ tid: 'globex' }, 'x')) });
    // Same text as route\0x\0key-claim:globex would need tid "x\0key-claim:globex"-ish splicing; try both ways.
    const evil1 = await command(g.url, P, { key: 'k1', headers: bearer(await tenantToken({ tid: 'globex' }, 'x\u0000key-claim:acme')) });
    expect(evil1.headers.get('idempotent-replayed')).toBeNull();
    const evil2 = await command(g.url, P, { key: 'k1', headers: bearer(await tenantToken({ tid: 'x\u0000key-claim:globex' }, 'x')) });
    expect(evil2.status).toBe(403);
    expect(up.effects).toBe(2);
    expect(
      recordRows(g.sqlite, 'k1')
        .map((r) => r.scope)
        .sort(),
    ).toEqual(['pay\u0000x\u0000key-claim:globex', 'pay\u0000x\u0000key-claim:acme\u0000key-claim:globex'].sort());
  });

  it('the 403: nothing stored, upstream not reached, logged without the value or the token, WWW-Authenticate quoted safely for an odd claim name', async () => {
    const name = 'a"b\\c,d=e';
    const { g, up } = await setup({ keyScope: { claim: name } });
    const tok = await tenantToken({ [name]: { secret: 'PII-value' } });
    const res = await command(g.url, P, { key: 'k1', headers: bearer(tok) });
    const body = await expectProblem(res, 403, 'forbidden');
    expect(JSON.stringify(body)).not.toContain('PII-value');
    const challenge = res.headers.get('www-authenticate')!;
    expect(challenge).toMatch(/^Bearer realm="fencegate", error="insufficient_scope", error_description="[\x20\x21\x23-\x5b\x5d-\x7e]*"$/);
    expect(up.effects).toBe(0);
    expect(g.sqlite.db.prepare('SELECT COUNT(*) AS n FROM idempotency_records').get()).toEqual({ n: 0 });
    const rows = rejectionRows(g.sqlite, 'forbidden') as unknown as { detail: string }[];
    expect(rows).toHaveLength(1);
    expect(rows[0]!.detail).not.toContain('PII-value');
    expect(rows[0]!.detail).not.toContain(tok);
  });

  it('callerClaim is the keyScope claim: one key space per tenant, integer tenant refused 401 (callerClaim wants a string)', async () => {
    const { g, up } = await setup({}, { auth: hsAuth({ callerClaim: 'tid' }) });
    await command(g.url, P, { key: 'k1', headers: bearer(await tenantToken({ tid: 'acme' }, 'u1')) });
    const other = await command(g.url, P, { key: 'k1', headers: bearer(await tenantToken({ tid: 'acme' }, 'u2')) });
    expect(other.headers.get('idempotent-replayed')).toBe('true');
    expect((await command(g.url, P, { key: 'k1', headers: bearer(await tenantToken({ tid: 'globex' }, 'u1')) })).headers.get('idempotent-replayed')).toBeNull();
    expect((await command(g.url, P, { key: 'k2', headers: bearer(await tenantToken({ tid: 42 }, 'u1')) })).status).toBe(401);
    expect(up.effects).toBe(2);
  });

  it('an optional route without a key still needs the claim (the middleware and parseCommand both ask)', async () => {
    const { g, up } = await setup({ idempotency: 'optional' });
    await expectProblem(await command(g.url, P, { headers: bearer(await tenantToken({})) }), 403, 'forbidden');
    expect(up.effects).toBe(0);
  });

  it('as documented: with fence.entityScope "caller", one sub in two tenants shares one fence per entity', async () => {
    const { g, up } = await setup({ fence: 'optional', entity: { header: 'X-Fence-Entity' } }, { fence: { entityScope: 'caller' } });
    await command(g.url, P, { key: 'a', entity: 'invoice-7', fence: 5, headers: bearer(await tenantToken({ tid: 'acme' })) });
    const b = await command(g.url, P, { key: 'b', entity: 'invoice-7', fence: 3, headers: bearer(await tenantToken({ tid: 'globex' })) });
    // globex's own worker is fenced out by acme's fence: keys are per tenant, fences are not.
    expect(b.status).toBe(409);
    expect(up.effects).toBe(1);
  });
});
