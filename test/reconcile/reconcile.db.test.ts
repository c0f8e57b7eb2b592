import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import type { GatewayStore, RecordInfo } from '../../src/store/types.js';
import { startTestGateway, type RouteInput } from '../helpers/gateway.js';
import { startPgTestGateway } from '../helpers/pg-gateway.js';
import { POSTGRES_URL, until } from '../helpers/postgres.js';
import { withoutReconcileWait } from '../helpers/store-wrappers.js';
import { broken } from '../store/conformance.js';
import { startProvider, type Provider } from './provider.js';

// DESIGN §3.12: the status query for a record whose outcome is unknown, on a
// real provider over loopback and a real store (a SQLite file; PostgreSQL
// with FENCEGATE_TEST_POSTGRES_URL). Time past the "not found" rule is
// reached by backdating the record's created_at and its attempt's lock end
// (attempt_until) in SQL (convention 2), or, for the lagging provider, by
// real short durations.

interface G {
  url: string;
  store: GatewayStore;
  reconcile(): ReturnType<Awaited<ReturnType<typeof startTestGateway>>['running']['gateway']['reconcile']>;
  admin(path: string): Promise<any>;
  metrics(): Promise<string>;
  /** Time passes for the record: its created_at and its attempt's lock end move `ms` into the past. */
  backdate(key: string, ms: number): Promise<void>;
  /** Replaces the gateway's routes (a SIGHUP reload with another configuration). */
  reload(routes: RouteInput[]): Promise<void>;
  close(): Promise<void>;
}

type Start = (routes: RouteInput[], wrapStore?: (s: GatewayStore) => GatewayStore) => Promise<G>;

const sqlite: Start = async (routes, wrapStore) => {
  const g = await startTestGateway({ routes, ...(wrapStore ? { wrapStore } : {}) });
  return {
    url: g.url,
    store: g.sqlite,
    reconcile: () => g.running.gateway.reconcile(),
    admin: async (path) => (await g.admin(path)).body,
    metrics: async () => (await fetch(`${g.url}/_fencegate/metrics`)).text(),
    backdate: async (key, ms) =>
      void g.sqlite.db
        .prepare('UPDATE idempotency_records SET created_at = created_at - @ms, attempt_until = attempt_until - @ms WHERE key = @key')
        .run({ ms, key }),
    reload: (next) => g.running.reload(parseConfig({ ...g.config, routes: next } as any)),
    close: () => g.close(),
  };
};

const postgres: Start = async (routes, wrapStore) => {
  const g = await startPgTestGateway({ routes, prefix: 'fg_rc', ...(wrapStore ? { wrapStore } : {}) });
  return {
    url: g.url,
    store: g.store,
    reconcile: () => g.running.gateway.reconcile(),
    admin: async (path) => (await fetch(`${g.url}/_fencegate${path}`)).json(),
    metrics: async () => (await fetch(`${g.url}/_fencegate/metrics`)).text(),
    backdate: async (key, ms) =>
      void (await g.schema.pool.query(
        `UPDATE idempotency_records SET created_at = created_at - $1 * interval '1 millisecond',
          attempt_until = attempt_until - $1 * interval '1 millisecond' WHERE key = $2`,
        [ms, key],
      )),
    reload: (next) => g.running.reload(parseConfig({ ...g.config, routes: next } as any)),
    close: () => g.close(),
  };
};

const TIMEOUT_MS = 300;
const LOCK_MARGIN_MS = 100;
const SETTLE_MS = 2_000;
/** When a "not found" may release the record: the lock, then the settle time (DESIGN §3.12). */
const TRUSTED_AFTER_MS = TIMEOUT_MS + LOCK_MARGIN_MS + SETTLE_MS;

function chargesRoute(upstream: string, reconcile: Record<string, unknown> | null = {}, over: Record<string, unknown> = {}): RouteInput {
  return {
    name: 'charges',
    match: { path: '/charges', methods: ['POST'] },
    upstream,
    fence: 'off',
    mode: 'concurrent',
    timeoutMs: TIMEOUT_MS,
    lockMarginMs: LOCK_MARGIN_MS,
    maxWaitMs: 2_000,
    // An hour between background passes unless a test says otherwise: the inline tests count every query.
    ...(reconcile === null ? {} : { reconcile: { path: '/charges/by-key/{key}', settleTime: SETTLE_MS, interval: '1h', ...reconcile } }),
    ...over,
  };
}

const charge = (g: G, key: string) =>
  fetch(`${g.url}/charges`, {
    method: 'POST',
    headers: { 'idempotency-key': key, 'x-fence-entity': 'cust-1', 'content-type': 'application/json' },
    body: '{"amount":500}',
  });

async function answer(res: Response): Promise<{ status: number; body: any; reconciled: string | null; replayed: string | null; retryAfter: string | null }> {
  const text = await res.text();
  return {
    status: res.status,
    body: text === '' ? null : JSON.parse(text),
    reconciled: res.headers.get('fencegate-reconciled'),
    replayed: res.headers.get('idempotent-replayed'),
    retryAfter: res.headers.get('retry-after'),
  };
}

async function recordOf(g: G, key: string): Promise<RecordInfo | undefined> {
  return (await g.store.getRecords(key))[0];
}

async function actionsFor(g: G, key: string): Promise<{ action: string; operator: string | null }[]> {
  return ((await g.admin('/v1/operator-actions')).items as { key: string; action: string; operator: string | null }[])
    .filter((a) => a.key === key)
    .map(({ action, operator }) => ({ action, operator }));
}

const metric = (text: string, name: string, labels: string): number | undefined => {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{${labels}}`));
  return line === undefined ? undefined : Number(line.split(' ').pop());
};

const backends: [string, Start, boolean][] = [
  ['sqlite', sqlite, true],
  ['postgres', postgres, POSTGRES_URL !== undefined],
];

for (const [name, start, enabled] of backends) {
  describe.skipIf(!enabled)(`reconcile (DESIGN §3.12): ${name}`, () => {
    const open: { close(): Promise<unknown> }[] = [];
    afterEach(async () => {
      for (const o of open.splice(0).reverse()) await o.close();
    });
    const setup = async (routeOver: (upstream: string) => RouteInput, mode: Parameters<typeof startProvider>[0], wrap?: (s: GatewayStore) => GatewayStore) => {
      const provider = await startProvider(mode);
      open.push(provider);
      const g = await start([routeOver(provider.url)], wrap);
      open.push(g);
      return { provider, g };
    };
    /** A first attempt whose answer is lost: 504, the record outcome_unknown. */
    const lost = async (g: G, key: string) => {
      const first = await answer(await charge(g, key));
      expect(first.status).toBe(504);
      expect((await recordOf(g, key))?.state).toBe('outcome_unknown');
    };

    it('found: a timed-out charge the provider did perform comes back to the retry, marked reconciled, on every replay; one execution', async () => {
      const { provider, g } = await setup((u) => chargesRoute(u), { answerAfterMs: 1_000 });
      const key = `k-found-${name}`;
      await lost(g, key);
      const retry = await answer(await charge(g, key));
      expect(retry).toMatchObject({ status: 200, reconciled: 'true', replayed: 'true' });
      expect(retry.body).toMatchObject({ key, amount: 500 });
      const again = await answer(await charge(g, key));
      expect(again).toMatchObject({ status: 200, reconciled: 'true', body: retry.body });
      expect(provider.chargesFor(key)).toBe(1);
      expect(provider.posts).toBe(1);
      expect((await recordOf(g, key))?.state).toBe('completed');
      expect(await actionsFor(g, key)).toEqual([{ action: 'resolve-completed', operator: 'reconciler' }]);
      expect(metric(await g.metrics(), 'fencegate_reconcile_attempts_total', 'route="charges",result="found"')).toBe(1);
    });

    it('not found: refused while it cannot be trusted, then released once the lock and settle time have passed (database clock); forwarded once', async () => {
      const { provider, g } = await setup((u) => chargesRoute(u), { post: 'drop' });
      const key = `k-notfound-${name}`;
      await lost(g, key);
      const early = await answer(await charge(g, key));
      expect(early.status).toBe(409);
      expect(early.body.code ?? early.body.type).toMatch(/outcome-unknown/);
      // The hint: ask again once the not-found could be trusted (about TRUSTED_AFTER_MS after the
      // admission; the interval here is an hour, so it does not cut it shorter).
      expect(early.body.reconciling).toBe(true);
      expect(Number(early.retryAfter)).toBeGreaterThanOrEqual(1);
      expect(Number(early.retryAfter)).toBeLessThanOrEqual(Math.ceil(TRUSTED_AFTER_MS / 1000));
      expect(early.body.retry_after).toBe(Number(early.retryAfter));
      expect((await recordOf(g, key))?.state).toBe('outcome_unknown');
      expect(await actionsFor(g, key)).toEqual([]);
      // The listing shows the last answer that settled nothing, and the attempt it is weighed against.
      const listed = ((await g.admin('/v1/idempotency?state=outcome_unknown')).items as any[]).find((r) => r.key === key);
      expect(listed).toMatchObject({ reconcile: 'pending', last_reconcile: { result: 'not-yet-trusted' }, interim: false });
      expect(new Date(listed.last_reconcile.at).getTime()).toBeGreaterThanOrEqual(new Date(listed.created_at).getTime());
      expect(new Date(listed.attempt_until).getTime()).toBeGreaterThan(new Date(listed.created_at).getTime());
      expect(listed.request_id).toMatch(/^[0-9a-f-]{36}$/);
      provider.mode.post = 'perform';
      await g.backdate(key, TRUSTED_AFTER_MS);
      const retry = await answer(await charge(g, key));
      expect(retry.status).toBe(201);
      expect(retry.reconciled).toBeNull();
      expect(provider.posts).toBe(2);
      expect(provider.chargesFor(key)).toBe(1);
      expect(await actionsFor(g, key)).toEqual([{ action: 'resolve-released', operator: 'reconciler' }]);
      const m = await g.metrics();
      expect(metric(m, 'fencegate_reconcile_attempts_total', 'route="charges",result="not-yet-trusted"')).toBe(1);
      expect(metric(m, 'fencegate_reconcile_attempts_total', 'route="charges",result="not-found"')).toBe(1);
    });

    it('the hint is at most the reconcile interval: each retry asks the status endpoint again, so a lagging "found" is seen at that pace', async () => {
      const { g } = await setup((u) => chargesRoute(u, { interval: '1s' }), { post: 'drop' });
      const key = `k-hint-interval-${name}`;
      await lost(g, key);
      const early = await answer(await charge(g, key));
      expect(early).toMatchObject({ status: 409, retryAfter: '1', body: { reconciling: true, retry_after: 1, idempotency_key: key } });
    });

    it("the route's Stripe error shape carries the same hint, and still tells the SDK not to retry on its own", async () => {
      const { g } = await setup((u) => chargesRoute(u, { interval: '1s' }, { errors: 'stripe' }), { post: 'drop' });
      const key = `k-hint-stripe-${name}`;
      const first = await charge(g, key);
      expect(first.status).toBe(504);
      await first.text();
      const res = await charge(g, key);
      expect(res.headers.get('stripe-should-retry')).toBe('false');
      expect(await answer(res)).toMatchObject({
        status: 409,
        retryAfter: '1',
        body: { error: { code: 'outcome_unknown', reconciling: true, retry_after: 1 } },
      });
    });

    // Negative control: the same lost answer on a route without `reconcile` is refused exactly as before the hint.
    it('without reconcile the 409 outcome-unknown has no Retry-After and no reconciling member', async () => {
      const { provider, g } = await setup((u) => chargesRoute(u, null), { answerAfterMs: 1_000 });
      const key = `k-nohint-${name}`;
      await lost(g, key);
      const refused = await answer(await charge(g, key));
      expect(refused.status).toBe(409);
      expect(refused.retryAfter).toBeNull();
      expect(refused.body.type).toMatch(/\/outcome-unknown$/);
      expect(refused.body).not.toHaveProperty('reconciling');
      expect(refused.body).not.toHaveProperty('retry_after');
      expect(refused.body).toMatchObject({
        detail: 'an earlier attempt with this key may have reached the upstream; it needs an operator or an upstream check, not a blind retry',
        idempotency_key: key,
      });
      expect(provider.statusCalls).toBe(0);
    });

    it('concurrent retries (real parallelism) on one trusted not-found: one release, one forward, one charge', async () => {
      const { provider, g } = await setup((u) => chargesRoute(u), { post: 'drop' });
      const key = `k-race-${name}`;
      await lost(g, key);
      provider.mode.post = 'perform';
      await g.backdate(key, TRUSTED_AFTER_MS);
      const answers = await Promise.all(Array.from({ length: 8 }, async () => answer(await charge(g, key))));
      expect(answers.filter((a) => a.status === 201 && a.replayed === null)).toHaveLength(1);
      // The others: in progress behind the one forwarded (409), or its replay.
      for (const a of answers) expect(a.status === 409 || (a.status === 201 && (a.replayed === null || a.replayed === 'true'))).toBe(true);
      expect(provider.posts).toBe(2);
      expect(provider.chargesFor(key)).toBe(1);
      expect(await actionsFor(g, key)).toEqual([{ action: 'resolve-released', operator: 'reconciler' }]);
    });

    // DESIGN §3.12, the bound from the attempt itself: `reconcile` given to a route whose
    // onUnknown was "retry". The record's first admission is old, but a retry took it over and
    // sent it again just now; the provider never answered it (and its status endpoint cannot
    // see it yet). A "not found" now must not release it: the attempt just sent may still land.
    const takenOverThenReconciled = async (wrap?: (s: GatewayStore) => GatewayStore) => {
      const retryRoute = (u: string) => chargesRoute(u, null, { onUnknown: 'retry' });
      const { provider, g } = await setup(retryRoute, { post: 'drop' }, wrap);
      const key = `k-takeover-${name}-${wrap === undefined ? 'own' : 'created'}`;
      await lost(g, key);
      await g.backdate(key, 600_000); // the first attempt: ten minutes ago
      const retried = await answer(await charge(g, key)); // taken over, sent again, lost again
      expect(retried.status).toBe(504);
      expect(provider.posts).toBe(2);
      await g.reload([chargesRoute(provider.url, { settleTime: '30s' })]);
      const next = await answer(await charge(g, key));
      return { provider, g, key, next };
    };

    it('a record taken over after its admission is never released before its own attempt can no longer land (config change: reconcile given to a retry route)', async () => {
      const { provider, g, key, next } = await takenOverThenReconciled();
      expect(next).toMatchObject({ status: 409, body: { reconciling: true } });
      expect(provider.statusCalls).toBe(1);
      expect(provider.posts).toBe(2);
      expect((await recordOf(g, key))?.state).toBe('outcome_unknown');
      expect(await actionsFor(g, key)).toEqual([]);
      // The hint is measured from the takeover's lock end too: about 30 s, not "now".
      expect(Number(next.retryAfter)).toBeGreaterThanOrEqual(25);
    });

    it('negative control: the bound from created_at (the first admission) releases it and sends the charge a third time', async () => {
      const { provider, next } = await takenOverThenReconciled(broken.createdAtBound);
      expect(next.status).toBe(504);
      expect(provider.posts).toBe(3);
    });

    it("{request_id} in the path names the attempt's own request id (the X-Request-Id the upstream was sent)", async () => {
      const { provider, g } = await setup((u) => chargesRoute(u, { path: '/charges/by-request/{request_id}' }), { answerAfterMs: 1_000 });
      const key = `k-reqid-${name}`;
      await lost(g, key);
      const sent = provider.charges.find((c) => c.key === key)!.requestId;
      expect((await recordOf(g, key))?.requestId).toBe(sent);
      const retry = await answer(await charge(g, key));
      expect(retry).toMatchObject({ status: 200, reconciled: 'true', replayed: 'true' });
      expect(provider.statusPaths).toEqual([`/charges/by-request/${encodeURIComponent(sent)}`]);
      expect(provider.chargesFor(key)).toBe(1);
    });

    // The provider is still working on the charge when the gateway gives up on it, and its
    // status endpoint lags behind its writes: "not found" for a while, for a charge that happens.
    const lagging = { writeAfterMs: 800, answerAfterMs: 1_500, lagMs: 500 };

    it('a lagging status endpoint never causes a second execution: retries get 409 until the charge shows, then the charge', async () => {
      const { provider, g } = await setup((u) => chargesRoute(u), lagging);
      const key = `k-lag-${name}`;
      await lost(g, key);
      let last = await answer(await charge(g, key));
      expect(last.status).toBe(409);
      const end = Date.now() + 8_000;
      while (last.status === 409 && Date.now() < end) {
        await new Promise((r) => setTimeout(r, 100));
        last = await answer(await charge(g, key));
      }
      expect(last).toMatchObject({ status: 200, reconciled: 'true' });
      expect(provider.posts).toBe(1);
      expect(provider.chargesFor(key)).toBe(1);
    });

    it('negative control: with the not-found rule switched off, the same lagging endpoint causes a second charge', async () => {
      const { provider, g } = await setup((u) => chargesRoute(u), lagging, withoutReconcileWait);
      const key = `k-lag-off-${name}`;
      await lost(g, key);
      await charge(g, key); // 404 while the first charge is still on its way: released, forwarded again
      await until(() => provider.chargesFor(key) === 2, 'a second charge');
      expect(provider.posts).toBe(2);
    });

    for (const status of ['500', 'hang', 'large'] as const) {
      it(`a status endpoint that answers ${status === 'hang' ? 'nothing (timeout)' : status === 'large' ? 'a found answer too large' : '500'} settles nothing, even past the settle time`, async () => {
        const { provider, g } = await setup((u) => chargesRoute(u, { interval: '1h' }, { maxWaitMs: 300, maxResponseBytes: 1_024 }), { post: 'drop', status });
        const key = `k-${status}-${name}`;
        await lost(g, key);
        await g.backdate(key, TRUSTED_AFTER_MS * 2);
        for (let i = 0; i < 2; i++) {
          const r = await answer(await charge(g, key));
          expect(r.status).toBe(409);
        }
        await g.reconcile();
        expect(provider.statusCalls).toBe(3);
        expect((await recordOf(g, key))?.state).toBe('outcome_unknown');
        expect(await actionsFor(g, key)).toEqual([]);
        expect(provider.posts).toBe(1);
        expect(metric(await g.metrics(), 'fencegate_reconcile_attempts_total', 'route="charges",result="unknown"')).toBe(3);
      });
    }

    it('background: settles records with no retry at all (found, and not found once trusted), logged as the reconciler', async () => {
      const { provider, g } = await setup((u) => chargesRoute(u, { interval: '1h' }), { answerAfterMs: 1_000 });
      const found = `k-bg-found-${name}`;
      await lost(g, found);
      provider.mode.post = 'drop';
      const gone = `k-bg-gone-${name}`;
      await lost(g, gone);
      const first = await g.reconcile();
      expect(first).toMatchObject({ seen: 2, asked: { found: 1, 'not-yet-trusted': 1 }, gaveUp: 0 });
      expect((await recordOf(g, found))?.state).toBe('completed');
      expect((await recordOf(g, gone))?.state).toBe('outcome_unknown');
      // Back-off: not asked again before the interval (an hour here).
      expect((await g.reconcile()).asked).toEqual({});
      expect(provider.statusCalls).toBe(2);
      // Once trusted (backdated: the back-off, kept per attempt by its created_at, sees a new one).
      await g.backdate(gone, TRUSTED_AFTER_MS);
      expect(await g.reconcile()).toMatchObject({ seen: 1, asked: { 'not-found': 1 } });
      expect(await recordOf(g, gone)).toBeUndefined();
      expect(await actionsFor(g, gone)).toEqual([{ action: 'resolve-released', operator: 'reconciler' }]);
      expect(await actionsFor(g, found)).toEqual([{ action: 'resolve-completed', operator: 'reconciler' }]);
      const replay = await answer(await charge(g, found));
      expect(replay).toMatchObject({ status: 200, reconciled: 'true' });
      expect(provider.chargesFor(found)).toBe(1);
    });

    it('background: on its own timer, releases a record the provider never saw once trusted', async () => {
      const { provider, g } = await setup((u) => chargesRoute(u, { interval: '100ms' }), { post: 'drop' });
      const key = `k-bg-timer-${name}`;
      await lost(g, key);
      await g.backdate(key, TRUSTED_AFTER_MS);
      await until(async () => (await recordOf(g, key)) === undefined, 'the reconciler to release the record');
      expect(await actionsFor(g, key)).toEqual([{ action: 'resolve-released', operator: 'reconciler' }]);
      expect(provider.posts).toBe(1);
    });

    it('background: past maxAge a record is left to the operator, visible as gave-up in the listing and the metrics', async () => {
      const { provider, g } = await setup((u) => chargesRoute(u, { interval: '1h', maxAge: '24h' }), { post: 'drop' });
      const key = `k-bg-old-${name}`;
      await lost(g, key);
      const young = (await g.admin('/v1/idempotency')).items.find((r: { key: string }) => r.key === key);
      expect(young.reconcile).toBe('pending');
      await g.backdate(key, 25 * 3_600_000);
      const pass = await g.reconcile();
      expect(pass).toMatchObject({ seen: 1, asked: {}, gaveUp: 1 });
      expect(provider.statusCalls).toBe(0);
      expect((await recordOf(g, key))?.state).toBe('outcome_unknown');
      const listed = (await g.admin('/v1/idempotency')).items.find((r: { key: string }) => r.key === key);
      expect(listed.reconcile).toBe('gave-up');
      const m = await g.metrics();
      expect(metric(m, 'fencegate_reconcile_gave_up_records', 'route="charges"')).toBe(1);
      expect(metric(m, 'fencegate_reconcile_unknown_records', 'route="charges",age="over_1d"')).toBe(1);
    });

    it('without reconcile nothing changes: 409 outcome-unknown, no status query, no reconcile metrics or listing field', async () => {
      const { provider, g } = await setup((u) => chargesRoute(u, null), { answerAfterMs: 1_000 });
      const key = `k-none-${name}`;
      await lost(g, key);
      await g.backdate(key, TRUSTED_AFTER_MS * 2);
      const retry = await answer(await charge(g, key));
      expect(retry.status).toBe(409);
      expect(retry.reconciled).toBeNull();
      expect(await g.reconcile()).toEqual({ seen: 0, asked: {}, gaveUp: 0 });
      expect(provider.statusCalls).toBe(0);
      expect((await recordOf(g, key))?.state).toBe('outcome_unknown');
      expect(await g.metrics()).not.toMatch(/fencegate_reconcile/);
      const listed = (await g.admin('/v1/idempotency')).items.find((r: { key: string }) => r.key === key);
      expect(listed).toBeDefined();
      expect('reconcile' in listed).toBe(false);
    });
  });
}
