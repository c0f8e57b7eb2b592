import { SignJWT } from 'jose';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { ConfigError, parseConfig } from '../../src/config/load.js';
import { keyScopeOf } from '../../src/http/key-scope.js';
import { createTokenVerifier } from '../../src/http/middleware/auth/index.js';
import { verificationKeys } from '../../src/protocol/keys.js';
import { expectProblem, recordRows, rejectionRows } from '../helpers/gateway.js';
import { inProcessGateway, type InProcessGateway } from '../helpers/in-process.js';
import { AUDIENCE, bearer, hsAuth, ISSUER, SECRET } from '../auth/tokens.js';

// `keyScope: { claim }` (docs/http-api.md "Key rules", DESIGN §3.5): the key space of a
// route is scoped by a claim of the caller's verified bearer token (a tenant
// id), as a middleware keyed by `tenant + key` scopes it. Real app
// (`app.request`), real SQLite in memory, real HS256 tokens signed with the
// test secret, an in-process upstream that counts effects.

// The negative control's switch: with it on, keyScopeOf drops the claim's
// value, as a gateway that ignored `keyScope.claim` would.
const control = vi.hoisted(() => ({ ignoreClaim: false }));
vi.mock('../../src/http/key-scope.js', async (importOriginal) => {
  const actual = await importOriginal<typeof import('../../src/http/key-scope.js')>();
  return {
    ...actual,
    keyScopeOf: (route: Parameters<typeof actual.keyScopeOf>[0], caller: string | null, scope: string | null) =>
      actual.keyScopeOf(route, caller, control.ignoreClaim ? null : scope),
  };
});

const P = '/pay/charges';
const open: InProcessGateway[] = [];
afterEach(async () => {
  control.ignoreClaim = false;
  for (const g of open.splice(0)) await g.close();
});

function gateway(route: Record<string, unknown> = {}): InProcessGateway {
  const g = inProcessGateway({
    routes: [{ name: 'pay', match: { path: '/pay/*' }, fence: 'off', mode: 'concurrent', keyScope: { claim: 'tid' }, ...route }],
    config: { auth: hsAuth() },
  });
  open.push(g);
  return g;
}

/** A valid proxy token (test secret, issuer, audience of ../auth/tokens.ts) with extra claims. */
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

const records = (g: InProcessGateway) => g.sqlite.db.prepare('SELECT scope, key FROM idempotency_records').all() as { scope: string; key: string }[];

describe('keyScope: { claim }: keys per tenant of the verified token', () => {
  it('one sub in two tenants with one key: two commands, each its own answer; the same tenant retrying gets its replay', async () => {
    const g = gateway();
    const acme = await tenantToken({ tid: 'acme' });
    const globex = await tenantToken({ tid: 'globex' });
    const a = await g.command(P, { key: 'order-1', headers: bearer(acme) });
    const b = await g.command(P, { key: 'order-1', headers: bearer(globex) });
    expect(a.status).toBe(201);
    expect(b.status).toBe(201);
    expect(b.headers.get('idempotent-replayed')).toBeNull();
    const aText = await a.text();
    expect(await b.text()).not.toBe(aText);
    const again = await g.command(P, { key: 'order-1', headers: bearer(await tenantToken({ tid: 'acme' })) });
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(await again.text()).toBe(aText);
    expect(g.upstream.effects).toBe(2);
    // Stored under the claim's own mark, never as a header scope's value.
    expect(
      recordRows(g.sqlite, 'order-1')
        .map((r) => r.scope)
        .sort(),
    ).toEqual(['pay\u0000billing\u0000key-claim:acme', 'pay\u0000billing\u0000key-claim:globex']);
  });

  it('an integer claim is its decimal text: tid 42 and tid "42" are one tenant', async () => {
    const g = gateway();
    await g.command(P, { key: 'k', headers: bearer(await tenantToken({ tid: 42 })) });
    const again = await g.command(P, { key: 'k', headers: bearer(await tenantToken({ tid: '42' })) });
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(g.upstream.effects).toBe(1);
  });

  it('a token without the claim: 403 forbidden, logged, no record, the upstream not reached', async () => {
    const g = gateway();
    const res = await g.command(P, { key: 'order-1', headers: bearer(await tenantToken({})) });
    const body = await expectProblem(res, 403, 'forbidden');
    expect(body.detail).toBe("the token has no string or integer claim tid, which this route's keyScope needs");
    expect(res.headers.get('www-authenticate')).toMatch(/error="insufficient_scope"/);
    expect(records(g)).toEqual([]);
    expect(g.upstream.effects).toBe(0);
    const rows = rejectionRows(g.sqlite, 'forbidden') as unknown as { caller: string; detail: string }[];
    expect(rows).toHaveLength(1);
    expect(rows[0]!.caller).toBe('billing');
    expect(rows[0]!.detail).toMatch(/^the token has no string or integer claim tid; token sha256 [0-9a-f]{16}$/);
  });

  it.each([
    ['an object', { tid: { id: 'acme' } }],
    ['an array', { tid: ['acme'] }],
    ['a boolean', { tid: true }],
    ['null', { tid: null }],
    ['a fraction', { tid: 1.5 }],
    ['an integer past 2^53', { tid: 2 ** 60 }],
    ['an empty string', { tid: '' }],
    ['longer than 512 bytes', { tid: 'a'.repeat(513) }],
    ['not printable ASCII', { tid: 'acmé' }],
    ['with spaces at its ends', { tid: ' acme' }],
  ])('a claim that is %s: 403, no record, the upstream not reached', async (_what, claims) => {
    const g = gateway();
    const res = await g.command(P, { key: 'order-1', headers: bearer(await tenantToken(claims)) });
    const body = await expectProblem(res, 403, 'forbidden');
    expect(body.detail).toMatch(/claim tid/);
    // The claim's value is not echoed back.
    expect(body.detail).not.toMatch(/acm/);
    expect(records(g)).toEqual([]);
    expect(g.upstream.effects).toBe(0);
  });

  it.each(['constructor', '__proto__'])('a claim named %s is read from the token only', async (name) => {
    const g = gateway({ keyScope: { claim: name } });
    await expectProblem(await g.command(P, { key: 'k', headers: bearer(await tenantToken({})) }), 403, 'forbidden');
    const t = await new SignJWT(JSON.parse(`{"scope":"fencegate:proxy","${name}":"acme"}`))
      .setProtectedHeader({ alg: 'HS256' })
      .setIssuer(ISSUER)
      .setAudience(AUDIENCE)
      .setSubject('billing')
      .setExpirationTime('10m')
      .sign(new TextEncoder().encode(SECRET));
    expect((await g.command(P, { key: 'k', headers: bearer(t) })).status).toBe(201);
    expect(g.upstream.effects).toBe(1);
  });

  it('a 512-byte printable claim is a scope (the bound of a header scope)', async () => {
    const g = gateway();
    expect((await g.command(P, { key: 'k', headers: bearer(await tenantToken({ tid: 't'.repeat(512) })) })).status).toBe(201);
  });

  it("the route's error shape: a stripe route answers the 403 in Stripe's shape", async () => {
    const g = gateway({ errors: 'stripe' });
    const res = await g.command(P, { key: 'order-1', headers: bearer(await tenantToken({})) });
    expect(res.status).toBe(403);
    const body = (await res.json()) as { error: { message: string } };
    expect(body.error.message).toMatch(/no string or integer claim tid/);
    expect(g.upstream.effects).toBe(0);
  });

  it('idempotency off: the claim is not needed (keys are what it scopes; on an optional route a keyless request still needs it)', async () => {
    const g = gateway({ idempotency: 'off' });
    expect((await g.command(P, { headers: bearer(await tenantToken({})) })).status).toBe(201);
  });

  it("negative control: with the claim left out of the scope, the second tenant is handed the first tenant's answer", async () => {
    control.ignoreClaim = true;
    const g = gateway();
    const a = await g.command(P, { key: 'order-1', headers: bearer(await tenantToken({ tid: 'acme' })) });
    const b = await g.command(P, { key: 'order-1', headers: bearer(await tenantToken({ tid: 'globex' })) });
    expect(b.headers.get('idempotent-replayed')).toBe('true');
    expect(await b.text()).toBe(await a.text());
    expect(g.upstream.effects).toBe(1);
  });
});

describe('keyScope: { claim } in the config', () => {
  const route = { name: 'pay', match: { path: '/pay/*' }, upstream: 'http://127.0.0.1:9', fence: 'off' };
  const parse = (r: Record<string, unknown>, config: Record<string, unknown> = { auth: hsAuth() }) =>
    parseConfig({ store: { sqlite: ':memory:' }, ...config, routes: [{ ...route, ...r }] });
  const issues = (f: () => unknown): string => {
    try {
      f();
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigError);
      return (err as Error).message;
    }
    throw new Error('no config error');
  };

  it('needs auth: without it, a config error naming routes[0].keyScope.claim', () => {
    expect(issues(() => parse({ keyScope: { claim: 'tid' } }, {}))).toMatch(/routes\[0\]\.keyScope\.claim.*needs "auth"/);
  });

  it('exactly one of header and claim; a claim name is printable ASCII without spaces', () => {
    expect(issues(() => parse({ keyScope: { header: 'X-Tenant', claim: 'tid' } }))).toMatch(/keyScope/);
    expect(issues(() => parse({ keyScope: {} }))).toMatch(/keyScope/);
    expect(issues(() => parse({ keyScope: { claim: '' } }))).toMatch(/keyScope/);
    expect(issues(() => parse({ keyScope: { claim: 'tenant id' } }))).toMatch(/keyScope/);
    expect(parse({ keyScope: { claim: 'https://example.com/tenant' } }).routes[0]!.keyScope).toEqual({ claim: 'https://example.com/tenant' });
  });

  it('refused on an mcp route, as a header scope is', () => {
    expect(issues(() => parse({ protocol: 'mcp', match: { path: '/mcp' }, keyScope: { claim: 'tid' } }))).toMatch(/keyScope.*does not apply to an mcp route/);
  });

  it('a header scope and a claim scope with one value are distinct scopes', () => {
    const config = parse({ keyScope: { claim: 'tid' } });
    const claimRoute = config.routes[0]!;
    const headerRoute = { ...claimRoute, keyScope: { header: 'X-Tenant' } };
    expect(keyScopeOf(claimRoute, 'billing', 'acme')).not.toBe(keyScopeOf(headerRoute, 'billing', 'acme'));
  });
});

describe('the verifier keeps only the claims routes ask for', () => {
  it('caller.claims holds the named string or integer claims, nothing else of the payload', async () => {
    const keys = verificationKeys(hsAuth() as any, {}, 'auth');
    const verify = createTokenVerifier({ keys, issuer: ISSUER, audience: AUDIENCE, claims: ['tid', 'org', 'flag'] });
    const check = await verify(await tenantToken({ tid: 'acme', org: 7, flag: true, email: 'a@example.test' }));
    expect(check.ok && check.caller.claims).toEqual({ tid: 'acme', org: '7' });
    const none = await createTokenVerifier({ keys, issuer: ISSUER, audience: AUDIENCE })(await tenantToken({ tid: 'acme' }));
    expect(none.ok && none.caller.claims).toEqual({});
  });
});
