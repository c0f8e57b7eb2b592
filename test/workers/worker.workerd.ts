/**
 * End to end through the Worker's own `fetch` and `scheduled` handlers,
 * inside workerd, with the local D1 of wrangler.toml and a real (Node) fake
 * upstream on 127.0.0.1 that the Worker reaches with its real `fetch`
 * (fake-upstream.setup.ts). Every test uses its own entity and keys.
 */
import { createExecutionContext, createScheduledController, waitOnExecutionContext } from 'cloudflare:test';
import { env } from 'cloudflare:workers';
import { describe, expect, inject, it } from 'vitest';
import worker, { type WorkerEnv } from '../../src/entry/worker.js';
import { createD1Store } from '../../src/store/d1/index.js';

const upstreamUrl = inject('upstreamUrl');
const refusedUrl = inject('refusedUrl');

let n = 0;
const uniq = (what: string) => `${what}-${Date.now().toString(36)}-${++n}`;

function configText(over: Record<string, unknown> = {}): string {
  return JSON.stringify({
    store: { d1: 'DB' },
    routes: [
      {
        name: 'payments',
        match: { path: '/payments/*', methods: ['POST'] },
        upstream: upstreamUrl,
        upstreamHeaders: { authorization: { env: 'UPSTREAM_TOKEN', prefix: 'Bearer ' } },
        timeoutMs: 1_500,
        lockMarginMs: 500,
      },
      { name: 'down', match: { path: '/down/*', methods: ['POST'] }, upstream: refusedUrl, timeoutMs: 1_500 },
      { name: 'flaky', match: { path: '/flaky/*', methods: ['POST'] }, upstream: upstreamUrl, onUnknown: 'retry', timeoutMs: 1_500 },
    ],
    ...over,
  });
}

/**
 * One Worker environment: wrangler.toml's bindings, a test config and the
 * upstream secret; the admin API on without auth, as under `wrangler dev`
 * (who reaches it on a deployment: admin-access.workerd.ts).
 */
const workerEnv = (over: Record<string, unknown> = {}): WorkerEnv => ({
  ...env,
  FENCEGATE_CONFIG: configText(),
  FENCEGATE_LOG_LEVEL: 'error',
  FENCEGATE_ADMIN: 'on',
  UPSTREAM_TOKEN: 'sekret',
  ...over,
});
const gatewayEnv = workerEnv();

async function call(path: string, init: RequestInit = {}, e: WorkerEnv = gatewayEnv, origin = 'http://localhost'): Promise<Response> {
  const ctx = createExecutionContext();
  const res = await worker.fetch(new Request(origin + path, init), e, ctx);
  const body = await res.arrayBuffer();
  await waitOnExecutionContext(ctx);
  return new Response(res.status === 204 ? null : body, { status: res.status, headers: res.headers });
}

function pay(entity: string, key: string, fence: string, extra: Record<string, string> = {}, body = '{"amount":100}'): RequestInit {
  return {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-execution-fence': fence, 'x-fence-entity': entity, 'idempotency-key': key, ...extra },
    body,
  };
}

interface UpstreamCall {
  seq: number;
  fence: string | null;
  entity: string | null;
  key: string | null;
  headers: Record<string, string | undefined>;
  inflightForEntity: number;
}
async function upstreamCalls(key?: string): Promise<UpstreamCall[]> {
  const res = await fetch(`${upstreamUrl}/__calls${key === undefined ? '' : `?key=${encodeURIComponent(key)}`}`);
  return (await res.json()) as UpstreamCall[];
}

describe('the HTTP contract through the Worker', () => {
  it('forwards a payment once, with the fencing headers and the secret; the retry is replayed', async () => {
    const entity = uniq('tool-job');
    const key = uniq('pay');
    const first = await call('/payments/charges?currency=eur', pay(entity, key, '1', { 'cf-connecting-ip': '192.0.2.1' }));
    expect(first.status).toBe(201);
    const body = await first.text();
    expect(JSON.parse(body)).toMatchObject({ entity, key, fence: '1' });
    expect(first.headers.get('idempotent-replayed')).toBeNull();

    const [sent, ...more] = await upstreamCalls(key);
    expect(more).toEqual([]);
    expect(sent!.headers).toMatchObject({ authorization: 'Bearer sekret', 'x-execution-fence': '1', 'x-fence-entity': entity, 'idempotency-key': key });
    expect(sent!.headers['cf-connecting-ip']).toBeUndefined();

    const replay = await call('/payments/charges?currency=eur', pay(entity, key, '1'));
    expect(replay.status).toBe(201);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await replay.text()).toBe(body);
    // Allow-listed headers come back; Set-Cookie never does.
    expect(replay.headers.get('etag')).toBe(first.headers.get('etag'));
    expect(first.headers.get('set-cookie')).not.toBeNull();
    expect(replay.headers.get('set-cookie')).toBeNull();
    expect(await upstreamCalls(key)).toHaveLength(1);
  });

  it('refuses a stale fence with 409 problem+json and shows it under /_fencegate/v1/rejections', async () => {
    const entity = uniq('tool-job');
    expect((await call('/payments/charges', pay(entity, uniq('pay'), '5'))).status).toBe(201);
    const staleKey = uniq('pay');
    const stale = await call('/payments/charges', pay(entity, staleKey, '4'));
    expect(stale.status).toBe(409);
    expect(stale.headers.get('content-type')).toBe('application/problem+json');
    const problem = (await stale.json()) as Record<string, unknown>;
    expect(problem.type).toMatch(/\/stale-fence$/);
    expect(problem).toMatchObject({ status: 409, entity, presented_fence: '4', current_fence: '5' });
    expect(await upstreamCalls(staleKey)).toEqual([]);

    const log = await call(`/_fencegate/v1/rejections?entity=${encodeURIComponent(entity)}`);
    expect(log.status).toBe(200);
    const { items } = (await log.json()) as { items: Record<string, unknown>[] };
    expect(items).toHaveLength(1);
    expect(items[0]).toMatchObject({ reason: 'stale-fence', entity, presented_fence: '4', current_fence: '5', idempotency_key: staleKey });
  });

  it('refuses malformed fences with 400 before anything is stored or sent', async () => {
    const entity = uniq('tool-job');
    for (const fence of ['+1', '1.0', '1, 2', '01', '9223372036854775808', '']) {
      const key = uniq('pay');
      const res = await call('/payments/charges', pay(entity, key, fence));
      expect(res.status, `fence ${JSON.stringify(fence)}`).toBe(400);
      expect(((await res.json()) as { type: string }).type).toMatch(/\/invalid-fence$/);
      expect(await upstreamCalls(key)).toEqual([]);
    }
    expect((await call(`/_fencegate/v1/entities/${encodeURIComponent(entity)}`)).status).toBe(404);
  });

  it('a reused key with another body gets 422 and is logged', async () => {
    const entity = uniq('tool-job');
    const key = uniq('pay');
    await call('/payments/charges', pay(entity, key, '1'));
    const other = await call('/payments/charges', pay(entity, key, '1', {}, '{"amount":999}'));
    expect(other.status).toBe(422);
    expect(await upstreamCalls(key)).toHaveLength(1);
  });

  it('serves the admin API as FENCEGATE_ADMIN says, whatever the hostname', async () => {
    expect((await call('/_fencegate/v1/rejections', {}, workerEnv({ FENCEGATE_ADMIN: 'auth' }))).status).toBe(404);
    expect((await call('/_fencegate/health', {}, workerEnv({ FENCEGATE_ADMIN: 'auth' }))).status).toBe(200);
    expect((await call('/_fencegate/v1/rejections', {}, workerEnv({ FENCEGATE_ADMIN: 'off' }))).status).toBe(404);
    expect((await call('/_fencegate/v1/rejections', {}, gatewayEnv, 'https://gateway.example')).status).toBe(200);
  });

  it('with caller auth configured, the admin API answers on any hostname, behind its bearer tokens', async () => {
    const auth = { secret: { env: 'FENCEGATE_AUTH_SECRET' }, issuer: 'https://issuer.example', audience: 'fencegate' };
    const withAuth = workerEnv({ FENCEGATE_CONFIG: configText({ auth }), FENCEGATE_AUTH_SECRET: 'x'.repeat(40) });
    const res = await call('/_fencegate/v1/rejections', {}, withAuth, 'https://gateway.example');
    expect(res.status).toBe(401);
    expect(res.headers.get('www-authenticate')).toMatch(/^Bearer/);
    // The proxy wants a token too; nothing reaches the upstream without one.
    const key = uniq('pay');
    expect((await call('/payments/charges', pay(uniq('tool-job'), key, '1'), withAuth)).status).toBe(401);
    expect(await upstreamCalls(key)).toEqual([]);
  });
});

describe('fetch forwarding on Workers', () => {
  it('stores and forwards the decoded body when fetch decoded gzip, without content-encoding', async () => {
    const entity = uniq('tool-job');
    const key = uniq('pay');
    const first = await call('/payments/charges', pay(entity, key, '1', { 'x-upstream': 'gzip' }));
    expect(first.status).toBe(201);
    expect(first.headers.get('content-encoding')).toBeNull();
    expect(JSON.parse(await first.text())).toMatchObject({ key });
    const replay = await call('/payments/charges', pay(entity, key, '1', { 'x-upstream': 'gzip' }));
    expect(replay.headers.get('content-encoding')).toBeNull();
    expect(JSON.parse(await replay.text())).toMatchObject({ key });
    // The gateway asked only for what workerd decodes.
    expect((await upstreamCalls(key))[0]!.headers['accept-encoding']).toBe('gzip, br');
  });

  it('keeps content-encoding and the raw bytes for a coding fetch did not decode (deflate)', async () => {
    const key = uniq('pay');
    const first = await call('/payments/charges', pay(uniq('tool-job'), key, '1', { 'x-upstream': 'deflate' }));
    expect(first.headers.get('content-encoding')).toBe('deflate');
    const plain = await new Response(first.body!.pipeThrough(new DecompressionStream('deflate'))).text();
    expect(JSON.parse(plain)).toMatchObject({ key });
  });

  it('serial mode: two requests for one entity never overlap upstream; the second waits and goes', async () => {
    const entity = uniq('tool-job');
    const [a, b] = await Promise.all([
      call('/payments/charges', pay(entity, uniq('pay'), '1', { 'x-upstream': 'delay=300' })),
      call('/payments/charges', pay(entity, uniq('pay'), '1', { 'x-upstream': 'delay=300' })),
    ]);
    expect([a.status, b.status]).toEqual([201, 201]);
    const calls = (await upstreamCalls()).filter((c) => c.entity === entity);
    expect(calls).toHaveLength(2);
    expect(calls.map((c) => c.inflightForEntity)).toEqual([1, 1]);
  });

  it('20 parallel identical requests reach the upstream once; with Prefer: wait all get the same answer', async () => {
    const entity = uniq('tool-job');
    const key = uniq('pay');
    const answers = await Promise.all(
      Array.from({ length: 20 }, () => call('/payments/charges', pay(entity, key, '1', { 'x-upstream': 'delay=200', prefer: 'wait=10' }))),
    );
    expect(answers.map((r) => r.status)).toEqual(Array(20).fill(201));
    const bodies = new Set(await Promise.all(answers.map((r) => r.text())));
    expect(bodies.size).toBe(1);
    expect(answers.filter((r) => r.headers.get('idempotent-replayed') === 'true')).toHaveLength(19);
    expect(await upstreamCalls(key)).toHaveLength(1);
  });

  it('an upstream timeout is outcome_unknown (504); the retry is refused, not re-sent', async () => {
    const entity = uniq('tool-job');
    const key = uniq('pay');
    const slow = await call('/payments/charges', pay(entity, key, '1', { 'x-upstream': 'delay=2500' }));
    expect(slow.status).toBe(504);
    expect(((await slow.json()) as { type: string }).type).toMatch(/\/upstream-timeout$/);
    const retry = await call('/payments/charges', pay(entity, key, '1', { 'x-upstream': 'delay=2500' }));
    expect(retry.status).toBe(409);
    expect(((await retry.json()) as { type: string }).type).toMatch(/\/outcome-unknown$/);
    const rec = (await (await call(`/_fencegate/v1/idempotency/${encodeURIComponent(key)}`)).json()) as { records: { state: string }[] };
    expect(rec.records[0]!.state).toBe('outcome_unknown');
    expect(await upstreamCalls(key)).toHaveLength(1);
  });

  it('a reset after sending is outcome_unknown; onUnknown: retry sends it once more', async () => {
    const entity = uniq('tool-job');
    const key = uniq('pay');
    expect((await call('/flaky/charges', pay(entity, key, '1', { 'x-upstream': 'reset' }))).status).toBe(504);
    const again = await call('/flaky/charges', pay(entity, key, '1'));
    expect(again.status).toBe(201);
    expect(await upstreamCalls(key)).toHaveLength(2);
  });

  it('"not processed" statuses (503) release the record: the retry is forwarded again', async () => {
    const entity = uniq('tool-job');
    const key = uniq('pay');
    expect((await call('/payments/charges', pay(entity, key, '1', { 'x-upstream': 'status=503' }))).status).toBe(503);
    expect((await call('/payments/charges', pay(entity, key, '1'))).status).toBe(201);
    expect(await upstreamCalls(key)).toHaveLength(2);
  });

  it('documented limit: workerd cannot tell a refused connection from a reset, so it is outcome_unknown (504), not 502', async () => {
    const key = uniq('pay');
    const res = await call('/down/charges', pay(uniq('tool-job'), key, '1'));
    expect(res.status).toBe(504);
    const rec = (await (await call(`/_fencegate/v1/idempotency/${encodeURIComponent(key)}`)).json()) as { records: { state: string }[] };
    expect(rec.records[0]!.state).toBe('outcome_unknown');
  });
});

describe('configuration and the cron sweeper', () => {
  it('answers 500 problem+json for a bad or missing configuration, naming nothing secret', async () => {
    for (const over of [
      { FENCEGATE_CONFIG: undefined },
      { FENCEGATE_CONFIG: '{not json' },
      { FENCEGATE_CONFIG: configText({ store: { sqlite: './x.db' } }) },
      { FENCEGATE_CONFIG: configText({ store: { d1: 'NO_SUCH_BINDING' } }) },
      { UPSTREAM_TOKEN: undefined },
      { FENCEGATE_CONFIG: configText({ auth: { jwksFile: './jwks.json', issuer: 'i', audience: 'a' } }) },
    ]) {
      const res = await call('/payments/charges', pay(uniq('e'), uniq('k'), '1'), workerEnv(over));
      expect(res.status, JSON.stringify(Object.keys(over))).toBe(500);
      expect(res.headers.get('content-type')).toBe('application/problem+json');
      expect(await res.text()).not.toContain('sekret');
    }
  });

  it('scheduled() sweeps: a dead in_progress record becomes outcome_unknown', async () => {
    const store = createD1Store({ db: env.DB });
    const key = uniq('pay');
    const input = {
      scope: 'payments',
      key,
      entity: uniq('tool-job'),
      fence: 1n,
      fingerprint: 'fp',
      mode: 'concurrent' as const,
      ownerToken: crypto.randomUUID(),
      lockMs: 60_000,
      retentionMs: 60_000,
      onUnknown: 'reject' as const,
      audit: { requestId: 'r', clientRequestId: null, caller: null, method: 'POST', path: '/payments/x', payloadSha256: '00' },
    };
    expect((await store.admit(input)).outcome).toBe('forward');
    await env.DB.prepare('UPDATE idempotency_records SET locked_until = locked_until - 120000 WHERE key = ?').bind(key).run();
    const ctx = createExecutionContext();
    await worker.scheduled(createScheduledController({ cron: '* * * * *' }), gatewayEnv, ctx);
    await waitOnExecutionContext(ctx);
    expect((await store.getRecords(key))[0]?.state).toBe('outcome_unknown');
  });
});
