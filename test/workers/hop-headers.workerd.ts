/**
 * Fields a `Connection` header names are hop-by-hop (RFC 9110 §7.6.1) and
 * never reach the upstream (DESIGN §3.6), on Workers as on Node: inside
 * workerd, through the Worker's own `fetch`, to the recording upstream.
 *
 * Here the Worker gets the request as a JS `Request`, so it sees the
 * `Connection` header and the shared code (src/http/upstream-request.ts)
 * strips what it names. A request that came over HTTP into workerd's own
 * server arrives without `Connection` at all: that case, the platform's
 * limit, is checked against `wrangler dev` in wrangler-dev.test.ts.
 */
import { createExecutionContext, waitOnExecutionContext } from 'cloudflare:test';
import { env } from 'cloudflare:workers';
import { describe, expect, inject, it } from 'vitest';
import worker, { type WorkerEnv } from '../../src/entry/worker.js';

const upstreamUrl = inject('upstreamUrl');

const gatewayEnv: WorkerEnv = {
  ...env,
  FENCEGATE_LOG_LEVEL: 'error',
  FENCEGATE_CONFIG: JSON.stringify({
    store: { d1: 'DB' },
    routes: [{ name: 'payments', match: { path: '/payments/*', methods: ['POST'] }, upstream: upstreamUrl, timeoutMs: 1_500, stripHeaders: ['x-strip-me'] }],
  }),
};

let n = 0;
async function send(headers: Record<string, string>): Promise<Record<string, string | undefined>> {
  const key = `hop-${Date.now().toString(36)}-${++n}`;
  const ctx = createExecutionContext();
  const res = await worker.fetch(
    new Request('http://localhost/payments/charges', {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-fence-entity': `e-${key}`, 'x-execution-fence': '1', 'idempotency-key': key, ...headers },
      body: '{"amount":1}',
    }),
    gatewayEnv,
    ctx,
  );
  await res.arrayBuffer();
  await waitOnExecutionContext(ctx);
  expect(res.status).toBe(201);
  const calls = (await (await fetch(`${upstreamUrl}/__calls?key=${encodeURIComponent(key)}`)).json()) as { headers: Record<string, string | undefined> }[];
  expect(calls).toHaveLength(1);
  return calls[0]!.headers;
}

describe('Connection-named fields on Workers', () => {
  it('probe: a JS Request keeps the Connection header (workerd has no forbidden request headers)', () => {
    const req = new Request('http://localhost/', { headers: { connection: 'keep-alive, x-secret-hop', 'x-secret-hop': '1', 'keep-alive': 'timeout=5' } });
    const seen: Record<string, string> = {};
    req.headers.forEach((v, k) => (seen[k] = v));
    console.log(`PROBE connection js-request ${JSON.stringify(seen)}`);
    expect(seen).toEqual({ connection: 'keep-alive, x-secret-hop', 'keep-alive': 'timeout=5', 'x-secret-hop': '1' });
  });

  it('a field the Connection header names does not reach the upstream, nor Connection itself', async () => {
    const got = await send({ connection: 'keep-alive, x-secret-hop', 'x-secret-hop': '1', 'keep-alive': 'timeout=5' });
    expect(got['x-secret-hop']).toBeUndefined();
    expect(got['keep-alive']).toBeUndefined();
    // The upstream's connection header, if any, is workerd's own, never the caller's list.
    expect(got.connection ?? '').not.toMatch(/x-secret-hop/i);
  });

  it('negative control: without the Connection token the same field does reach the upstream (the check above can fail)', async () => {
    const got = await send({ connection: 'keep-alive', 'x-secret-hop': '1' });
    expect(got['x-secret-hop']).toBe('1');
  });

  it('Connection cannot strip a field the decision used (the idempotency key reaches the upstream)', async () => {
    const got = await send({ connection: 'idempotency-key, x-fence-entity' });
    expect(got['idempotency-key']).toMatch(/^hop-/);
    expect(got['x-fence-entity']).toMatch(/^e-hop-/);
  });

  it("the route's stripHeaders removes a field whatever Connection says (the workaround where Connection never arrives)", async () => {
    const got = await send({ 'x-strip-me': 'secret' });
    expect(got['x-strip-me']).toBeUndefined();
  });

  it('path and method override headers do not reach the upstream, as on Node (DESIGN §3.6); other fields do', async () => {
    const got = await send({
      'x-original-url': '/admin',
      'x-rewrite-url': '/admin',
      'x-http-method-override': 'DELETE',
      'x-http-method': 'PUT',
      'x-method-override': 'PATCH',
      x_original_url: '/admin',
      'x-keep-me': '1',
    });
    expect(
      ['x-original-url', 'x-rewrite-url', 'x-http-method-override', 'x-http-method', 'x-method-override', 'x_original_url'].filter((n) => got[n] !== undefined),
    ).toEqual([]);
    expect(got['x-keep-me']).toBe('1');
  });
});
