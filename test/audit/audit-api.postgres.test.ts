import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AdmitInput, FinishInput } from '../../src/store/types.js';
import { bearer, hsAuth, token } from '../auth/tokens.js';
import { command, expectProblem, paymentsRoute } from '../helpers/gateway.js';
import { startPgTestGateway, type PgTestGateway } from '../helpers/pg-gateway.js';
import { POSTGRES_URL } from '../helpers/postgres.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// The audit API (DESIGN §4.1) on the PostgreSQL store: fence history, the
// outcome_unknown listing and its resolution, the operator-action log and
// the /metrics gauges, through a real Node gateway on loopback; then the
// store's audit methods where HTTP cannot reach (ties in the record keyset,
// races between a resolution and a late finish). The SQLite twin of the
// HTTP part is audit-api.test.ts.

describe.skipIf(!POSTGRES_URL)('audit API on the PostgreSQL store', () => {
  let up: FakeUpstream;
  let gw: PgTestGateway;
  const uid = () => randomUUID().slice(0, 8);
  const v1 = (path: string, init?: RequestInit) => fetch(`${gw.url}/_fencegate/v1${path}`, init);
  const json = async (res: Response): Promise<any> => {
    expect(res.status, await res.clone().text()).toBe(200);
    return res.json();
  };
  let worker: Record<string, string>;
  let admin: Record<string, string>;
  let auditor: Record<string, string>;

  beforeAll(async () => {
    up = await startUpstream();
    gw = await startPgTestGateway({ routes: [paymentsRoute(up.url)], config: { auth: hsAuth() }, prefix: 'fg_audit' });
    worker = bearer(await token({ sub: 'billing' }));
    admin = { ...bearer(await token({ sub: 'ops-alice', scope: 'fencegate:admin' })), 'content-type': 'application/json' };
    auditor = bearer(await token({ sub: 'auditor', scope: 'fencegate:audit' }));
  });

  afterAll(async () => {
    await gw?.close();
    await up?.close();
  });

  async function unknownRecord(key: string, entity: string, headers: Record<string, string> = worker) {
    up.behave((c) => (c.key === key ? { kind: 'reset' } : undefined));
    try {
      await expectProblem(await command(gw.url, '/payments/charges', { fence: 1, entity, key, headers }), 504, 'upstream-timeout');
    } finally {
      up.behave(null);
    }
  }

  it('GET /v1/entities/:entity shows the fence and every accepted rise, highest first, paged', async () => {
    const e = `tool-job:${uid()}`;
    let k = 0;
    const ids = new Map<number, string>();
    for (const f of [1, 1, 3, 7]) {
      const res = await command(gw.url, '/payments/x', { fence: f, entity: e, key: `k-${uid()}`, headers: { ...worker, 'x-request-id': `req-${f}-${++k}` } });
      expect(res.status).toBe(201);
      // The gateway's own id of the request that raised the fence, not the caller's X-Request-Id.
      if (!ids.has(f)) ids.set(f, res.headers.get('x-request-id')!);
    }
    await expectProblem(await command(gw.url, '/payments/x', { fence: 2, entity: e, key: `late-${uid()}`, headers: worker }), 409, 'stale-fence');

    const body = await json(await v1(`/entities/${encodeURIComponent(e)}`, { headers: auditor }));
    expect(body).toMatchObject({ entity: e, fence: '7', inflight: null, history_next_cursor: null });
    expect(body.history.map((h: any) => [h.fence, h.caller, h.request_id])).toEqual([
      ['7', 'billing', ids.get(7)],
      ['3', 'billing', ids.get(3)],
      ['1', 'billing', ids.get(1)],
    ]);
    const p1 = await json(await v1(`/entities/${encodeURIComponent(e)}/history?limit=2`, { headers: auditor }));
    expect(p1.items.map((h: any) => h.fence)).toEqual(['7', '3']);
    const p2 = await json(await v1(`/entities/${encodeURIComponent(e)}/history?limit=2&cursor=${p1.next_cursor}`, { headers: auditor }));
    expect(p2).toMatchObject({ items: [{ fence: '1' }], next_cursor: null });
    // A cursor above every fence (19 digits, past 2^63−1) pages from the top instead of failing.
    const top = await json(await v1(`/entities/${encodeURIComponent(e)}/history?cursor=9999999999999999999`, { headers: auditor }));
    expect(top.items.map((h: any) => h.fence)).toEqual(['7', '3', '1']);
    await expectProblem(await v1('/entities/nobody-here', { headers: auditor }), 404, 'not-found');
  });

  it('resolved as completed: retries get the confirmed response; logged as an operator action; settled once', async () => {
    const key = `pay-${uid()}`;
    const entity = `tool-job:${uid()}`;
    await unknownRecord(key, entity);
    const effects = up.callsFor(key).length;
    await expectProblem(await command(gw.url, '/payments/charges', { fence: 1, entity, key, headers: worker }), 409, 'outcome-unknown');

    const list = await json(await v1('/idempotency?state=outcome_unknown&limit=1000', { headers: admin }));
    expect(list.items.filter((r: any) => r.key === key)).toMatchObject([{ key, scope: 'payments\u0000billing', state: 'outcome_unknown', entity, fence: '1' }]);

    const resolve = (body: unknown) => v1(`/idempotency/${key}/resolve`, { method: 'POST', headers: admin, body: JSON.stringify(body) });
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
      key,
      scope: 'payments\u0000billing',
      entity,
      fence: '1',
      status: 201,
      operator: 'ops-alice',
      note: 'checked in the provider dashboard',
    });

    const retry = await command(gw.url, '/payments/charges', { fence: 1, entity, key, headers: worker });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(retry.headers.get('content-type')).toBe('application/json');
    expect(await retry.text()).toBe(confirmed);
    expect(up.callsFor(key)).toHaveLength(effects);

    await expectProblem(await resolve({ outcome: 'released' }), 409, 'not-outcome-unknown', { state: 'completed' });
    const actions = await json(await v1('/operator-actions?limit=1000', { headers: admin }));
    expect(actions.items.filter((a: any) => a.key === key)).toMatchObject([
      { action: 'resolve-completed', key, operator: 'ops-alice', request_id: expect.any(String) },
    ]);
  });

  it('resolved as released: the next retry is forwarded; the action keeps the record’s entity and fence', async () => {
    const key = `pay-${uid()}`;
    const entity = `tool-job:${uid()}`;
    await unknownRecord(key, entity);
    const res = await json(
      await v1(`/idempotency/${key}/resolve`, { method: 'POST', headers: admin, body: '{"outcome":"released","note":"not in the provider"}' }),
    );
    expect(res.action).toMatchObject({ action: 'resolve-released', operator: 'ops-alice', status: null, entity, fence: '1', note: 'not in the provider' });
    const retry = await command(gw.url, '/payments/charges', { fence: 1, entity, key, headers: worker });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    expect(up.callsFor(key)).toHaveLength(2);
  });

  it('a key in several scopes must be named; an unknown key is 404; a completed record is not the operator’s', async () => {
    const key = `shared-${uid()}`;
    await unknownRecord(key, `tool-job:${uid()}`, bearer(await token({ sub: 'a' })));
    await unknownRecord(key, `tool-job:${uid()}`, bearer(await token({ sub: 'b' })));
    const ambiguous = await expectProblem(
      await v1(`/idempotency/${key}/resolve`, { method: 'POST', headers: admin, body: '{"outcome":"released"}' }),
      400,
      'invalid-request',
    );
    expect(ambiguous.scopes.sort()).toEqual(['payments\u0000a', 'payments\u0000b']);
    const named = await v1(`/idempotency/${key}/resolve`, {
      method: 'POST',
      headers: admin,
      body: JSON.stringify({ outcome: 'released', scope: 'payments\u0000b' }),
    });
    expect(named.status).toBe(200);
    expect((await gw.store.getRecords(key)).map((r) => [r.scope, r.state])).toEqual([['payments\u0000a', 'outcome_unknown']]);
    await expectProblem(await v1(`/idempotency/none-${uid()}/resolve`, { method: 'POST', headers: admin, body: '{"outcome":"released"}' }), 404, 'not-found');
    const fine = `fine-${uid()}`;
    expect((await command(gw.url, '/payments/charges', { fence: 1, entity: `tool-job:${uid()}`, key: fine, headers: worker })).status).toBe(201);
    await expectProblem(
      await v1(`/idempotency/${fine}/resolve`, { method: 'POST', headers: admin, body: '{"outcome":"released"}' }),
      409,
      'not-outcome-unknown',
    );
  });

  it('exports: NDJSON and CSV streams page through every matching row, newest (highest id) first', async () => {
    const entity = `export-${uid()}`;
    await gw.schema.pool.query(
      `INSERT INTO rejections (at, reason, entity, presented_fence, idempotency_key, caller, method, path)
       SELECT now() - i * interval '1 second', 'stale-fence', $1 || '-' || (i % 2), i, 'k-' || i, 'c', 'POST', '/p' FROM generate_series(1, 2500) AS i`,
      [entity],
    );
    const res = await v1(`/rejections?entity=${entity}-1`, { headers: { ...auditor, accept: 'application/x-ndjson' } });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/x-ndjson');
    const lines = (await res.text()).split('\n');
    expect(lines.pop()).toBe('');
    const rows = lines.map((l) => JSON.parse(l));
    expect(rows).toHaveLength(1250);
    expect(new Set(rows.map((r) => r.id)).size).toBe(1250);
    expect(rows.every((r, i) => i === 0 || Number(r.id) < Number(rows[i - 1].id))).toBe(true);
    expect(rows[0]).toMatchObject({ entity: `${entity}-1`, presented_fence: '2499', reason: 'stale-fence' });
    expect(rows.at(-1)).toMatchObject({ presented_fence: '1' });
    const csv = await (await v1(`/rejections?entity=${entity}-0&format=csv&limit=3`, { headers: auditor })).text();
    const csvLines = csv.split('\r\n');
    expect(csvLines[0]).toBe(
      'id,at,reason,entity,presented_fence,current_fence,idempotency_key,caller,method,path,payload_sha256,request_id,client_request_id,tool,detail',
    );
    expect(csvLines.slice(1, -1)).toHaveLength(3);
    expect(csvLines[1]).toContain(`,stale-fence,${entity}-0,2500,,k-2500,c,POST,/p,`);
  });

  it('GET /metrics: the rejection-log and outcome_unknown gauges come from the store', async () => {
    const before = await gw.store.auditStats();
    const entity = `tool-job:${uid()}`;
    expect((await command(gw.url, '/payments/x', { fence: 5, entity, key: `a-${uid()}`, headers: worker })).status).toBe(201);
    expect((await command(gw.url, '/payments/x', { fence: 4, entity, key: `b-${uid()}`, headers: worker })).status).toBe(409);
    await unknownRecord(`u-${uid()}`, `tool-job:${uid()}`);
    const after = await gw.store.auditStats();
    expect(after).toEqual({ rejections: before.rejections + 1, outcomeUnknown: before.outcomeUnknown + 1 });
    const text = await (await fetch(`${gw.url}/_fencegate/metrics`, { headers: auditor })).text();
    expect(text).toMatch(new RegExp(`^fencegate_rejection_log_rows ${after.rejections}$`, 'm'));
    expect(text).toMatch(new RegExp(`^fencegate_outcome_unknown_records ${after.outcomeUnknown}$`, 'm'));
    // Before the store had auditStats this gauge read 0 on PostgreSQL whatever the database did.
    expect(text).toMatch(/^fencegate_store_up 1$/m);
  });
});

describe.skipIf(!POSTGRES_URL)('PostgreSQL audit methods (store level)', () => {
  let gw: PgTestGateway;
  let up: FakeUpstream;
  beforeAll(async () => {
    up = await startUpstream();
    gw = await startPgTestGateway({ routes: [paymentsRoute(up.url)], prefix: 'fg_audit_store' });
  });
  afterAll(async () => {
    await gw?.close();
    await up?.close();
  });

  const uid = () => randomUUID().slice(0, 8);
  const admitInput = (over: Partial<AdmitInput> = {}): AdmitInput => ({
    scope: 'payments',
    key: `k-${uid()}`,
    entity: `e-${uid()}`,
    fence: 1n,
    fingerprint: 'fp',
    mode: 'concurrent',
    ownerToken: `o-${uid()}`,
    lockMs: 60_000,
    retentionMs: 3_600_000,
    onUnknown: 'reject',
    audit: { requestId: `r-${uid()}`, clientRequestId: null, caller: null, method: 'POST', path: '/p', payloadSha256: 'ab'.repeat(32) },
    ...over,
  });
  const finishOf = (i: AdmitInput, outcome: 'unknown' | 'completed'): FinishInput =>
    outcome === 'unknown'
      ? { scope: i.scope, key: i.key, entity: i.entity, ownerToken: i.ownerToken, audit: i.audit, outcome: 'unknown' }
      : {
          scope: i.scope,
          key: i.key,
          entity: i.entity,
          ownerToken: i.ownerToken,
          audit: i.audit,
          outcome: 'completed',
          response: { status: 200, headers: [['content-type', 'text/plain']], body: new TextEncoder().encode('late') },
          retentionMs: 60_000,
        };

  async function unknown(over: Partial<AdmitInput> = {}): Promise<AdmitInput> {
    const i = admitInput(over);
    expect((await gw.store.admit(i)).outcome).toBe('forward');
    expect((await gw.store.finish(finishOf(i, 'unknown'))).recorded).toBe(true);
    return i;
  }

  it('listRecords pages every outcome_unknown record once, ties on created_at broken by scope and key, text with U+0000 intact', async () => {
    const made = [] as AdmitInput[];
    for (let i = 0; i < 7; i++) made.push(await unknown({ scope: i % 2 === 0 ? 'payments' : `payments\u0000caller-${i}`, key: `tie-${i}-\uE000-${uid()}` }));
    // Five of them created in the same microsecond: the keyset must still walk them exactly once.
    await gw.schema.pool.query(`UPDATE idempotency_records SET created_at = '2020-01-01T00:00:00.123456Z' WHERE key = ANY($1)`, [
      made.slice(0, 5).map((m) => m.key!.replace(/\uE000/g, '\uE000\uE000')),
    ]);
    const seen: string[] = [];
    let cursor: string | undefined;
    for (let pages = 0; pages < 20; pages++) {
      const page = await gw.store.listRecords({ state: 'outcome_unknown', limit: 2, ...(cursor ? { cursor } : {}) });
      seen.push(...page.items.map((r) => `${r.scope}|${r.key}`));
      if (page.nextCursor === null) break;
      cursor = page.nextCursor;
    }
    const mine = seen.filter((s) => made.some((m) => s === `${m.scope}|${m.key}`));
    expect(mine.sort()).toEqual(made.map((m) => `${m.scope}|${m.key}`).sort());
    expect(new Set(seen).size).toBe(seen.length);
    // Newest first: the two not backdated come before the five from 2020.
    const order = seen.filter((s) => mine.includes(s));
    expect(order.slice(5).every((s) => made.slice(0, 5).some((m) => s === `${m.scope}|${m.key}`))).toBe(true);
    await expect(gw.store.listRecords({ state: 'outcome_unknown', limit: 2, cursor: 'bm90LWEtY3Vyc29y' })).rejects.toThrow();
  });

  it('20 parallel resolutions of one record: exactly one is applied and logged', async () => {
    const i = await unknown();
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, n) =>
        gw.store.resolveRecord({
          scope: i.scope,
          key: i.key!,
          resolution:
            n % 2 === 0
              ? { outcome: 'released' }
              : { outcome: 'completed', response: { status: 201, headers: [], body: new Uint8Array([n]) }, retentionMs: 60_000 },
          operator: `op-${n}`,
          note: null,
          requestId: `r-${n}`,
        }),
      ),
    );
    const ok = results.filter((r) => r.ok);
    expect(ok).toHaveLength(1);
    const logged = await gw.schema.pool.query(`SELECT count(*)::int AS n FROM operator_actions WHERE key = $1`, [i.key]);
    expect(logged.rows[0].n).toBe(1);
    for (const r of results) if (!r.ok) expect(['not-found', 'not-outcome-unknown']).toContain(r.reason);
  });

  it('a resolution racing the late finish of its owner: one of them settles the record, never both', async () => {
    for (let round = 0; round < 10; round++) {
      const i = await unknown();
      const [res, fin] = await Promise.all([
        gw.store.resolveRecord({
          scope: i.scope,
          key: i.key!,
          resolution: { outcome: 'completed', response: { status: 202, headers: [], body: new TextEncoder().encode('operator') }, retentionMs: 60_000 },
          operator: 'ops',
          note: null,
          requestId: 'r',
        }),
        gw.store.finish(finishOf(i, 'completed')),
      ]);
      const row = (await gw.schema.pool.query(`SELECT state, status, convert_from(body, 'UTF8') AS body FROM idempotency_records WHERE key = $1`, [i.key]))
        .rows[0];
      const actions = (await gw.schema.pool.query(`SELECT count(*)::int AS n FROM operator_actions WHERE key = $1`, [i.key])).rows[0].n;
      expect(row.state).toBe('completed');
      if (res.ok) {
        // The operator came first: the late finish finds a completed record and leaves it.
        expect(row).toMatchObject({ status: 202, body: 'operator' });
        expect(actions).toBe(1);
      } else {
        expect(res).toEqual({ ok: false, reason: 'not-outcome-unknown', state: 'completed' });
        expect(fin.recorded).toBe(true);
        expect(row).toMatchObject({ status: 200, body: 'late' });
        expect(actions).toBe(0);
      }
    }
  });
});
