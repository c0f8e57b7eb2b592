/**
 * Who reaches the `/v1` admin API of a Worker. A Worker sees no connection
 * address and the request URL's host is the client's `Host` header, so the
 * decision must come from the deployment (FENCEGATE_ADMIN, caller auth),
 * never from the request. Inside workerd, through the Worker's own `fetch`,
 * with wrangler.toml's bindings (its FENCEGATE_ADMIN included).
 */
import { createExecutionContext, waitOnExecutionContext } from 'cloudflare:test';
import { env } from 'cloudflare:workers';
import { describe, expect, inject, it } from 'vitest';
import worker, { type WorkerEnv } from '../../src/entry/worker.js';
import { token } from '../auth/tokens.js';

const upstreamUrl = inject('upstreamUrl');
const SECRET = 'x'.repeat(40);
const auth = { secret: { env: 'FENCEGATE_AUTH_SECRET' }, issuer: 'https://issuer.example', audience: 'fencegate' };

function configText(over: Record<string, unknown> = {}): string {
  return JSON.stringify({
    store: { d1: 'DB' },
    routes: [{ name: 'payments', match: { path: '/payments/*', methods: ['POST'] }, upstream: upstreamUrl, timeoutMs: 1_500 }],
    ...over,
  });
}

/** A deployment: wrangler.toml's vars (FENCEGATE_ADMIN = "auth") unless overridden. */
const deployment = (over: Record<string, unknown> = {}): WorkerEnv => ({ ...env, FENCEGATE_CONFIG: configText(), FENCEGATE_LOG_LEVEL: 'error', ...over });

async function call(url: string, e: WorkerEnv, headers: Record<string, string> = {}): Promise<Response> {
  const ctx = createExecutionContext();
  const res = await worker.fetch(new Request(url, { headers }), e, ctx);
  const body = await res.text();
  await waitOnExecutionContext(ctx);
  return new Response(body, { status: res.status, headers: res.headers });
}

/** What a client can claim: the URL workerd builds from its Host header, and the header itself. */
const LOCAL_HOSTS = ['127.0.0.1', 'localhost', '[::1]', '127.1.2.3'];
const asHost = (host: string, path: string, e: WorkerEnv, headers: Record<string, string> = {}) => call(`http://${host}${path}`, e, { host, ...headers });

const auditToken = (scope: string) => token({ scope, sub: 'auditor', iss: auth.issuer, aud: auth.audience, key: new TextEncoder().encode(SECRET) });

describe('the Workers admin API is decided by configuration, never by Host', () => {
  it('wrangler.toml ships FENCEGATE_ADMIN = "auth"', () => {
    expect((env as unknown as WorkerEnv).FENCEGATE_ADMIN).toBe('auth');
  });

  it('a request claiming Host: 127.0.0.1 (or any loopback name) to a deployment without auth does not reach the admin API', async () => {
    for (const e of [deployment(), deployment({ FENCEGATE_ADMIN: undefined }), deployment({ FENCEGATE_ADMIN: 'loopback' })]) {
      for (const host of LOCAL_HOSTS) {
        for (const path of ['/_fencegate/v1/rejections', '/_fencegate/v1/entities/tool-job%3A1', '/_fencegate/metrics']) {
          const res = await asHost(host, path, e);
          expect(res.status, `${e.FENCEGATE_ADMIN} ${host} ${path}`).toBe(404);
          expect(((await res.json()) as { type: string }).type).toMatch(/\/admin-disabled$/);
        }
      }
      // Health is not admin data: it always answers.
      expect((await asHost('127.0.0.1', '/_fencegate/health', e)).status).toBe(200);
    }
  });

  it('negative control: the same Host: 127.0.0.1 request reaches the admin API when the deployment says "on"', async () => {
    const local = deployment({ FENCEGATE_ADMIN: 'on' });
    for (const host of [...LOCAL_HOSTS, 'gateway.example']) {
      const res = await asHost(host, '/_fencegate/v1/rejections', local);
      expect(res.status, host).toBe(200);
      expect(await res.json()).toMatchObject({ items: expect.any(Array) });
    }
    expect((await asHost('127.0.0.1', '/_fencegate/v1/rejections', deployment({ FENCEGATE_ADMIN: 'off' }))).status).toBe(404);
  });

  it('with caller auth, every host gets the admin API behind its scopes; a loopback Host earns nothing', async () => {
    const withAuth = deployment({ FENCEGATE_CONFIG: configText({ auth }), FENCEGATE_AUTH_SECRET: SECRET });
    for (const host of ['127.0.0.1', 'gateway.example']) {
      const anonymous = await asHost(host, '/_fencegate/v1/rejections', withAuth);
      expect(anonymous.status, host).toBe(401);
      expect(anonymous.headers.get('www-authenticate')).toMatch(/^Bearer/);
    }
    const proxyOnly = await asHost('127.0.0.1', '/_fencegate/v1/rejections', withAuth, { authorization: `Bearer ${await auditToken('fencegate:proxy')}` });
    expect(proxyOnly.status).toBe(403);
    const auditor = await call('https://gateway.example/_fencegate/v1/rejections', withAuth, {
      authorization: `Bearer ${await auditToken('fencegate:audit')}`,
    });
    expect(auditor.status).toBe(200);
    // "off" wins over auth.
    const off = await call(
      'https://gateway.example/_fencegate/v1/rejections',
      { ...withAuth, FENCEGATE_ADMIN: 'off' },
      { authorization: `Bearer ${await auditToken('fencegate:audit')}` },
    );
    expect(off.status).toBe(404);
  });

  it('an unknown FENCEGATE_ADMIN value fails closed: 500 for every request, nothing forwarded', async () => {
    const typo = deployment({ FENCEGATE_ADMIN: 'yes' });
    const admin = await call('http://127.0.0.1/_fencegate/v1/rejections', typo);
    expect(admin.status).toBe(500);
    expect(admin.headers.get('content-type')).toBe('application/problem+json');
    const key = `admin-typo-${Date.now().toString(36)}`;
    const ctx = createExecutionContext();
    const res = await worker.fetch(
      new Request('http://127.0.0.1/payments/x', {
        method: 'POST',
        headers: { 'x-execution-fence': '1', 'x-fence-entity': key, 'idempotency-key': key },
        body: '{}',
      }),
      typo,
      ctx,
    );
    await res.arrayBuffer();
    await waitOnExecutionContext(ctx);
    expect(res.status).toBe(500);
    const calls = (await (await fetch(`${upstreamUrl}/__calls?key=${encodeURIComponent(key)}`)).json()) as unknown[];
    expect(calls).toEqual([]);
  });
});
