import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { exportJWK, exportSPKI, generateKeyPair, SignJWT } from 'jose';
import { afterEach, describe, expect, it } from 'vitest';
import { createJsonLogger } from '../../src/http/logger.js';
import type { SqliteGatewayStore } from '../../src/store/sqlite/gateway-store.js';
import { command, expectProblem, paymentsRoute, startTestGateway, tempDir, type RouteInput, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { AUDIENCE, bearer, hsAuth, ISSUER, SECRET, token, unsignedToken } from './tokens.js';

// Caller authentication (DESIGN §3.2): bearer JWTs verified with jose, scopes,
// every refusal in the rejection log without the token. Real gateway server
// on loopback, real SQLite file, recording upstream.

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function upstream(): Promise<FakeUpstream> {
  const u = await startUpstream();
  cleanups.push(() => u.close());
  return u;
}

interface Started extends TestGateway {
  logs: string[];
}

async function gateway(routes: RouteInput[], config: Record<string, unknown>): Promise<Started> {
  const logs: string[] = [];
  const gw = await startTestGateway({ routes, config, logger: createJsonLogger({ write: (l) => logs.push(l) }) });
  cleanups.unshift(() => gw.close());
  return Object.assign(gw, { logs });
}

/** Every row of every table, as text: what an attacker with the database file would see. */
function dumpDb(store: SqliteGatewayStore): string {
  const tables = store.db.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all() as { name: string }[];
  return tables
    .map(({ name }) =>
      JSON.stringify(store.db.prepare(`SELECT * FROM "${name}"`).safeIntegers(true).all(), (_k, v) =>
        typeof v === 'bigint' ? v.toString() : Buffer.isBuffer(v) ? v.toString('latin1') : v,
      ),
    )
    .join('\n');
}

function expectNoLeak(gw: Started, tokens: string[]): void {
  const db = dumpDb(gw.sqlite);
  const logs = gw.logs.join('\n');
  for (const t of tokens) {
    const signature = t.split('.')[2];
    expect(db).not.toContain(t);
    expect(logs).not.toContain(t);
    if (signature && signature.length > 8) {
      expect(db).not.toContain(signature);
      expect(logs).not.toContain(signature);
    }
  }
}

function rejections(gw: TestGateway): { reason: string; caller: string | null; detail: string | null; path: string; payload_sha256: string | null }[] {
  return gw.sqlite.db.prepare('SELECT * FROM rejections ORDER BY id').all() as any[];
}

const send = (gw: TestGateway, headers: Record<string, string>, r: { fence?: number; key?: string; entity?: string } = {}) =>
  command(gw.url, '/payments/charges', { fence: r.fence ?? 1, entity: r.entity ?? 'tool-job:1', key: r.key ?? 'k1', headers });

describe('caller auth on the proxy (HS256)', () => {
  it('a token with fencegate:proxy is forwarded; the gateway credential never reaches the upstream', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url, { upstreamHeaders: { Authorization: 'Bearer upstream-api-key' } })], { auth: hsAuth() });
    const t = await token({ sub: 'billing' });
    const res = await send(gw, bearer(t));
    expect(res.status).toBe(201);
    expect(up.calls).toHaveLength(1);
    expect(up.calls[0]!.headers.authorization).toBe('Bearer upstream-api-key');
    expect(JSON.stringify(up.calls[0]!.rawHeaders)).not.toContain(t);

    // Without upstream credentials configured, the header is simply dropped.
    const up2 = await upstream();
    const gw2 = await gateway([paymentsRoute(up2.url)], { auth: hsAuth() });
    expect((await send(gw2, bearer(t))).status).toBe(201);
    expect(up2.calls[0]!.headers.authorization).toBeUndefined();
  });

  it('every bad token is 401 unauthorized, nothing is forwarded, and each is logged without the token', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], { auth: hsAuth() });
    const otherSecret = new TextEncoder().encode('another-secret-0123456789-abcdefghijklmn');
    const cases: [string, Record<string, string>, RegExp][] = [
      ['no Authorization header', {}, /no bearer token/],
      ['Basic credentials', { authorization: 'Basic YmlsbGluZzpwYXNzd29yZA==' }, /not "Bearer <token>"/],
      ['alg none', bearer(unsignedToken()), /alg none/],
      ['alg none, lower case', bearer(unsignedToken().replace(/^[^.]+/, Buffer.from('{"alg":"None"}').toString('base64url'))), /alg none/],
      ['signed with another secret', bearer(await token({ key: otherSecret })), /signature verification failed/],
      ['expired', bearer(await token({ expIn: -60 })), /expired/],
      ['wrong audience', bearer(await token({ aud: 'someone-else' })), /wrong audience/],
      ['wrong issuer', bearer(await token({ iss: 'https://evil.invalid' })), /wrong issuer/],
      ['no sub', bearer(await token({ sub: '' })), /no sub claim/],
      [
        'HS512, not in the allow-list',
        bearer(await token({ alg: 'HS512', key: new TextEncoder().encode(SECRET + SECRET) })),
        /not allowed|no .* key|verification failed/,
      ],
      ['garbage', bearer('abc.def.ghi'), /malformed/],
    ];
    const sent: string[] = [];
    for (const [name, headers, why] of cases) {
      const res = await send(gw, headers, { key: `k-${sent.length}` });
      const body = await expectProblem(res, 401, 'unauthorized');
      expect(res.headers.get('www-authenticate'), name).toMatch(/^Bearer realm="fencegate"/);
      expect(body.request_id, name).toEqual(expect.any(String));
      expect(JSON.stringify(body), name).not.toContain(headers.authorization ?? '\u0000');
      if (headers.authorization) sent.push(headers.authorization.replace(/^\S+ /, ''));
      const row = rejections(gw).at(-1)!;
      expect(row, name).toMatchObject({ reason: 'unauthorized', caller: null, path: '/payments/charges', payload_sha256: null });
      expect(row.detail, name).toMatch(why);
    }
    expect(up.effects).toBe(0);
    expect(rejections(gw)).toHaveLength(cases.length);
    // The detail carries a short hash to correlate repeated attempts, never the token.
    expect(rejections(gw)[4]!.detail).toMatch(/token sha256 [0-9a-f]{16}$/);
    expectNoLeak(gw, sent);
    // No state: no entity, no record.
    expect(gw.sqlite.db.prepare('SELECT count(*) AS n FROM fence_entities').get()).toEqual({ n: 0 });
    expect(gw.sqlite.db.prepare('SELECT count(*) AS n FROM idempotency_records').get()).toEqual({ n: 0 });
  });

  it('a valid token without fencegate:proxy is 403 forbidden, logged with its caller', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], { auth: hsAuth() });
    const t = await token({ sub: 'auditor-1', scope: 'fencegate:audit fencegate:admin' });
    const res = await send(gw, bearer(t));
    await expectProblem(res, 403, 'forbidden');
    expect(res.headers.get('www-authenticate')).toBe('Bearer realm="fencegate", error="insufficient_scope", scope="fencegate:proxy"');
    expect(rejections(gw)).toMatchObject([{ reason: 'forbidden', caller: 'auditor-1' }]);
    expect(rejections(gw)[0]!.detail).toMatch(/^missing scope fencegate:proxy; token sha256 /);
    // `scp` as an array works as well as `scope`.
    const scp = await new SignJWT({ scp: ['fencegate:proxy'] })
      .setProtectedHeader({ alg: 'HS256' })
      .setIssuer(ISSUER)
      .setAudience(AUDIENCE)
      .setSubject('billing')
      .setExpirationTime('5m')
      .sign(new TextEncoder().encode(SECRET));
    expect((await send(gw, bearer(scp))).status).toBe(201);
    expect(up.effects).toBe(1);
    expectNoLeak(gw, [t, scp]);
  });

  it('404 no-route comes before auth (decision order), and is not logged', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], { auth: hsAuth() });
    await expectProblem(await command(gw.url, '/nothing/here', { fence: 1, entity: 'e', key: 'k' }), 404, 'no-route');
    expect(rejections(gw)).toHaveLength(0);
  });

  it('on a Stripe-shaped route, auth refusals are Stripe errors', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url, { errors: 'stripe' })], { auth: hsAuth() });
    const res = await send(gw, {});
    expect(res.status).toBe(401);
    expect(res.headers.get('stripe-should-retry')).toBe('false');
    const body = (await res.json()) as any;
    expect(body.error).toMatchObject({ type: 'invalid_request_error', code: 'unauthorized' });
  });

  it('idempotency keys are scoped per caller; workers of one caller share them', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], { auth: hsAuth() });
    const billing = await token({ sub: 'billing' });
    const shipping = await token({ sub: 'shipping' });
    const a = await send(gw, bearer(billing), { key: 'order-1', entity: 'job:a', fence: 1 });
    const b = await send(gw, bearer(shipping), { key: 'order-1', entity: 'job:b', fence: 1 });
    expect([a.status, b.status]).toEqual([201, 201]);
    expect(up.effects).toBe(2);
    // Another worker of the same caller (same sub) retrying the key gets the replay.
    const again = await send(gw, bearer(await token({ sub: 'billing' })), { key: 'order-1', entity: 'job:a', fence: 1 });
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(up.effects).toBe(2);
    const scopes = (gw.sqlite.db.prepare('SELECT scope FROM idempotency_records ORDER BY scope').all() as { scope: string }[]).map((r) => r.scope);
    expect(scopes).toEqual(['payments\u0000billing', 'payments\u0000shipping']);
    // The caller is in the rejection log of a decision taken by the store.
    await expectProblem(await send(gw, bearer(shipping), { key: 'late', entity: 'job:a', fence: 0 }), 409, 'stale-fence');
    expect(rejections(gw)).toMatchObject([{ reason: 'stale-fence', caller: 'shipping' }]);
  });

  it('callerClaim names the caller from another claim', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], { auth: hsAuth({ callerClaim: 'client_id' }) });
    const t = await new SignJWT({ scope: 'fencegate:proxy', client_id: 'svc-7' })
      .setProtectedHeader({ alg: 'HS256' })
      .setIssuer(ISSUER)
      .setAudience(AUDIENCE)
      .setSubject('user-1')
      .setExpirationTime('5m')
      .sign(new TextEncoder().encode(SECRET));
    expect((await send(gw, bearer(t))).status).toBe(201);
    expect(gw.sqlite.db.prepare('SELECT scope FROM idempotency_records').get()).toEqual({ scope: 'payments\u0000svc-7' });
  });
});

describe('public keys: ES256 (PEM), EdDSA (JWKS file), RS256 (PEM file)', () => {
  it('each algorithm verifies with its configured key only; alg confusion is refused', async () => {
    const tmp = tempDir();
    cleanups.push(() => tmp.cleanup());
    const es = await generateKeyPair('ES256', { extractable: true });
    const ed = await generateKeyPair('EdDSA', { extractable: true });
    const rs = await generateKeyPair('RS256', { extractable: true });
    const esPem = await exportSPKI(es.publicKey);
    const jwksPath = join(tmp.dir, 'jwks.json');
    writeFileSync(jwksPath, JSON.stringify({ keys: [{ ...(await exportJWK(ed.publicKey)), kid: 'ed-1', alg: 'EdDSA', use: 'sig' }] }));
    const rsPath = join(tmp.dir, 'rs.pem');
    writeFileSync(rsPath, await exportSPKI(rs.publicKey));

    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], {
      auth: {
        issuer: ISSUER,
        audience: AUDIENCE,
        publicKeys: [
          { alg: 'ES256', pem: esPem },
          { alg: 'RS256', file: rsPath },
        ],
        jwksFile: jwksPath,
      },
    });
    let n = 0;
    const ok = async (t: string) => expect((await send(gw, bearer(t), { key: `ok-${n++}` })).status).toBe(201);
    const refused = async (t: string, why: RegExp) => {
      await expectProblem(await send(gw, bearer(t), { key: `no-${n++}` }), 401, 'unauthorized');
      expect(rejections(gw).at(-1)!.detail).toMatch(why);
    };
    await ok(await token({ alg: 'ES256', key: es.privateKey }));
    await ok(await token({ alg: 'EdDSA', key: ed.privateKey, kid: 'ed-1' }));
    await ok(await token({ alg: 'RS256', key: rs.privateKey }));

    const es2 = await generateKeyPair('ES256');
    await refused(await token({ alg: 'ES256', key: es2.privateKey }), /signature verification failed/);
    const ed2 = await generateKeyPair('EdDSA');
    await refused(await token({ alg: 'EdDSA', key: ed2.privateKey, kid: 'ed-1' }), /signature verification failed/);
    // HS256 "signed" with the public key's PEM as the secret: no HS256 key is configured.
    await refused(await token({ alg: 'HS256', key: new TextEncoder().encode(esPem) }), /no HS256 secret|not allowed/);
    expect(up.effects).toBe(3);
  });

  it('a key file that cannot be read stops start-up, naming the field', async () => {
    const up = await upstream();
    await expect(
      startTestGateway({ routes: [paymentsRoute(up.url)], config: { auth: { issuer: ISSUER, audience: AUDIENCE, jwksFile: '/nonexistent/jwks.json' } } }),
    ).rejects.toThrow(/auth\.jwksFile: cannot read/);
    await expect(
      startTestGateway({
        routes: [paymentsRoute(up.url)],
        config: { auth: { issuer: ISSUER, audience: AUDIENCE, secret: { env: 'FG_TEST_UNSET_SECRET' } } },
        env: {},
      }),
    ).rejects.toThrow(/auth\.secret: environment variable FG_TEST_UNSET_SECRET is not set/);
  });
});

describe('the admin API with auth', () => {
  it('401 without a token, 403 with the proxy scope only, audit scope reads, admin scope writes', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], { auth: hsAuth() });
    const v1 = `${gw.url}/_fencegate/v1`;
    const resolve = (headers: Record<string, string>) =>
      fetch(`${v1}/idempotency/nope/resolve`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: '{"outcome":"released"}' });

    await expectProblem(await fetch(`${v1}/rejections`), 401, 'unauthorized');
    const proxyOnly = await token({ sub: 'worker', scope: 'fencegate:proxy' });
    await expectProblem(await fetch(`${v1}/rejections`, { headers: bearer(proxyOnly) }), 403, 'forbidden');
    const audit = await token({ sub: 'auditor', scope: 'fencegate:audit' });
    const page = await fetch(`${v1}/rejections`, { headers: bearer(audit) });
    expect(page.status).toBe(200);
    expect(((await page.json()) as any).items.map((r: any) => r.reason)).toEqual(['forbidden', 'unauthorized']);
    await expectProblem(await resolve(bearer(audit)), 403, 'forbidden');
    const admin = await token({ sub: 'operator', scope: 'fencegate:admin' });
    // Admin implies audit; the key is unknown, so the answer is past auth: 404.
    expect((await fetch(`${v1}/rejections`, { headers: bearer(admin) })).status).toBe(200);
    await expectProblem(await resolve(bearer(admin)), 404, 'not-found');
    // Health, problem descriptions and the console page need no token.
    expect((await fetch(`${gw.url}/_fencegate/health`)).status).toBe(200);
    expect((await fetch(`${gw.url}/_fencegate/problems/unauthorized`)).status).toBe(200);
    expect((await fetch(`${gw.url}/_fencegate/console`)).status).toBe(200);
    expect(rejections(gw).map((r) => [r.reason, r.caller, r.path])).toEqual([
      ['unauthorized', null, '/_fencegate/v1/rejections'],
      ['forbidden', 'worker', '/_fencegate/v1/rejections'],
      ['forbidden', 'auditor', '/_fencegate/v1/idempotency/nope/resolve'],
    ]);
    expectNoLeak(gw, [proxyOnly, audit, admin]);
  });

  it('with auth the admin API answers on a non-loopback listener; without auth it stays disabled there', async () => {
    const up = await upstream();
    const on = await gateway([paymentsRoute(up.url)], { auth: hsAuth(), listen: { host: '0.0.0.0', port: 0 } });
    const port = new URL(on.url).port;
    const audit = await token({ scope: 'fencegate:audit' });
    expect((await fetch(`http://127.0.0.1:${port}/_fencegate/v1/rejections`, { headers: bearer(audit) })).status).toBe(200);
    await expectProblem(await fetch(`http://127.0.0.1:${port}/_fencegate/v1/rejections`), 401, 'unauthorized');

    const off = await gateway([paymentsRoute(up.url)], { listen: { host: '0.0.0.0', port: 0 } });
    const offPort = new URL(off.url).port;
    await expectProblem(await fetch(`http://127.0.0.1:${offPort}/_fencegate/v1/rejections`), 404, 'admin-disabled');
    await expectProblem(await fetch(`http://127.0.0.1:${offPort}/_fencegate/metrics`), 404, 'admin-disabled');
  });

  it('/metrics needs the audit scope unless configured public', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], { auth: hsAuth() });
    await expectProblem(await fetch(`${gw.url}/_fencegate/metrics`), 401, 'unauthorized');
    const m = await fetch(`${gw.url}/_fencegate/metrics`, { headers: bearer(await token({ scope: 'fencegate:audit' })) });
    expect(m.status).toBe(200);
    expect(await m.text()).toMatch(/^fencegate_rejection_log_rows 1$/m);

    const pub = await gateway([paymentsRoute(up.url)], { auth: hsAuth(), metrics: { public: true } });
    expect((await fetch(`${pub.url}/_fencegate/metrics`)).status).toBe(200);
  });
});

describe('without auth (no "auth" in the config)', () => {
  it('nothing is checked and the caller Authorization header still reaches the upstream, as before', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], {});
    const res = await send(gw, { authorization: 'Bearer for-the-upstream' });
    expect(res.status).toBe(201);
    expect(up.calls[0]!.headers.authorization).toBe('Bearer for-the-upstream');
    expect((await gw.admin('/v1/rejections')).status).toBe(200);
  });
});
