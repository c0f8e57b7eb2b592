import { afterEach, describe, expect, it } from 'vitest';
import type { GatewayStore } from '../../src/store/types.js';
import { BULK_RESOLVE_MAX } from '../../src/http/audit/bulk-resolve.js';
import { command, expectProblem, paymentsRoute, snapshot, startTestGateway, type TestGateway, type TestGatewayOptions } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { bearer, hsAuth, token } from '../auth/tokens.js';

// POST /v1/idempotency/resolve-unknown (src/http/audit/bulk-resolve.ts): a
// route's outcome_unknown records in a time window released in one call.
// Real gateway on loopback, real SQLite file; the records are made
// outcome_unknown by a real upstream that hangs past the route's timeout.

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const TIMEOUT_MS = 200;

async function setup(options: Partial<TestGatewayOptions> = {}): Promise<{ gw: TestGateway; up: FakeUpstream }> {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const routes = [
    paymentsRoute(up.url, { timeoutMs: TIMEOUT_MS }),
    paymentsRoute(up.url, { name: 'refunds', match: { path: '/refunds/*', methods: ['POST'] }, timeoutMs: TIMEOUT_MS }),
  ];
  const gw = await startTestGateway({ routes, ...options });
  cleanups.unshift(() => gw.close());
  return { gw, up };
}

/** Requests the hanging upstream never answers: each leaves an outcome_unknown record (504). */
async function unknowns(gw: TestGateway, up: FakeUpstream, keys: string[], path = '/payments/charges', headers: Record<string, string> = {}): Promise<void> {
  up.behave(() => ({ kind: 'hang' }));
  const answers = await Promise.all(keys.map((key) => command(gw.url, path, { fence: 1, entity: `tool-job:${key}`, key, headers })));
  for (const res of answers) await expectProblem(res, 504, 'upstream-timeout');
  up.behave(null);
}

const stateOf = (gw: TestGateway, key: string) =>
  (gw.sqlite.db.prepare('SELECT state FROM idempotency_records WHERE key = ?').get(key) as { state: string } | undefined)?.state ?? null;
const actions = (gw: TestGateway) =>
  gw.sqlite.db.prepare('SELECT action, key, note, operator, request_id FROM operator_actions ORDER BY id').all() as {
    action: string;
    key: string;
    note: string;
    operator: string | null;
    request_id: string;
  }[];
const backdate = (gw: TestGateway, key: string, ms: number) =>
  gw.sqlite.db.prepare('UPDATE idempotency_records SET created_at = created_at - ? WHERE key = ?').run(ms, key);

function bulk(gw: TestGateway, body: unknown, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${gw.url}/_fencegate/v1/idempotency/resolve-unknown`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
}

const window = (o: Record<string, unknown> = {}) => ({
  route: 'payments',
  from: new Date(Date.now() - 3_600_000).toISOString(),
  to: new Date(Date.now() + 60_000).toISOString(),
  outcome: 'released',
  ...o,
});

describe('POST /v1/idempotency/resolve-unknown', () => {
  it('releases the route’s outcome_unknown records in [from, to), one operator action each; others untouched', async () => {
    const { gw, up } = await setup();
    await unknowns(gw, up, ['u1', 'u2', 'u3', 'old']);
    await unknowns(gw, up, ['r1'], '/refunds/x');
    backdate(gw, 'old', 3 * 3_600_000); // created before the window
    expect(up.effects).toBe(5);

    // Dry run: the same selection, no state change.
    const before = snapshot(gw.sqlite);
    const dry = await bulk(gw, window({ dry_run: true, note: 'upstream down 10:00-10:20' }));
    expect(dry.status).toBe(200);
    const d: any = await dry.json();
    expect(d).toMatchObject({ dry_run: true, matched: 3, resolved: 0, skipped: 0, more: false });
    expect([...d.keys].sort()).toEqual(['u1', 'u2', 'u3']);
    expect(snapshot(gw.sqlite)).toBe(before);
    expect(actions(gw)).toEqual([]);

    const res = await bulk(gw, window({ note: 'upstream down 10:00-10:20' }));
    expect(res.status, await res.clone().text()).toBe(200);
    const body: any = await res.json();
    expect(body).toMatchObject({ dry_run: false, matched: 3, resolved: 3, skipped: 0, more: false, bulk_id: expect.stringMatching(/^[0-9a-f-]{36}$/) });
    expect([...body.keys].sort()).toEqual(['u1', 'u2', 'u3']);
    // Control of the dry run: the real call does change the state.
    expect(snapshot(gw.sqlite)).not.toBe(before);

    for (const k of ['u1', 'u2', 'u3']) expect(stateOf(gw, k)).toBeNull();
    expect(stateOf(gw, 'old')).toBe('outcome_unknown');
    expect(stateOf(gw, 'r1')).toBe('outcome_unknown');

    const rows = actions(gw);
    expect(rows.map((r) => r.key).sort()).toEqual(['u1', 'u2', 'u3']);
    for (const r of rows) {
      expect(r).toMatchObject({ action: 'resolve-released', operator: null, note: `bulk ${body.bulk_id}: upstream down 10:00-10:20` });
    }
    expect(new Set(rows.map((r) => r.request_id)).size).toBe(3);

    // Released: the next retry is forwarded again.
    const retry = await command(gw.url, '/payments/charges', { fence: 1, entity: 'tool-job:u1', key: 'u1' });
    expect(retry.status).toBe(201);
    expect(up.effects).toBe(6);
    // A record the window leaves out is still refused.
    await expectProblem(await command(gw.url, '/payments/charges', { fence: 1, entity: 'tool-job:old', key: 'old' }), 409, 'outcome-unknown');

    // Control of the window: widened, the old record is taken too.
    const wide = await (await bulk(gw, window({ from: new Date(Date.now() - 4 * 3_600_000).toISOString() }))).json();
    expect(wide).toMatchObject({ resolved: 1, keys: ['old'] });
  });

  it('bad input: 400 invalid-request, nothing changes', async () => {
    const { gw, up } = await setup();
    await unknowns(gw, up, ['b1']);
    const before = snapshot(gw.sqlite);
    const now = Date.now();
    const bad: unknown[] = [
      'not json',
      {},
      window({ route: undefined }),
      window({ route: 'pay ments' }),
      window({ from: 'yesterday' }),
      window({ to: '2026-13-01' }),
      window({ from: new Date(now).toISOString(), to: new Date(now - 1000).toISOString() }),
      window({ outcome: 'completed' }),
      window({ dry_run: 'yes' }),
      window({ note: 'x'.repeat(2001) }),
      window({ scope: 'payments' }),
    ];
    for (const b of bad) {
      const p = await expectProblem(await bulk(gw, b), 400, 'invalid-request');
      expect(p.detail.length).toBeGreaterThan(0);
    }
    expect(snapshot(gw.sqlite)).toBe(before);
    expect(actions(gw)).toEqual([]);
  });

  it('with auth: the admin scope, as the one-key resolve; audit scope and no token change nothing', async () => {
    const { gw, up } = await setup({ config: { auth: hsAuth() } });
    const worker = bearer(await token({ sub: 'billing' }));
    await unknowns(gw, up, ['a1', 'a2'], '/payments/charges', worker);
    // The refusals themselves go to the rejection log; the records must not change.
    const records = () => JSON.stringify(JSON.parse(snapshot(gw.sqlite)).records);
    const before = records();
    expect((await bulk(gw, window())).status).toBe(401);
    expect((await bulk(gw, window(), bearer(await token({ sub: 'auditor', scope: 'fencegate:audit' })))).status).toBe(403);
    expect(records()).toBe(before);
    expect(actions(gw)).toEqual([]);
    const ok = await (await bulk(gw, window({ note: 'n' }), bearer(await token({ sub: 'ops-alice', scope: 'fencegate:admin' })))).json();
    expect(ok).toMatchObject({ resolved: 2, skipped: 0 });
    expect(actions(gw).map((r) => r.operator)).toEqual(['ops-alice', 'ops-alice']);
  });

  /**
   * A record settled by someone else between the listing and the bulk's
   * write. `unconditional` is the negative control: a resolve that does not
   * check the state overwrites it, and the checks below see it.
   */
  async function changedMeanwhile(unconditional: boolean) {
    let gw!: TestGateway;
    let raced = false;
    const wrapStore = (inner: GatewayStore): GatewayStore =>
      new Proxy(inner, {
        get(target, prop, receiver) {
          if (prop === 'listRecords') {
            return async (q: Parameters<GatewayStore['listRecords']>[0]) => {
              const page = await target.listRecords(q);
              if (!raced && page.items.some((r) => r.key === 'm1')) {
                raced = true;
                const m1 = page.items.find((r) => r.key === 'm1')!;
                const other = await target.resolveRecord({
                  scope: m1.scope,
                  key: 'm1',
                  operator: 'ops-bob',
                  note: 'confirmed in the dashboard',
                  requestId: 'other',
                  resolution: {
                    outcome: 'completed',
                    response: { status: 201, headers: [['content-type', 'application/json']], body: new TextEncoder().encode('{"id":"ch_9"}') },
                    retentionMs: 3_600_000,
                  },
                });
                expect(other.ok).toBe(true);
              }
              return page;
            };
          }
          if (prop === 'resolveRecord' && unconditional) {
            return async (input: Parameters<GatewayStore['resolveRecord']>[0]) => {
              const r = await target.resolveRecord(input);
              if (r.ok) return r;
              gw.sqlite.db.prepare('DELETE FROM idempotency_records WHERE scope = ? AND key = ?').run(input.scope, input.key);
              return {
                ok: true,
                action: {
                  id: '0',
                  at: new Date(),
                  action: 'resolve-released',
                  scope: input.scope,
                  key: input.key,
                  entity: null,
                  fence: null,
                  fingerprint: '',
                  status: null,
                  operator: null,
                  note: input.note,
                  requestId: input.requestId,
                },
              };
            };
          }
          return Reflect.get(target, prop, receiver);
        },
      });
    const s = await setup({ wrapStore });
    gw = s.gw;
    await unknowns(gw, s.up, ['m1', 'm2']);
    const body = await (await bulk(gw, window())).json();
    const replay = await command(gw.url, '/payments/charges', { fence: 1, entity: 'tool-job:m1', key: 'm1' });
    return { body, state: stateOf(gw, 'm1'), replay: await replay.text(), effects: s.up.effects };
  }

  it('a record that left outcome_unknown meanwhile is skipped, its resolution kept (negative control: an unconditional write overwrites it)', async () => {
    const real = await changedMeanwhile(false);
    expect(real.body).toMatchObject({ matched: 2, resolved: 1, skipped: 1, keys: ['m2'] });
    expect(real.state).toBe('completed');
    expect(real.replay).toBe('{"id":"ch_9"}');
    expect(real.effects).toBe(2);

    const control = await changedMeanwhile(true);
    expect(control.body).toMatchObject({ resolved: 2, skipped: 0 });
    expect(control.replay).not.toBe('{"id":"ch_9"}');
    expect(control.effects).toBe(3); // the confirmed payment was forwarded again
  });

  /**
   * Between the listing and the bulk's write, another operator releases the
   * listed record and a retry with the key is forwarded and times out: a NEW
   * outcome_unknown record, an attempt the bulk call never saw. The bulk call
   * names the listed attempt by its createdAt. `withoutCreatedAt` is the
   * negative control: the resolution names no attempt, and the new one is
   * released in its place.
   */
  async function replacedMeanwhile(withoutCreatedAt: boolean) {
    let gw!: TestGateway;
    let up!: FakeUpstream;
    let raced = false;
    const wrapStore = (inner: GatewayStore): GatewayStore =>
      new Proxy(inner, {
        get(target, prop, receiver) {
          if (prop === 'resolveRecord') {
            return async (input: Parameters<GatewayStore['resolveRecord']>[0]) => {
              if (!raced && input.key === 'n1') {
                raced = true;
                const other = await target.resolveRecord({
                  scope: input.scope,
                  key: 'n1',
                  resolution: { outcome: 'released' },
                  operator: 'ops-bob',
                  note: 'single',
                  requestId: 'other',
                });
                expect(other.ok).toBe(true);
                await unknowns(gw, up, ['n1']); // the retry: forwarded, then outcome_unknown again
              }
              if (withoutCreatedAt) {
                const { createdAt: _dropped, ...rest } = input;
                return target.resolveRecord(rest);
              }
              return target.resolveRecord(input);
            };
          }
          return Reflect.get(target, prop, receiver);
        },
      });
    const s = await setup({ wrapStore });
    gw = s.gw;
    up = s.up;
    await unknowns(gw, up, ['n1', 'n2']);
    const body = await (await bulk(gw, window())).json();
    const state = stateOf(gw, 'n1');
    const retry = await command(gw.url, '/payments/charges', { fence: 1, entity: 'tool-job:n1', key: 'n1' });
    return { body, state, retry: retry.status, effects: up.effects, actions: actions(gw).map((a) => `${a.key}:${a.operator ?? 'bulk'}`) };
  }

  it('a record a later attempt replaced meanwhile is skipped, the new attempt kept (negative control: without createdAt it is released)', async () => {
    const real = await replacedMeanwhile(false);
    expect(real.body).toMatchObject({ matched: 2, resolved: 1, skipped: 1, keys: ['n2'] });
    expect(real.state).toBe('outcome_unknown');
    expect(real.retry).toBe(409); // the new attempt's outcome is still unknown: not forwarded again
    expect(real.effects).toBe(3); // n1, n2, and n1's retry
    expect(real.actions.sort()).toEqual(['n1:ops-bob', 'n2:bulk']);

    const control = await replacedMeanwhile(true);
    expect(control.body).toMatchObject({ resolved: 2, skipped: 0 });
    expect(control.state).toBeNull();
    expect(control.retry).toBe(201);
    expect(control.effects).toBe(4); // the retry's possible side effect, forwarded a second time
  });

  it(`at most ${BULK_RESOLVE_MAX} per call; "more" says whether others are left`, async () => {
    const { gw, up } = await setup();
    await unknowns(gw, up, ['seed']);
    // Copies of the real record (same route, scope, window) under other keys.
    gw.sqlite.db.exec(`INSERT INTO idempotency_records (scope, key, fingerprint, entity, fence, state, owner_token, locked_until, status, headers, body, created_at, expires_at)
      WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ${BULK_RESOLVE_MAX + 4})
      SELECT r.scope, 'copy-' || n.i, r.fingerprint, r.entity, r.fence, r.state, r.owner_token || n.i, r.locked_until, r.status, r.headers, r.body, r.created_at, r.expires_at
      FROM n, idempotency_records r WHERE r.key = 'seed'`);
    const first: any = await (await bulk(gw, window())).json();
    expect(first).toMatchObject({ matched: BULK_RESOLVE_MAX, resolved: BULK_RESOLVE_MAX, skipped: 0, more: true });
    expect(first.keys).toHaveLength(100);
    const second = await (await bulk(gw, window())).json();
    expect(second).toMatchObject({ resolved: 5, more: false });
    expect(gw.sqlite.db.prepare("SELECT count(*) AS n FROM idempotency_records WHERE state = 'outcome_unknown'").get()).toEqual({ n: 0 });
  }, 120_000);

  it('the one-key resolve with "created_at": a stale attempt 409 and nothing changes; the listed one resolves; a bad one 400', async () => {
    const { gw, up } = await setup();
    const resolve = (body: unknown) =>
      fetch(`${gw.url}/_fencegate/v1/idempotency/s1/resolve`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    await unknowns(gw, up, ['s1']);
    const firstSeen: string = (await gw.admin('/v1/idempotency')).body.items[0].created_at;
    expect((await resolve({ outcome: 'released', created_at: firstSeen })).status).toBe(200);
    await unknowns(gw, up, ['s1']); // a retry: a new attempt, outcome_unknown again
    const listed: string = (await gw.admin('/v1/idempotency')).body.items[0].created_at;
    expect(listed).not.toBe(firstSeen);

    const before = snapshot(gw.sqlite);
    const stale = await expectProblem(await resolve({ outcome: 'released', created_at: firstSeen }), 409, 'not-outcome-unknown');
    expect(stale).toMatchObject({ state: 'outcome_unknown', created_at: listed });
    await expectProblem(await resolve({ outcome: 'released', created_at: 'yesterday' }), 400, 'invalid-request');
    expect(snapshot(gw.sqlite)).toBe(before);
    // Control: the created_at the listing shows for the record now resolves it.
    expect((await resolve({ outcome: 'released', created_at: listed })).status).toBe(200);
    expect(stateOf(gw, 's1')).toBeNull();
  });
});
