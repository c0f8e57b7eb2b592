import { createServer } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import type { GatewayStore } from '../../src/store/types.js';
import { bearer, hsAuth, token } from '../auth/tokens.js';
import { delegate } from '../helpers/delegate.js';
import { command, expectProblem, paymentsRoute, startTestGateway, until, type RouteInput, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// The command log (DESIGN §4.1 `commands`) through the real gateway on
// loopback and a real SQLite file: every outcome of an entity's requests,
// 502, 504, 413 and entity-busy included, read back from GET /v1/commands.

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function upstream(): Promise<FakeUpstream> {
  const u = await startUpstream();
  cleanups.push(() => u.close());
  return u;
}

async function gateway(routes: RouteInput[], config: Record<string, unknown> = {}, wrapStore?: (s: GatewayStore) => GatewayStore): Promise<TestGateway> {
  const gw = await startTestGateway({ routes, config, ...(wrapStore ? { wrapStore } : {}) });
  cleanups.unshift(() => gw.close());
  return gw;
}

/** A loopback port nothing listens on: connection refused, a 502 upstream-unavailable. */
async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const { port } = s.address() as { port: number };
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

const v1 = (gw: TestGateway, path: string, init?: RequestInit) => fetch(`${gw.url}/_fencegate/v1${path}`, init);

/** The routes of an entity's story: payments (a live upstream, small bodies), and one whose upstream refuses connections. */
async function storyRoutes(up: FakeUpstream): Promise<RouteInput[]> {
  return [
    paymentsRoute(up.url, { maxBodyBytes: 64, serialWaitMs: 0 }),
    paymentsRoute(`http://127.0.0.1:${await closedPort()}`, { name: 'dead', match: { path: '/dead/*', methods: ['POST'] } }),
  ];
}

/** One request of every kind for `entity`: completed, 504, 502, 413, entity-busy. */
async function tellStory(gw: TestGateway, up: FakeUpstream, entity: string): Promise<void> {
  expect((await command(gw.url, '/payments/charges?secret=s3', { fence: 1, entity, key: 'k1' })).status).toBe(201);
  up.behave(() => ({ kind: 'reset' }));
  await expectProblem(await command(gw.url, '/payments/charges', { fence: 1, entity, key: 'k2' }), 504, 'upstream-timeout');
  up.behave(null);
  await expectProblem(await command(gw.url, '/dead/charges', { fence: 1, entity, key: 'k3' }), 502, 'upstream-unavailable');
  await expectProblem(
    await command(gw.url, '/payments/charges', { fence: 1, entity, key: 'k4', body: `{"pad":"${'x'.repeat(200)}"}` }),
    413,
    'payload-too-large',
  );
  const gate = up.gate();
  up.behave(() => ({ kind: 'hold', gate: gate.promise }));
  const held = command(gw.url, '/payments/charges', { fence: 1, entity, key: 'k5' });
  await until(() => up.calls.some((c) => c.headers['idempotency-key'] === 'k5'), 'the held request reached the upstream');
  await expectProblem(await command(gw.url, '/payments/charges', { fence: 1, entity, key: 'k6' }), 409, 'entity-busy');
  gate.open();
  expect((await held).status).toBe(201);
  up.behave(null);
}

async function story(gw: TestGateway, entity: string, headers: Record<string, string> = {}): Promise<any[]> {
  const res = await v1(gw, `/commands?entity=${encodeURIComponent(entity)}`, { headers });
  expect(res.status, await res.clone().text()).toBe(200);
  return ((await res.json()) as any).items;
}

describe('GET /v1/commands: an entity whole story', () => {
  it('has a row for every outcome, 502, 504, 413 and entity-busy included, with the status the caller got', async () => {
    const up = await upstream();
    const gw = await gateway(await storyRoutes(up));
    await tellStory(gw, up, 'acct:1');
    const items = await story(gw, 'acct:1');
    // Newest first: the held k5 finished last.
    expect(items.map((r) => [r.idempotency_key, r.route, r.outcome, r.status, r.decision])).toEqual([
      ['k5', 'payments', 'completed', 201, 'forwarded'],
      ['k6', 'payments', 'entity-busy', 409, 'entity-busy'],
      ['k4', 'payments', 'payload-too-large', 413, 'payload-too-large'],
      ['k3', 'dead', 'released', 502, 'upstream-unavailable'],
      ['k2', 'payments', 'outcome_unknown', 504, 'upstream-timeout'],
      ['k1', 'payments', 'completed', 201, 'forwarded'],
    ]);
    const first = items[items.length - 1];
    expect(first).toMatchObject({ method: 'POST', path: '/payments/charges', entity: 'acct:1', fence: '1', scope: 'payments', caller: null });
    expect(first.payload_sha256).toMatch(/^[0-9a-f]{64}$/);
    expect(first.request_id).toMatch(/^[0-9a-f-]{36}$/);
    expect(typeof first.upstream_ms).toBe('number');
    // Never the query string.
    expect(JSON.stringify(items)).not.toContain('s3');
    // Filters: by key, by route.
    expect(((await (await v1(gw, '/commands?key=k2')).json()) as any).items.map((r: any) => r.status)).toEqual([504]);
    expect(((await (await v1(gw, '/commands?entity=acct:1&route=dead')).json()) as any).items).toHaveLength(1);
  });

  it('negative control: a finish that drops its row leaves the 504 out of the story', async () => {
    const up = await upstream();
    const withoutRow = (s: GatewayStore) => delegate(s, { finish: (i) => s.finish({ ...i, command: undefined }) });
    const gw = await gateway(await storyRoutes(up), {}, withoutRow);
    up.behave(() => ({ kind: 'reset' }));
    await expectProblem(await command(gw.url, '/payments/charges', { fence: 1, entity: 'acct:2', key: 'k' }), 504, 'upstream-timeout');
    expect((await story(gw, 'acct:2')).map((r) => r.status)).not.toContain(504);
  });

  it('exports as CSV and NDJSON, pages with a cursor, and refuses a bad parameter', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    for (let i = 0; i < 5; i++) expect((await command(gw.url, '/payments/x', { fence: 1, entity: 'acct:3', key: `k${i}` })).status).toBe(201);
    const csv = await (await v1(gw, '/commands?entity=acct:3&format=csv')).text();
    const lines = csv.trimEnd().split('\r\n');
    expect(lines[0]).toBe(
      'id,at,route,method,path,entity,fence,idempotency_key,scope,caller,tool,outcome,decision,status,upstream_ms,request_id,client_request_id,payload_sha256',
    );
    expect(lines).toHaveLength(6);
    const nd = await v1(gw, '/commands?entity=acct:3', { headers: { accept: 'application/x-ndjson' } });
    expect(nd.headers.get('content-type')).toBe('application/x-ndjson');
    const rows = (await nd.text())
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(rows.map((r) => r.idempotency_key)).toEqual(['k4', 'k3', 'k2', 'k1', 'k0']);
    const p1: any = await (await v1(gw, '/commands?entity=acct:3&limit=2')).json();
    const p2: any = await (await v1(gw, `/commands?entity=acct:3&limit=2&cursor=${p1.next_cursor}`)).json();
    expect([...p1.items, ...p2.items].map((r: any) => r.idempotency_key)).toEqual(['k4', 'k3', 'k2', 'k1']);
    await expectProblem(await v1(gw, '/commands?since=yesterday'), 400, 'invalid-request');
    await expectProblem(await v1(gw, '/commands?cursor=abc'), 400, 'invalid-request');
  });

  it('needs the audit scope, as the rejection log does; keeps the caller and the entity as the store does', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], { auth: hsAuth() });
    const worker = bearer(await token({ sub: 'billing' }));
    expect((await command(gw.url, '/payments/x', { fence: 1, entity: 'acct:4', key: 'k', headers: { ...worker, 'x-request-id': 'trace-1' } })).status).toBe(
      201,
    );
    expect((await v1(gw, '/commands')).status).toBe(401);
    expect((await v1(gw, '/commands', { headers: worker })).status).toBe(403);
    const audit = bearer(await token({ sub: 'auditor', scope: 'fencegate:audit' }));
    const [row] = await story(gw, 'acct:4', audit);
    expect(row).toMatchObject({ caller: 'billing', client_request_id: 'trace-1', scope: 'payments\u0000billing', outcome: 'completed', status: 201 });
  });
});
