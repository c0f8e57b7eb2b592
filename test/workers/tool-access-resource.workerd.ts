/**
 * An mcp route's `toolAccess` and `auth.resource` on Workers, through the
 * Worker's own `fetch` inside workerd with the local D1 of wrangler.toml:
 * a denied tools/call is refused `tool-denied` and its row, with the tool,
 * is in D1's rejection log (the reason needs no migration: `reason` has no
 * CHECK); the protected resource metadata is served at its well-known path
 * and a proxied 401 names it.
 *
 * Negative controls: the same call on a route without the lists is not
 * refused as tool-denied; without `resource` the well-known path is no
 * document and the 401 names none.
 */
import { createExecutionContext, waitOnExecutionContext } from 'cloudflare:test';
import { env } from 'cloudflare:workers';
import { describe, expect, inject, it } from 'vitest';
import worker, { type WorkerEnv } from '../../src/entry/worker.js';

const upstreamUrl = inject('upstreamUrl');
let n = 0;
const uniq = (what: string) => `${what}-${Date.now().toString(36)}-${++n}`;
const AUTH = { secret: 'workerd-test-secret-0123456789-abcdefghij', issuer: 'https://id.test.invalid' };

function envOf(config: Record<string, unknown>): WorkerEnv {
  return { ...env, FENCEGATE_CONFIG: JSON.stringify({ store: { d1: 'DB' }, ...config }), FENCEGATE_LOG_LEVEL: 'error', FENCEGATE_ADMIN: 'on' };
}

async function call(workerEnv: WorkerEnv, path: string, init: RequestInit = {}): Promise<Response> {
  const ctx = createExecutionContext();
  const res = await worker.fetch(new Request(`http://localhost${path}`, init), workerEnv, ctx);
  const body = await res.arrayBuffer();
  await waitOnExecutionContext(ctx);
  return new Response(res.status === 204 ? null : body, { status: res.status, headers: res.headers });
}

const toolsCall = (name: string): RequestInit => ({
  method: 'POST',
  headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
  body: JSON.stringify({
    jsonrpc: '2.0',
    id: 1,
    method: 'tools/call',
    params: { name, arguments: {}, _meta: { 'io.fencegate/fence': '1', 'io.fencegate/entity': uniq('job'), 'io.fencegate/idempotency-key': uniq('k') } },
  }),
});

describe('toolAccess on Workers', () => {
  const workerEnv = envOf({
    routes: [
      { name: 'guarded', protocol: 'mcp', match: { path: '/mcp' }, upstream: upstreamUrl, timeoutMs: 1_500, toolAccess: { deny: ['delete_*'] } },
      { name: 'open', protocol: 'mcp', match: { path: '/open' }, upstream: upstreamUrl, timeoutMs: 1_500 },
    ],
  });

  it('a denied call is refused and logged in D1 with its tool; without the lists it is not', async () => {
    const refused = (await (await call(workerEnv, '/mcp', toolsCall('Delete_Everything'))).json()) as {
      error: { code: number; data: { type: string; request_id: string } };
    };
    expect(refused.error).toMatchObject({ code: -32013, data: { type: 'tool-denied' } });
    const res = await call(workerEnv, '/_fencegate/v1/rejections?reason=tool-denied&tool=Delete_Everything');
    expect(res.status).toBe(200);
    const rows = ((await res.json()) as { items: Record<string, unknown>[] }).items.filter((r) => r.request_id === refused.error.data.request_id);
    expect(rows).toMatchObject([{ reason: 'tool-denied', tool: 'Delete_Everything', path: '/mcp' }]);
    const open = await call(workerEnv, '/open', toolsCall('Delete_Everything'));
    expect(open.headers.get('x-fencegate-refusal')).not.toBe('tool-denied');
  });
});

describe('auth.resource on Workers', () => {
  const route = { name: 'm', protocol: 'mcp', match: { path: '/mcp' }, upstream: upstreamUrl };
  it('the metadata document at its well-known path, and the 401 names it; without resource neither', async () => {
    const on = envOf({ auth: { ...AUTH, resource: 'https://gw.example/mcp' }, routes: [route] });
    const doc = await call(on, '/.well-known/oauth-protected-resource/mcp');
    expect(doc.status).toBe(200);
    expect(await doc.json()).toMatchObject({ resource: 'https://gw.example/mcp', authorization_servers: [AUTH.issuer] });
    const denied = await call(on, '/mcp', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"jsonrpc":"2.0","id":1,"method":"ping"}',
    });
    expect(denied.status).toBe(401);
    expect(denied.headers.get('www-authenticate')).toContain('resource_metadata="https://gw.example/.well-known/oauth-protected-resource/mcp"');

    const off = envOf({ auth: { ...AUTH, audience: 'fencegate' }, routes: [route] });
    expect((await call(off, '/.well-known/oauth-protected-resource/mcp')).status).toBe(404);
    expect((await call(off, '/mcp', { method: 'POST', body: '{}' })).headers.get('www-authenticate')).not.toContain('resource_metadata');
  });
});
