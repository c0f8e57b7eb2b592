import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  command,
  effectOf,
  expectProblem,
  expireLocks,
  paymentsRoute,
  recordRows,
  rejectionRows,
  startTestGateway,
  type RouteInput,
  type TestGateway,
} from '../helpers/gateway.js';
import { rawRequest } from '../helpers/raw-http.js';
import { spyOnAdmissions, type AdmissionSpy } from '../helpers/store-wrappers.js';
import { freePort, startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// Every status code of DESIGN §3.8, against a real gateway server on
// loopback, a real SQLite file and a recording upstream that is not idempotent.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  // Upstreams first: a hanging upstream call would keep the gateway's drain waiting.
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function upstream(port?: number): Promise<FakeUpstream> {
  const u = await startUpstream({ port });
  cleanups.push(() => u.close());
  return u;
}

async function gateway(routes: RouteInput[], spy?: (s: AdmissionSpy) => void): Promise<TestGateway> {
  const gw = await startTestGateway({
    routes,
    wrapStore: spy
      ? (s) => {
          const sp = spyOnAdmissions(s);
          spy(sp);
          return sp.store;
        }
      : undefined,
  });
  // Registered before the upstream's cleanup runs (cleanups run in reverse).
  cleanups.unshift(() => gw.close());
  return gw;
}

describe('refusals before admission', () => {
  it('404 no-route: unknown path, and a method the route does not list', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    await expectProblem(await command(gw.url, '/nothing/here', { fence: 1, entity: 'e', key: 'k' }), 404, 'no-route');
    await expectProblem(await fetch(`${gw.url}/payments/charges`, { method: 'GET' }), 404, 'no-route');
    // `/payments/*` needs at least one more segment.
    await expectProblem(await command(gw.url, '/payments', { fence: 1, entity: 'e', key: 'k' }), 404, 'no-route');
    expect(up.effects).toBe(0);
  });

  it('400 for each header problem, with the exact code', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    const p = '/payments/charges';
    await expectProblem(await command(gw.url, p, { entity: 'e', key: 'k' }), 400, 'missing-fence');
    await expectProblem(await command(gw.url, p, { fence: '+5', entity: 'e', key: 'k' }), 400, 'invalid-fence');
    await expectProblem(await command(gw.url, p, { fence: 5, entity: 'e' }), 400, 'missing-idempotency-key');
    await expectProblem(await command(gw.url, p, { fence: 5, entity: 'e', key: '"open' }), 400, 'invalid-idempotency-key');
    await expectProblem(await command(gw.url, p, { fence: 5, key: 'k' }), 400, 'missing-entity');
    await expectProblem(await command(gw.url, p, { fence: 5, entity: 'x'.repeat(513), key: 'k' }), 400, 'invalid-entity');
    expect(up.effects).toBe(0);
  });

  it('413 payload-too-large, declared by Content-Length and streamed in chunks', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url, { maxBodyBytes: 1024 })]);
    const headers: [string, string][] = [
      ['X-Execution-Fence', '1'],
      ['X-Fence-Entity', 'e'],
      ['Idempotency-Key', 'k'],
      ['Content-Type', 'application/octet-stream'],
    ];
    const declared = await rawRequest(gw.url, { path: '/payments/charges', headers, body: Buffer.alloc(1025, 1) });
    expect(declared.status).toBe(413);
    expect(declared.headers['content-type']).toBe('application/problem+json');
    expect(JSON.parse(declared.text).type).toMatch(/\/payload-too-large$/);

    // No Content-Length: the limit is enforced while reading.
    const streamed = await rawRequest(gw.url, { path: '/payments/charges', headers, body: Buffer.alloc(4096, 2), chunked: 512 });
    expect(streamed.status).toBe(413);
    expect(JSON.parse(streamed.text)).toMatchObject({ status: 413, type: expect.stringMatching(/\/payload-too-large$/) });

    // Exactly at the limit is fine, streamed or not.
    const atLimit = await rawRequest(gw.url, { path: '/payments/charges', headers, body: Buffer.alloc(1024, 3), chunked: 100 });
    expect(atLimit.status).toBe(201);
    expect(up.effects).toBe(1);
    expect(up.calls[0]!.body.equals(Buffer.alloc(1024, 3))).toBe(true);
  });
});

describe('admission', () => {
  it('409 stale-fence with entity, presented and current fence; logged; equal fence is accepted', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    expect((await command(gw.url, '/payments/charges', { fence: 5, entity: 'job-1', key: 'a' })).status).toBe(201);
    // Equal fence: one owner may send several commands.
    expect((await command(gw.url, '/payments/charges', { fence: 5, entity: 'job-1', key: 'b' })).status).toBe(201);

    const res = await command(gw.url, '/payments/charges', { fence: 4, entity: 'job-1', key: 'c' });
    await expectProblem(res, 409, 'stale-fence', { entity: 'job-1', presented_fence: '4', current_fence: '5' });
    expect(up.effects).toBe(2);
    expect(up.calls.map((c) => c.fence)).toEqual(['5', '5']);

    const log = await gw.admin('/v1/rejections?entity=job-1');
    expect(log.body.items).toHaveLength(1);
    expect(log.body.items[0]).toMatchObject({
      reason: 'stale-fence',
      entity: 'job-1',
      presented_fence: '4',
      current_fence: '5',
      idempotency_key: 'c',
      method: 'POST',
      path: '/payments/charges',
    });
    expect(log.body.items[0].payload_sha256).toMatch(/^[0-9a-f]{64}$/);
    // A refused key leaves no record: it can be used again by the right owner.
    expect(recordRows(gw.sqlite, 'c')).toEqual([]);
    const entity = await gw.admin('/v1/entities/job-1');
    expect(entity.body).toMatchObject({ entity: 'job-1', fence: '5', inflight: null });
  });

  it('422 idempotency-key-reused for the same key with another body; logged', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    expect((await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k', body: '{"amount":1}' })).status).toBe(201);
    const res = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k', body: '{"amount":2}' });
    await expectProblem(res, 422, 'idempotency-key-reused', { idempotency_key: 'k' });
    // Another path or content type is another request too.
    await expectProblem(await command(gw.url, '/payments/refunds', { fence: 1, entity: 'e', key: 'k', body: '{"amount":1}' }), 422, 'idempotency-key-reused');
    await expectProblem(
      await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k', body: '{"amount":1}', headers: { 'content-type': 'text/plain' } }),
      422,
      'idempotency-key-reused',
    );
    expect(up.effects).toBe(1);
    expect(rejectionRows(gw.sqlite, 'idempotency-key-reused')).toHaveLength(3);
  });

  it('409 idempotency-in-progress with Retry-After; Prefer: wait=N turns it into the replay', async () => {
    const up = await upstream();
    let spy!: AdmissionSpy;
    const gw = await gateway([paymentsRoute(up.url)], (s) => (spy = s));
    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise }));

    const first = command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    await up.waitForCalls(1);
    const busy = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    const problem = await expectProblem(busy, 409, 'idempotency-in-progress', { idempotency_key: 'k' });
    expect(busy.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    expect(problem.retry_after).toBe(Number(busy.headers.get('retry-after')));

    // With Prefer: wait, the second caller waits for the first to finish.
    const waiting = command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k', headers: { prefer: 'wait=20' } });
    // Two in-progress answers: the 409 above, and now the waiter's first look.
    await spy.waitForAdmission(() => spy.admissions.filter((a) => a.admission.outcome === 'idempotency-in-progress').length >= 2);
    gate.open();
    const original = await first;
    const replay = await waiting;
    expect(original.status).toBe(201);
    expect(original.headers.get('idempotent-replayed')).toBeNull();
    expect(replay.status).toBe(201);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await replay.text()).toBe(await original.text());
    expect(up.effects).toBe(1);
  });

  it("Prefer: wait is bounded by the route's maxWaitMs: past it, the answer is still 409 idempotency-in-progress", async () => {
    const up = await upstream();
    let spy!: AdmissionSpy;
    const gw = await gateway([paymentsRoute(up.url, { maxWaitMs: 50 })], (s) => (spy = s));
    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise }));
    const first = command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    await up.waitForCalls(1);
    const res = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k', headers: { prefer: 'wait=600' } });
    await expectProblem(res, 409, 'idempotency-in-progress');
    // It did wait (looked more than once) before giving up.
    expect(spy.admissions.filter((a) => a.admission.outcome === 'idempotency-in-progress').length).toBeGreaterThan(1);
    gate.open();
    expect((await first).status).toBe(201);
  });

  it('expired in-progress lock → outcome_unknown → 409 outcome-unknown (logged); the late finish still completes it', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise }));
    const first = command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    await up.waitForCalls(1);

    // As if the gateway holding the record had died (its lock ran out).
    expireLocks(gw.sqlite, 'k', 'e');
    await expectProblem(await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' }), 409, 'outcome-unknown', { idempotency_key: 'k' });
    expect(recordRows(gw.sqlite, 'k')[0]!.state).toBe('outcome_unknown');
    expect(rejectionRows(gw.sqlite, 'outcome-unknown')).toHaveLength(1);
    // Still refused on the next retry: nobody re-sends it blindly.
    await expectProblem(await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' }), 409, 'outcome-unknown');

    // DESIGN §3.7: a late finish of a record only marked outcome_unknown completes it.
    gate.open();
    const original = await first;
    expect(original.status).toBe(201);
    const body = await original.text();
    expect(recordRows(gw.sqlite, 'k')[0]!.state).toBe('completed');
    const replay = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await replay.text()).toBe(body);
    expect(up.effects).toBe(1);
  });

  it('onUnknown "retry": the retry takes the record over and is forwarded once more; the old owner\'s late finish is discarded and logged', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url, { onUnknown: 'retry' })]);
    const gate = up.gate();
    up.behave((call) => (call.seq === 1 ? { kind: 'hold', gate: gate.promise } : undefined));
    const first = command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    await up.waitForCalls(1);
    const ownerBefore = recordRows(gw.sqlite, 'k')[0]!.owner_token;

    expireLocks(gw.sqlite, 'k', 'e');
    const takeover = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    expect(takeover.status).toBe(201);
    expect((await effectOf(takeover)).effect).toBe(2);
    expect(up.callsFor('k')).toHaveLength(2);
    expect(recordRows(gw.sqlite, 'k')[0]!.owner_token).not.toBe(ownerBefore);
    // Exactly once more: the next retry is the replay of the take-over.
    const replay = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect((await effectOf(replay)).effect).toBe(2);

    gate.open();
    expect((await first).status).toBe(201);
    expect(rejectionRows(gw.sqlite, 'late-finish')).toMatchObject([{ idempotency_key: 'k' }]);
    const after = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    expect((await effectOf(after)).effect).toBe(2);
    expect(up.effects).toBe(2);
  });

  it('409 entity-busy with Retry-After after the bounded serial wait; within the wait the second request goes after the first', async () => {
    const up = await upstream();
    let spy!: AdmissionSpy;
    const gw = await gateway(
      [paymentsRoute(up.url, { serialWaitMs: 100 }), paymentsRoute(up.url, { name: 'patient', match: { path: '/patient/*' }, serialWaitMs: 20_000 })],
      (s) => (spy = s),
    );
    const gate = up.gate();
    up.behave((call) => (call.seq === 1 ? { kind: 'hold', gate: gate.promise } : undefined));
    const first = command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'a' });
    await up.waitForCalls(1);

    const busy = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'b' });
    const problem = await expectProblem(busy, 409, 'entity-busy', { entity: 'e' });
    expect(busy.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    expect(problem.retry_after).toBe(Number(busy.headers.get('retry-after')));
    // A busy answer leaves nothing behind: the key is free for the retry.
    expect(recordRows(gw.sqlite, 'b')).toEqual([]);

    // Another entity is not held up by this one.
    expect((await command(gw.url, '/payments/charges', { fence: 1, entity: 'other', key: 'c' })).status).toBe(201);

    const patient = command(gw.url, '/patient/charges', { fence: 1, entity: 'e', key: 'd' });
    await spy.waitForAdmission((input, a) => input.key === 'd' && a.outcome === 'entity-busy');
    expect(up.callsFor('d')).toHaveLength(0);
    gate.open();
    expect((await first).status).toBe(201);
    expect((await patient).status).toBe(201);
    const d = up.callsFor('d')[0]!;
    expect(d.inflightForEntity).toBe(1);
    expect(d.seq).toBeGreaterThan(up.callsFor('a')[0]!.seq);
  });
});

describe('upstream outcomes', () => {
  it('502 upstream-unavailable on connection refused: the record is released and a retry succeeds', async () => {
    const port = await freePort();
    const gw = await gateway([paymentsRoute(`http://127.0.0.1:${port}`)]);
    const res = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    await expectProblem(res, 502, 'upstream-unavailable');
    expect(recordRows(gw.sqlite, 'k')).toEqual([]);
    expect((await gw.admin('/v1/entities/e')).body.inflight).toBeNull();

    const up = await upstream(port);
    const retry = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    expect(up.effects).toBe(1);
  });

  it('504 upstream-timeout: the record becomes outcome_unknown and the retry gets 409 outcome-unknown', async () => {
    const up = await upstream();
    // Short enough that the hang below ends soon, long enough that the last
    // command, which must succeed, is not timed out by a stalled box.
    const gw = await gateway([paymentsRoute(up.url, { timeoutMs: 1_000 })]);
    up.behave(() => ({ kind: 'hang' }));
    await expectProblem(await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' }), 504, 'upstream-timeout');
    expect(recordRows(gw.sqlite, 'k')[0]!.state).toBe('outcome_unknown');
    const idem = await gw.admin('/v1/idempotency/k');
    expect(idem.body.records[0]).toMatchObject({ state: 'outcome_unknown', entity: 'e', fence: '1' });
    expect(idem.body.records[0]).not.toHaveProperty('body');

    up.behave(null);
    await expectProblem(await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' }), 409, 'outcome-unknown');
    expect(up.effects).toBe(1);
    // The serial slot was freed: the entity takes new commands.
    expect((await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k2' })).status).toBe(201);
  });

  it('504 upstream-timeout when the upstream resets the connection after the request was sent', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    up.behave(() => ({ kind: 'reset' }));
    await expectProblem(await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' }), 504, 'upstream-timeout');
    expect(recordRows(gw.sqlite, 'k')[0]!.state).toBe('outcome_unknown');
    expect(up.effects).toBe(1);
  });

  it.each([429, 503])('%i from the upstream is passed through and released, not stored: the retry is forwarded', async (status) => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    up.behave((call) => (call.seq === 1 ? { kind: 'respond', status, headers: { 'retry-after': '1' }, body: 'slow down' } : undefined));
    const first = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    expect(first.status).toBe(status);
    expect(await first.text()).toBe('slow down');
    expect(recordRows(gw.sqlite, 'k')).toEqual([]);

    const retry = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    expect(up.effects).toBe(2);
  });

  it('500 from the upstream is stored and replayed', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    up.behave((call) => ({ kind: 'respond', status: 500, headers: { 'content-type': 'application/json' }, body: `{"error":"boom","effect":${call.seq}}` }));
    const first = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    expect(first.status).toBe(500);
    const body = await first.text();
    const replay = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    expect(replay.status).toBe(500);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.headers.get('content-type')).toBe('application/json');
    expect(await replay.text()).toBe(body);
    expect(up.effects).toBe(1);
  });
});

describe('the admin API (DESIGN §5)', () => {
  // Read by the other gateway tests as an operator would; here its own contract.

  let up: FakeUpstream;
  let gw: TestGateway;

  beforeAll(async () => {
    up = await startUpstream();
    gw = await startTestGateway({ routes: [paymentsRoute(up.url)] });
    expect((await command(gw.url, '/payments/charges', { fence: 10, entity: 'job-a', key: 'paid', body: '{"secret":"card-4242"}' })).status).toBe(201);
    for (let f = 1; f <= 5; f++) expect((await command(gw.url, '/payments/charges', { fence: f, entity: 'job-a', key: `stale-${f}` })).status).toBe(409);
    expect((await command(gw.url, '/payments/charges', { fence: 10, entity: 'job-a', key: 'paid', body: '{"other":1}' })).status).toBe(422);
  });

  afterAll(async () => {
    await up?.close();
    await gw?.close();
  });

  it('GET /health', async () => {
    expect(await gw.admin('/health')).toEqual({ status: 200, body: { status: 'ok' } });
  });

  it('GET /v1/rejections: newest first, filters, keyset pagination, ISO times, no bodies', async () => {
    const all = await gw.admin('/v1/rejections');
    expect(all.body.items.map((r: any) => r.reason)).toEqual(['idempotency-key-reused', ...Array(5).fill('stale-fence')]);
    expect(all.body.next_cursor).toBeNull();
    const item = all.body.items[1];
    for (const field of [
      'id',
      'at',
      'reason',
      'entity',
      'presented_fence',
      'current_fence',
      'idempotency_key',
      'method',
      'path',
      'payload_sha256',
      'request_id',
    ]) {
      expect(item, field).toHaveProperty(field);
    }
    expect(new Date(item.at).toISOString()).toBe(item.at);
    expect(JSON.stringify(all.body)).not.toContain('card-4242');

    const pages: string[][] = [];
    let cursor: string | null = null;
    do {
      const page: any = await gw.admin(`/v1/rejections?reason=stale-fence&limit=2${cursor ? `&cursor=${cursor}` : ''}`);
      pages.push(page.body.items.map((r: any) => r.presented_fence));
      cursor = page.body.next_cursor;
    } while (cursor !== null);
    expect(pages).toEqual([['5', '4'], ['3', '2'], ['1']]);

    expect((await gw.admin('/v1/rejections?entity=nobody')).body.items).toEqual([]);
    expect((await gw.admin('/v1/rejections?since=1h')).body.items).toHaveLength(6);
    expect((await gw.admin(`/v1/rejections?until=${encodeURIComponent('2000-01-01T00:00:00Z')}`)).body.items).toHaveLength(0);
  });

  it('GET /v1/rejections with a bad parameter is a 400 naming it', async () => {
    for (const [q, name] of [
      ['limit=0', 'limit'],
      ['limit=abc', 'limit'],
      ['since=yesterday', 'since'],
      ['cursor=x', 'cursor'],
    ]) {
      const res = await gw.admin(`/v1/rejections?${q}`);
      expect(res.status).toBe(400);
      expect(res.body.detail).toMatch(new RegExp(`^${name}`));
    }
  });

  it('GET /v1/entities/:entity, 404 when unknown', async () => {
    const e = await gw.admin('/v1/entities/job-a');
    expect(e.body).toMatchObject({ entity: 'job-a', fence: '10', inflight: null });
    expect(new Date(e.body.accepted_at).toISOString()).toBe(e.body.accepted_at);
    const missing = await gw.admin('/v1/entities/nobody');
    expect(missing.status).toBe(404);
    expect(missing.body.type).toMatch(/\/not-found$/);
  });

  it('GET /v1/idempotency/:key: state and metadata, never the stored body', async () => {
    const r = await gw.admin('/v1/idempotency/paid');
    expect(r.body.records).toMatchObject([{ scope: 'payments', state: 'completed', entity: 'job-a', fence: '10', status: 201 }]);
    // The fields docs/http-api.md documents, no more (the key is named once, at the top).
    expect(Object.keys(r.body.records[0]).sort()).toEqual([
      'attempt_until',
      'created_at',
      'entity',
      'expires_at',
      'fence',
      'fingerprint',
      'interim',
      'last_reconcile',
      'locked_until',
      'request_id',
      'scope',
      'state',
      'status',
    ]);
    expect(JSON.stringify(r.body)).not.toContain('effect');
    expect((await gw.admin('/v1/idempotency/never')).status).toBe(404);
  });
});
