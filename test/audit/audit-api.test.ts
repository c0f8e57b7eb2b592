import { afterEach, describe, expect, it } from 'vitest';
import type { RejectionInput, RejectionReason } from '../../src/store/types.js';
import { command, expectProblem, paymentsRoute, startTestGateway, type RouteInput, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { bearer, hsAuth, token } from '../auth/tokens.js';

// The audit API (docs/auth-audit.md): filters, keyset pagination, streaming exports,
// entity fence history, resolving outcome_unknown records, the operator-action
// log, and /metrics. Real gateway on loopback, real SQLite file.

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function upstream(): Promise<FakeUpstream> {
  const u = await startUpstream();
  cleanups.push(() => u.close());
  return u;
}

async function gateway(routes: RouteInput[], config: Record<string, unknown> = {}): Promise<TestGateway> {
  const gw = await startTestGateway({ routes, config });
  cleanups.unshift(() => gw.close());
  return gw;
}

const v1 = (gw: TestGateway, path: string, init?: RequestInit) => fetch(`${gw.url}/_fencegate/v1${path}`, init);
const json = async (res: Response): Promise<any> => {
  expect(res.status, await res.clone().text()).toBe(200);
  return res.json();
};

function rejection(i: number, o: Partial<{ reason: RejectionReason; entity: string; caller: string | null; key: string; path: string }> = {}): RejectionInput {
  return {
    reason: o.reason ?? 'stale-fence',
    entity: o.entity ?? `e-${i % 3}`,
    presentedFence: BigInt(i),
    currentFence: BigInt(i + 1),
    idempotencyKey: o.key ?? `key-${i}`,
    audit: {
      requestId: `req-${i}`,
      clientRequestId: null,
      caller: o.caller === undefined ? `caller-${i % 2}` : o.caller,
      method: 'POST',
      path: o.path ?? `/payments/${i}`,
      payloadSha256: 'ab'.repeat(32),
    },
  };
}

async function seed(gw: TestGateway, n: number, o: Parameters<typeof rejection>[1] = {}) {
  for (let i = 0; i < n; i++) await gw.sqlite.recordRejection(rejection(i, o));
}

describe('GET /v1/rejections', () => {
  it('filters by entity, reason, caller and time, newest first', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    await seed(gw, 12);
    await gw.sqlite.recordRejection(rejection(100, { reason: 'idempotency-key-reused', entity: 'e-0', caller: 'caller-0' }));
    // Backdate the first four rows by three hours (CONTRIBUTING.md convention 2: backdate rows, never fake the clock).
    gw.sqlite.db.prepare('UPDATE rejections SET at = at - 3 * 3600000 WHERE id <= 4').run();

    const ids = (body: any) => body.items.map((r: any) => Number(r.id));
    expect(ids(await json(await v1(gw, '/rejections')))).toEqual([13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1]);
    expect(ids(await json(await v1(gw, '/rejections?entity=e-0')))).toEqual([13, 10, 7, 4, 1]);
    expect(ids(await json(await v1(gw, '/rejections?reason=idempotency-key-reused')))).toEqual([13]);
    expect(ids(await json(await v1(gw, '/rejections?caller=caller-1')))).toEqual([12, 10, 8, 6, 4, 2]);
    expect(ids(await json(await v1(gw, '/rejections?since=2h')))).toEqual([13, 12, 11, 10, 9, 8, 7, 6, 5]);
    expect(ids(await json(await v1(gw, '/rejections?until=2h')))).toEqual([4, 3, 2, 1]);
    expect(ids(await json(await v1(gw, '/rejections?entity=e-0&caller=caller-0&since=2h')))).toEqual([13, 7]);
    const iso = new Date(Date.now() - 2 * 3600_000).toISOString();
    expect(ids(await json(await v1(gw, `/rejections?until=${encodeURIComponent(iso)}`)))).toEqual([4, 3, 2, 1]);
    const one = (await json(await v1(gw, '/rejections?reason=idempotency-key-reused'))).items[0];
    expect(one).toEqual({
      id: '13',
      at: expect.any(String),
      reason: 'idempotency-key-reused',
      entity: 'e-0',
      presented_fence: '100',
      current_fence: '101',
      idempotency_key: 'key-100',
      caller: 'caller-0',
      method: 'POST',
      path: '/payments/100',
      payload_sha256: 'ab'.repeat(32),
      request_id: 'req-100',
      client_request_id: null,
      tool: null,
      detail: null,
    });

    for (const bad of ['since=yesterday', 'limit=0', 'limit=1001', 'cursor=abc', 'format=xml']) {
      await expectProblem(await v1(gw, `/rejections?${bad}`), 400, 'invalid-request');
    }
  });

  it('keyset pagination: every row once, stable while new rows arrive', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    await seed(gw, 250);
    const seen: number[] = [];
    let cursor: string | null = null;
    let pages = 0;
    do {
      const body: any = await json(await v1(gw, `/rejections?limit=100${cursor ? `&cursor=${cursor}` : ''}`));
      seen.push(...body.items.map((r: any) => Number(r.id)));
      cursor = body.next_cursor;
      // New refusals during the walk go above the cursor: they never shift the pages.
      if (pages++ === 0) await seed(gw, 5);
    } while (cursor !== null);
    expect(pages).toBe(3);
    expect(seen).toEqual(Array.from({ length: 250 }, (_, i) => 250 - i));
  });
});

describe('exports: NDJSON and CSV streams', () => {
  it('NDJSON by Accept: every matching row across many pages, as JSON lines', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    gw.sqlite.db.exec(`INSERT INTO rejections (at, reason, entity, presented_fence, idempotency_key, caller, method, path)
      WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2500)
      SELECT 1700000000000 + i, 'stale-fence', 'e-' || (i % 2), i, 'k-' || i, 'c', 'POST', '/p' FROM n`);
    const res = await v1(gw, '/rejections?entity=e-1', { headers: { accept: 'application/x-ndjson' } });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/x-ndjson');
    const lines = (await res.text()).split('\n');
    expect(lines.pop()).toBe('');
    expect(lines).toHaveLength(1250);
    const rows = lines.map((l) => JSON.parse(l));
    expect(rows[0]).toMatchObject({ id: '2499', entity: 'e-1', presented_fence: '2499' });
    expect(rows.at(-1)).toMatchObject({ id: '1' });
    expect(new Set(rows.map((r) => r.id)).size).toBe(1250);
    // `limit` caps an export.
    const capped = await (await v1(gw, '/rejections?limit=7&format=ndjson')).text();
    expect(capped.trim().split('\n')).toHaveLength(7);
  });

  it('CSV by Accept or ?format=csv: RFC 4180 quoting, CRLF, formula cells defused', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    await gw.sqlite.recordRejection(rejection(1, { entity: 'plain' }));
    await gw.sqlite.recordRejection(rejection(2, { entity: 'a,"quoted" entity', key: '=HYPERLINK("http://x.invalid")', path: '/p?a=1,2' }));
    const res = await v1(gw, '/rejections', { headers: { accept: 'text/csv' } });
    expect(res.headers.get('content-type')).toBe('text/csv; charset=utf-8');
    const text = await res.text();
    const lines = text.split('\r\n');
    expect(lines[0]).toBe(
      'id,at,reason,entity,presented_fence,current_fence,idempotency_key,caller,method,path,payload_sha256,request_id,client_request_id,tool,detail',
    );
    expect(lines[1]).toContain(`2,`);
    expect(lines[1]).toContain(',"a,""quoted"" entity",2,3,"\'=HYPERLINK(""http://x.invalid"")",caller-0,POST,"/p?a=1,2",');
    expect(lines[2]).toMatch(/^1,[^,]+,stale-fence,plain,1,2,key-1,caller-1,POST,\/payments\/1,/);
    expect(lines[3]).toBe('');
    expect(await (await v1(gw, '/rejections?format=csv')).text()).toBe(text);
  });
});

describe("the client's X-Request-Id", () => {
  it("is kept as client_request_id beside the gateway's own request_id, in JSON, NDJSON and CSV", async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    const e = 'acct:client-id';
    expect((await command(gw.url, '/payments/x', { fence: 5, entity: e, key: 'k-1' })).status).toBe(201);
    const stale = await command(gw.url, '/payments/x', { fence: 4, entity: e, key: 'k-2', headers: { 'x-request-id': 'their-trace-42' } });
    await expectProblem(stale, 409, 'stale-fence');
    const ours = stale.headers.get('x-request-id')!;
    expect(ours).toMatch(/^[0-9a-f-]{36}$/);
    expect(ours).not.toBe('their-trace-42');
    const { items } = await json(await v1(gw, `/rejections?entity=${encodeURIComponent(e)}`));
    expect(items).toHaveLength(1);
    expect(items[0]).toMatchObject({ reason: 'stale-fence', request_id: ours, client_request_id: 'their-trace-42' });
    const nd = JSON.parse((await (await v1(gw, `/rejections?entity=${encodeURIComponent(e)}&format=ndjson`)).text()).trim());
    expect(nd).toMatchObject({ request_id: ours, client_request_id: 'their-trace-42' });
    const csv = (await (await v1(gw, `/rejections?entity=${encodeURIComponent(e)}&format=csv`)).text()).split('\r\n');
    const cols = csv[0]!.split(',');
    const cells = csv[1]!.split(',');
    expect(cells[cols.indexOf('request_id')]).toBe(ours);
    expect(cells[cols.indexOf('client_request_id')]).toBe('their-trace-42');
    // A malformed one is not kept at all; the upstream sees the gateway's id.
    await expectProblem(
      await command(gw.url, '/payments/x', { fence: 3, entity: e, key: 'k-3', headers: { 'x-request-id': 'not valid!' } }),
      409,
      'stale-fence',
    );
    const again = await json(await v1(gw, `/rejections?entity=${encodeURIComponent(e)}&limit=1`));
    expect(again.items[0]).toMatchObject({ client_request_id: null });
    expect(up.calls[0]!.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
  });

  it('an auth refusal keeps it as client_request_id too', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], { auth: hsAuth() });
    const res = await command(gw.url, '/payments/x', { fence: 1, entity: 'e-auth', key: 'k', headers: { 'x-request-id': 'their-trace-7' } });
    await expectProblem(res, 401, 'unauthorized');
    const ours = res.headers.get('x-request-id')!;
    expect(ours).not.toBe('their-trace-7');
    const audit = bearer(await token({ sub: 'auditor', scope: 'fencegate:audit' }));
    const { items } = await json(await v1(gw, '/rejections?reason=unauthorized', { headers: audit }));
    expect(items[0]).toMatchObject({ request_id: ours, client_request_id: 'their-trace-7' });
  });
});

describe('entities and their fence history', () => {
  it('GET /v1/entities/:entity shows the fence and every accepted rise, highest first', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], { auth: hsAuth() });
    const w = bearer(await token({ sub: 'billing' }));
    const e = 'tool-job:7';
    let k = 0;
    const ids = new Map<number, string>();
    for (const f of [1, 1, 3, 7]) {
      const res = await command(gw.url, '/payments/x', { fence: f, entity: e, key: `k${k++}`, headers: { ...w, 'x-request-id': `req-${f}-${k}` } });
      expect(res.status).toBe(201);
      // The history names the gateway's own id of the request that raised the fence (the caller's X-Request-Id is not it).
      if (!ids.has(f)) ids.set(f, res.headers.get('x-request-id')!);
    }
    await expectProblem(await command(gw.url, '/payments/x', { fence: 2, entity: e, key: 'late', headers: w }), 409, 'stale-fence');

    const audit = bearer(await token({ sub: 'auditor', scope: 'fencegate:audit' }));
    const body = await json(await v1(gw, `/entities/${encodeURIComponent(e)}`, { headers: audit }));
    expect(body).toMatchObject({ entity: e, fence: '7', inflight: null, history_next_cursor: null });
    expect(body.history.map((h: any) => [h.fence, h.caller, h.request_id])).toEqual([
      ['7', 'billing', ids.get(7)],
      ['3', 'billing', ids.get(3)],
      ['1', 'billing', ids.get(1)],
    ]);
    for (const id of ids.values()) expect(id).toMatch(/^[0-9a-f-]{36}$/);
    const p1 = await json(await v1(gw, `/entities/${encodeURIComponent(e)}/history?limit=2`, { headers: audit }));
    expect(p1.items.map((h: any) => h.fence)).toEqual(['7', '3']);
    const p2 = await json(await v1(gw, `/entities/${encodeURIComponent(e)}/history?limit=2&cursor=${p1.next_cursor}`, { headers: audit }));
    expect(p2).toMatchObject({ items: [{ fence: '1' }], next_cursor: null });
    await expectProblem(await v1(gw, '/entities/nobody', { headers: audit }), 404, 'not-found');
  });
});

describe('outcome_unknown records: listing and resolution', () => {
  async function unknownRecord(gw: TestGateway, up: FakeUpstream, key: string, headers: Record<string, string> = {}) {
    up.behave(() => ({ kind: 'reset' }));
    await expectProblem(await command(gw.url, '/payments/charges', { fence: 1, entity: 'tool-job:9', key, headers }), 504, 'upstream-timeout');
    up.behave(null);
  }

  it('resolved as completed: retries get the confirmed response; logged as an operator action', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], { auth: hsAuth() });
    const worker = bearer(await token({ sub: 'billing' }));
    const admin = bearer(await token({ sub: 'ops-alice', scope: 'fencegate:admin' }));
    await unknownRecord(gw, up, 'pay-9', worker);
    await expectProblem(await command(gw.url, '/payments/charges', { fence: 1, entity: 'tool-job:9', key: 'pay-9', headers: worker }), 409, 'outcome-unknown');

    const list = await json(await v1(gw, '/idempotency?state=outcome_unknown', { headers: admin }));
    expect(list.items).toMatchObject([{ key: 'pay-9', scope: 'payments\u0000billing', state: 'outcome_unknown', entity: 'tool-job:9', fence: '1' }]);

    const resolve = (body: unknown) =>
      v1(gw, '/idempotency/pay-9/resolve', { method: 'POST', headers: { ...admin, 'content-type': 'application/json' }, body: JSON.stringify(body) });
    await expectProblem(await resolve({ outcome: 'completed' }), 400, 'invalid-request');
    await expectProblem(await resolve({ outcome: 'completed', response: { status: 201, headers: { 'set-cookie': 'a=b' }, body: '' } }), 400, 'invalid-request');
    const confirmed = '{"id":"ch_1","status":"succeeded","checked_by":"ops"}';
    const done = await json(
      await resolve({
        outcome: 'completed',
        response: { status: 201, headers: { 'content-type': 'application/json' }, body: confirmed },
        note: 'checked in the provider dashboard',
      }),
    );
    expect(done.action).toMatchObject({
      action: 'resolve-completed',
      key: 'pay-9',
      scope: 'payments\u0000billing',
      entity: 'tool-job:9',
      fence: '1',
      status: 201,
      operator: 'ops-alice',
      note: 'checked in the provider dashboard',
    });

    const retry = await command(gw.url, '/payments/charges', { fence: 1, entity: 'tool-job:9', key: 'pay-9', headers: worker });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(retry.headers.get('content-type')).toBe('application/json');
    expect(await retry.text()).toBe(confirmed);
    expect(up.effects).toBe(1);

    // Settled once: a second resolution is refused; the list is empty; the action is in the log.
    await expectProblem(await resolve({ outcome: 'released' }), 409, 'not-outcome-unknown', { state: 'completed' });
    expect((await json(await v1(gw, '/idempotency', { headers: admin }))).items).toEqual([]);
    const actions = await json(await v1(gw, '/operator-actions', { headers: admin }));
    expect(actions.items).toMatchObject([{ action: 'resolve-completed', key: 'pay-9', operator: 'ops-alice' }]);
  });

  it('resolved as released: the next retry is forwarded', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    await unknownRecord(gw, up, 'pay-10');
    const res = await json(
      await v1(gw, '/idempotency/pay-10/resolve', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{"outcome":"released","note":"not in the provider"}',
      }),
    );
    expect(res.action).toMatchObject({ action: 'resolve-released', operator: null, status: null });
    const retry = await command(gw.url, '/payments/charges', { fence: 1, entity: 'tool-job:9', key: 'pay-10' });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    expect(up.effects).toBe(2);
  });

  it('a key in several scopes must be named; an unknown key is 404; a busy record is not the operator’s', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], { auth: hsAuth() });
    await unknownRecord(gw, up, 'shared', bearer(await token({ sub: 'a' })));
    await unknownRecord(gw, up, 'shared', bearer(await token({ sub: 'b' })));
    const admin = { ...bearer(await token({ sub: 'ops', scope: 'fencegate:admin' })), 'content-type': 'application/json' };
    const ambiguous = await expectProblem(
      await v1(gw, '/idempotency/shared/resolve', { method: 'POST', headers: admin, body: '{"outcome":"released"}' }),
      400,
      'invalid-request',
    );
    expect(ambiguous.scopes.sort()).toEqual(['payments\u0000a', 'payments\u0000b']);
    const named = await v1(gw, '/idempotency/shared/resolve', {
      method: 'POST',
      headers: admin,
      body: JSON.stringify({ outcome: 'released', scope: 'payments\u0000b' }),
    });
    expect(named.status).toBe(200);
    await expectProblem(await v1(gw, '/idempotency/none/resolve', { method: 'POST', headers: admin, body: '{"outcome":"released"}' }), 404, 'not-found');
    // Completed records are not the operator's to settle.
    expect(
      (await command(gw.url, '/payments/charges', { fence: 1, entity: 'tool-job:9', key: 'fine', headers: bearer(await token({ sub: 'a' })) })).status,
    ).toBe(201);
    await expectProblem(
      await v1(gw, '/idempotency/fine/resolve', { method: 'POST', headers: admin, body: '{"outcome":"released"}' }),
      409,
      'not-outcome-unknown',
    );
  });
});

describe('GET /metrics', () => {
  it('counts requests by route and outcome, with latency histograms and gauges', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], { auth: hsAuth() });
    const w = bearer(await token({ sub: 'billing' }));
    const send = (fence: number, key: string, headers: Record<string, string> = w) => command(gw.url, '/payments/x', { fence, entity: 'e', key, headers });
    expect((await send(2, 'a')).status).toBe(201); // accepted
    expect((await send(2, 'a')).status).toBe(201); // replayed
    expect((await send(1, 'b')).status).toBe(409); // stale
    expect((await command(gw.url, '/payments/x', { fence: 2, entity: 'e', key: 'a', body: '{"other":1}', headers: w })).status).toBe(422); // mismatch
    expect((await send(2, 'c', {})).status).toBe(401); // unauthorized
    up.behave(() => ({ kind: 'reset' }));
    expect((await send(2, 'd')).status).toBe(504); // upstream error, record outcome_unknown
    up.behave(null);
    expect((await send(2, 'd')).status).toBe(409); // unknown

    const res = await fetch(`${gw.url}/_fencegate/metrics`, { headers: bearer(await token({ scope: 'fencegate:audit' })) });
    expect(res.headers.get('content-type')).toBe('text/plain; version=0.0.4; charset=utf-8');
    const text = await res.text();
    for (const [outcome, n] of [
      ['accepted', 1],
      ['replayed', 1],
      ['stale', 1],
      ['mismatch', 1],
      ['unauthorized', 1],
      ['upstream_error', 1],
      ['unknown', 1],
    ] as const) {
      expect(text).toContain(`fencegate_requests_total{route="payments",outcome="${outcome}"} ${n}\n`);
    }
    expect(text).toMatch(/^fencegate_upstream_duration_seconds_count\{route="payments"\} 2$/m);
    // Label order is not part of the format: prom-client (the Node entry) writes `le` first, the text backend last.
    expect(text).toMatch(/^fencegate_upstream_duration_seconds_bucket\{(route="payments",le="\+Inf"|le="\+Inf",route="payments")\} 2$/m);
    expect(text).toMatch(/^fencegate_overhead_duration_seconds_count\{route="payments"\} 7$/m);
    expect(text).toMatch(/^fencegate_inflight_requests 0$/m);
    expect(text).toMatch(/^fencegate_store_up 1$/m);
    // stale, mismatch, unauthorized, outcome-unknown.
    expect(text).toMatch(/^fencegate_rejection_log_rows 4$/m);
    expect(text).toMatch(/^fencegate_outcome_unknown_records 1$/m);
    expect(text).toMatch(/^# TYPE fencegate_requests_total counter$/m);
  });
});
