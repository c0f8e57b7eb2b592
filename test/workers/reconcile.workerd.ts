/**
 * The background reconcile pass on Workers (DESIGN §3.12, §8.3), end to end
 * inside workerd: the Worker's own `fetch` and `scheduled` handlers, the
 * local D1, and a real (Node) payment provider with a status endpoint that
 * the Worker reaches with its real `fetch` (reconcile-upstream.setup.ts).
 *
 * On Workers every upstream outage is a 504 outcome_unknown (a refused
 * connection and a lost answer throw the same error). After the upstream
 * is back, one cron run settles those records through the status query:
 * a performed charge is found and replayed, a never-performed one is
 * released only past the not-found bound and then forwarded, and nothing is
 * charged twice. Without `reconcile` on the route the cron run changes
 * nothing (the negative control). Every test has its own route, keys and
 * environment (so its own isolate state).
 */
import { createExecutionContext, createScheduledController, waitOnExecutionContext } from 'cloudflare:test';
import { env } from 'cloudflare:workers';
import { afterEach, beforeEach, describe, expect, inject, it, vi } from 'vitest';
import worker, { type WorkerEnv } from '../../src/entry/worker.js';
import { createD1Store } from '../../src/store/d1/index.js';
import type { RecordInfo } from '../../src/store/types.js';

const provider = inject('reconcileUpstream');
const store = createD1Store({ db: env.DB });

let n = 0;
const uniq = (what: string) => `${what}-${Date.now().toString(36)}-${++n}`;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** timeoutMs + lockMarginMs + settleTime of the routes below: a "not found" is trusted this long after the admission. */
const TIMEOUT_MS = 1_000;
const LOCK_MARGIN_MS = 200;

function routeEnv(route: string, opts: { reconcile?: boolean; settleTime?: number; vars?: Record<string, string> } = {}): WorkerEnv {
  return {
    ...env,
    FENCEGATE_CONFIG: JSON.stringify({
      store: { d1: 'DB' },
      routes: [
        {
          name: route,
          match: { path: `/${route}/*`, methods: ['POST'] },
          upstream: provider.url,
          timeoutMs: TIMEOUT_MS,
          lockMarginMs: LOCK_MARGIN_MS,
          ...(opts.reconcile === false
            ? {}
            : { reconcile: { path: `/${route}/charges/by-key/{key}`, interval: '100ms', settleTime: opts.settleTime ?? 300, concurrency: 2 } }),
        },
      ],
    }),
    FENCEGATE_LOG_LEVEL: 'info',
    FENCEGATE_ADMIN: 'on',
    ...opts.vars,
  };
}

async function call(e: WorkerEnv, path: string, init: RequestInit = {}): Promise<Response> {
  const ctx = createExecutionContext();
  const res = await worker.fetch(new Request(`http://localhost${path}`, init), e, ctx);
  const body = await res.arrayBuffer();
  await waitOnExecutionContext(ctx);
  return new Response(res.status === 204 ? null : body, { status: res.status, headers: res.headers });
}

const charge = (e: WorkerEnv, route: string, key: string) =>
  call(e, `/${route}/charges`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-execution-fence': '1', 'x-fence-entity': key, 'idempotency-key': key },
    body: '{"amount":500}',
  });

/** The JSON log lines of the test so far (the Worker logs with console.log; kept out of the test output). */
let logged: Record<string, unknown>[] = [];
beforeEach(() => {
  logged = [];
  vi.spyOn(console, 'log').mockImplementation((line: unknown) => {
    if (typeof line === 'string' && line.startsWith('{')) logged.push(JSON.parse(line) as Record<string, unknown>);
  });
});

/** One cron event, as the platform sends it; returns the log lines it wrote. */
async function cron(e: WorkerEnv): Promise<Record<string, unknown>[]> {
  const from = logged.length;
  const ctx = createExecutionContext();
  await worker.scheduled(createScheduledController({ cron: '* * * * *' }), e, ctx);
  await waitOnExecutionContext(ctx);
  return logged.slice(from);
}

async function control(what: 'down' | 'up' | 'lose'): Promise<void> {
  const res = await fetch(`${provider.control}/${what}`, { method: 'POST' });
  expect(res.status).toBe(200);
  await res.arrayBuffer();
}

async function providerState(key: string): Promise<{ charges: number; statusCalls: number }> {
  return (await (await fetch(`${provider.control}/state?key=${encodeURIComponent(key)}`)).json()) as { charges: number; statusCalls: number };
}

/** The route's outcome_unknown records: the ones an operator would have to settle. */
async function unknownRecords(route: string): Promise<RecordInfo[]> {
  const out: RecordInfo[] = [];
  let cursor: string | undefined;
  do {
    const page = await store.listRecords({ state: 'outcome_unknown', limit: 200, ...(cursor !== undefined ? { cursor } : {}) });
    out.push(...page.items.filter((r) => r.scope.split('\u0000')[0] === route));
    cursor = page.nextCursor ?? undefined;
  } while (cursor !== undefined);
  return out;
}

const stateOf = async (key: string) => (await store.getRecords(key))[0]?.state ?? 'none';

/**
 * The outage: `performed` keys reach the provider, which charges and then
 * drops the connection; then it stops listening and `lost` keys are refused.
 * Every one of them is a 504 outcome_unknown on Workers.
 */
async function outage(e: WorkerEnv, route: string, performed: string[], refused: string[]): Promise<void> {
  try {
    await control('lose');
    for (const key of performed) expect((await charge(e, route, key)).status).toBe(504);
    await control('down');
    for (const key of refused) expect((await charge(e, route, key)).status).toBe(504);
  } finally {
    await control('up');
  }
  for (const key of [...performed, ...refused]) expect(await stateOf(key)).toBe('outcome_unknown');
  for (const key of performed) expect((await providerState(key)).charges).toBe(1);
  for (const key of refused) expect((await providerState(key)).charges).toBe(0);
}

/** Sleeps until every given record is past the not-found bound (by this clock, with a margin over the database's). */
async function pastBound(keys: string[], settleTime: number): Promise<void> {
  const created = await Promise.all(keys.map(async (k) => (await store.getRecords(k))[0]!.createdAt.getTime()));
  const wait = Math.max(...created) + TIMEOUT_MS + LOCK_MARGIN_MS + settleTime + 300 - Date.now();
  if (wait > 0) await sleep(wait);
}

afterEach(async () => {
  vi.restoreAllMocks();
  await control('up');
});

describe('the background reconcile pass on the cron trigger', () => {
  it('after an outage, one cron run settles every 504 outcome_unknown record: none left for an operator, none executed twice', async () => {
    const route = uniq('rc');
    const e = routeEnv(route);
    const performed = [uniq('paid'), uniq('paid')];
    const refused = [uniq('never'), uniq('never')];
    await outage(e, route, performed, refused);
    expect(await unknownRecords(route)).toHaveLength(4);

    // The provider is back and its status endpoint answers; the not-found bound has passed.
    await pastBound([...performed, ...refused], 300);
    const log = await cron(e);

    expect(await unknownRecords(route)).toEqual([]);
    for (const key of performed) expect(await stateOf(key)).toBe('completed');
    for (const key of refused) expect(await stateOf(key)).toBe('none');
    const pass = log.find((l) => l.msg === 'reconcile-pass');
    expect(pass).toMatchObject({ seen: 4, gave_up: 0, found: 2, 'not-found': 2 });
    expect(pass).not.toHaveProperty('deferred');

    // The retries: a performed charge is replayed from the status query's answer, never run again;
    // a never-performed one is forwarded now, once.
    for (const key of performed) {
      const res = await charge(e, route, key);
      expect(res.status).toBe(200);
      expect(res.headers.get('fencegate-reconciled')).toBe('true');
      expect(res.headers.get('idempotent-replayed')).toBe('true');
      expect(await res.json()).toMatchObject({ key, status: 'succeeded' });
    }
    for (const key of refused) {
      const res = await charge(e, route, key);
      expect(res.status).toBe(201);
      expect(res.headers.get('fencegate-reconciled')).toBeNull();
    }
    for (const key of [...performed, ...refused]) expect((await providerState(key)).charges).toBe(1);

    // The pass's counts and gauges are on the isolate's /metrics.
    const metrics = await (await call(e, '/_fencegate/metrics')).text();
    expect(metrics).toContain(`fencegate_reconcile_attempts_total{route="${route}",result="found"} 2`);
    expect(metrics).toContain(`fencegate_reconcile_attempts_total{route="${route}",result="not-found"} 2`);
    expect(metrics).toMatch(new RegExp(`fencegate_reconcile_unknown_records\\{route="${route}",age="under_1m"\\} 4`));
  });

  it('a never-performed charge is released only past the not-found bound, then forwarded on retry', async () => {
    const route = uniq('rc');
    const settleTime = 2_000;
    const e = routeEnv(route, { settleTime });
    const key = uniq('never');
    await outage(e, route, [], [key]);

    // Right after the outage the status endpoint says "not found", but the attempt
    // may still be landing: too early to trust, nothing changes.
    const early = await cron(e);
    expect(early.find((l) => l.msg === 'reconcile-pass')).toMatchObject({ 'not-yet-trusted': 1 });
    expect((await providerState(key)).statusCalls).toBe(1);
    expect(await stateOf(key)).toBe('outcome_unknown');
    expect((await charge(e, route, key)).status).toBe(409);
    expect((await providerState(key)).charges).toBe(0);

    await pastBound([key], settleTime);
    const late = await cron(e);
    expect(late.find((l) => l.msg === 'reconcile-pass')).toMatchObject({ 'not-found': 1 });
    expect(await unknownRecords(route)).toEqual([]);
    expect((await charge(e, route, key)).status).toBe(201);
    expect((await providerState(key)).charges).toBe(1);
  });

  it('negative control: without reconcile on the route, the cron run changes nothing and the records stay outcome_unknown', async () => {
    const route = uniq('plain');
    const e = routeEnv(route, { reconcile: false });
    const performed = [uniq('paid')];
    const refused = [uniq('never')];
    await outage(e, route, performed, refused);
    await pastBound([...performed, ...refused], 300);

    const log = await cron(e);
    expect(log.find((l) => l.msg === 'reconcile-pass')).toBeUndefined();
    expect(log.find((l) => l.msg === 'sweep')).toBeDefined();
    expect(await unknownRecords(route)).toHaveLength(2);
    for (const key of [...performed, ...refused]) {
      expect(await stateOf(key)).toBe('outcome_unknown');
      expect((await providerState(key)).statusCalls).toBe(0);
      const retry = await charge(e, route, key);
      expect(retry.status).toBe(409);
      expect(((await retry.json()) as { type: string }).type).toMatch(/outcome-unknown$/);
    }
    expect((await providerState(performed[0]!)).charges).toBe(1);
    expect((await providerState(refused[0]!)).charges).toBe(0);
  });

  it('a pass starts at most FENCEGATE_RECONCILE_MAX_QUERIES status queries; the next cron run asks the rest', async () => {
    const route = uniq('rc');
    const e = routeEnv(route, { vars: { FENCEGATE_RECONCILE_MAX_QUERIES: '1' } });
    const performed = [uniq('paid'), uniq('paid'), uniq('paid')];
    await outage(e, route, performed, []);

    const first = await cron(e);
    expect(first.find((l) => l.msg === 'reconcile-pass')).toMatchObject({ seen: 3, found: 1, deferred: 2 });
    expect(await unknownRecords(route)).toHaveLength(2);
    await cron(e);
    const third = await cron(e);
    expect(third.find((l) => l.msg === 'reconcile-pass')).toMatchObject({ seen: 1, found: 1 });
    expect(await unknownRecords(route)).toEqual([]);
    // Each record was asked about once: the budget skipped records, it did not ask twice.
    for (const key of performed) expect(await providerState(key)).toEqual({ charges: 1, statusCalls: 1 });
  });

  it('a bad FENCEGATE_RECONCILE_MAX_QUERIES is a configuration error: 500, nothing forwarded', async () => {
    const route = uniq('rc');
    const e = routeEnv(route, { vars: { FENCEGATE_RECONCILE_MAX_QUERIES: '0' } });
    const key = uniq('paid');
    const res = await charge(e, route, key);
    expect(res.status).toBe(500);
    expect((await providerState(key)).charges).toBe(0);
  });
});
