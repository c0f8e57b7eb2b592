/**
 * The gateway's /metrics on Node (prom-client, as `fencegate serve` runs
 * it): outcomes split with route and status, known series at zero, total,
 * upstream and store latency, rejections by reason, late finishes, build
 * info and the process metrics, against a real SQLite store and loopback
 * upstreams. And the text backend (the one Workers use) with the same names.
 */
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createMetrics } from '../../src/http/metrics.js';
import { createPromBackend } from '../../src/http/metrics-node.js';
import { FENCEGATE_VERSION } from '../../src/http/metrics-spec.js';
import { command, expireLocks, paymentsRoute, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { freePort, startUpstream, type FakeUpstream } from '../helpers/upstream.js';

/** The value of one series, or undefined when the scrape does not have it. */
function value(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  for (const line of text.split('\n')) {
    const m = /^([a-z_:][a-z0-9_:]*)(?:\{(.*)\})? (\S+)$/i.exec(line);
    if (!m || m[1] !== name) continue;
    const got = Object.fromEntries([...(m[2] ?? '').matchAll(/([a-z_]+)="((?:[^"\\]|\\.)*)"/gi)].map((x) => [x[1], x[2]]));
    const want = Object.entries(labels);
    if (want.length === Object.keys(got).length && want.every(([k, v]) => got[k] === v)) return Number(m[3]);
  }
  return undefined;
}

const names = (text: string) =>
  new Set(
    text
      .split('\n')
      .filter((l) => l.startsWith('# TYPE fencegate_'))
      .map((l) => l.split(' ')[2]),
  );

describe('/metrics on Node (prom-client)', () => {
  let upstream: FakeUpstream;
  let gw: TestGateway;
  const scrape = async () => (await fetch(`${gw.url}/_fencegate/metrics`)).text();

  beforeAll(async () => {
    upstream = await startUpstream();
    const down = `http://127.0.0.1:${await freePort()}`;
    gw = await startTestGateway({
      routes: [paymentsRoute(upstream.url), paymentsRoute(down, { name: 'down', match: { path: '/down/*', methods: ['POST'] } })],
    });
  });
  afterAll(async () => {
    await gw?.close();
    await upstream?.close();
  });

  test('before any request: every route × outcome at zero, build info, process metrics', async () => {
    const text = await scrape();
    for (const route of ['payments', 'down']) {
      for (const [outcome, status] of [
        ['stale', '409'],
        ['mismatch', '422'],
        ['in_progress', '409'],
        ['busy', '409'],
        ['unavailable_502', '502'],
        ['unknown_504', '504'],
        ['outcome_unknown', '409'],
      ]) {
        expect(value(text, 'fencegate_decisions_total', { route, outcome: outcome!, status: status! }), `${route} ${outcome}`).toBe(0);
      }
      for (const outcome of ['accepted', 'replayed', 'stale', 'upstream_error'])
        expect(value(text, 'fencegate_requests_total', { route, outcome }), `${route} ${outcome}`).toBe(0);
      for (const reason of ['stale-fence', 'idempotency-key-reused', 'entity-busy', 'unauthorized'])
        expect(value(text, 'fencegate_rejections_total', { route, reason })).toBe(0);
    }
    expect(value(text, 'fencegate_build_info', { version: FENCEGATE_VERSION, node: process.versions.node })).toBe(1);
    expect(value(text, 'process_cpu_user_seconds_total')).toBeGreaterThan(0);
    expect(value(text, 'fencegate_late_finishes_total')).toBe(0);
    expect(value(text, 'fencegate_store_errors_total', { op: 'admit' })).toBe(0);
    // Shown from the first sweep only.
    expect(text).not.toMatch(/fencegate_sweep_backlog_rows/);
  });

  test('outcomes split by route and status; latency of the request, the upstream and the store calls', async () => {
    const send = (fence: number, key: string, extra: { entity?: string; body?: string; path?: string } = {}) =>
      command(gw.url, extra.path ?? '/payments/x', { fence, entity: extra.entity ?? 'e', key, ...(extra.body ? { body: extra.body } : {}) });
    expect((await send(2, 'a')).status).toBe(201);
    expect((await send(2, 'a')).status).toBe(201); // replayed
    expect((await send(1, 'b')).status).toBe(409); // stale
    expect((await send(2, 'a', { body: '{"other":1}' })).status).toBe(422); // mismatch
    upstream.behave(() => ({ kind: 'reset' }));
    expect((await send(2, 'c')).status).toBe(504);
    upstream.behave(null);
    expect((await send(1, 'd', { path: '/down/x', entity: 'f' })).status).toBe(502);

    const text = await scrape();
    const d = (route: string, outcome: string, status: string) => value(text, 'fencegate_decisions_total', { route, outcome, status });
    expect(d('payments', 'forwarded', '201')).toBe(1);
    expect(d('payments', 'replayed', '201')).toBe(1);
    expect(d('payments', 'stale', '409')).toBe(1);
    expect(d('payments', 'mismatch', '422')).toBe(1);
    expect(d('payments', 'unknown_504', '504')).toBe(1);
    expect(d('down', 'unavailable_502', '502')).toBe(1);
    expect(d('down', 'unknown_504', '504')).toBe(0);
    // The coarse series as before.
    expect(value(text, 'fencegate_requests_total', { route: 'payments', outcome: 'accepted' })).toBe(1);
    expect(value(text, 'fencegate_requests_total', { route: 'payments', outcome: 'upstream_error' })).toBe(1);
    expect(value(text, 'fencegate_rejections_total', { route: 'payments', reason: 'stale-fence' })).toBe(1);
    expect(value(text, 'fencegate_rejections_total', { route: 'payments', reason: 'idempotency-key-reused' })).toBe(1);
    expect(value(text, 'fencegate_request_duration_seconds_count', { route: 'payments' })).toBe(5);
    expect(value(text, 'fencegate_upstream_duration_seconds_count', { route: 'payments' })).toBe(2);
    // Admissions: every request that got that far (a, a, b, a', c on payments; d on down): 6. Finishes: a, c, d.
    expect(value(text, 'fencegate_store_duration_seconds_count', { op: 'admit' })).toBe(6);
    expect(value(text, 'fencegate_store_duration_seconds_count', { op: 'finish' })).toBe(3);
    expect(value(text, 'fencegate_store_duration_seconds_sum', { op: 'admit' })).toBeGreaterThan(0);
  });

  test('a finish that lands after the record passed on is counted as a late finish', async () => {
    const gate = upstream.gate();
    upstream.behave(() => ({ kind: 'hold', gate: gate.promise }));
    const pending = command(gw.url, '/payments/x', { fence: 3, entity: 'late', key: 'late-1' });
    await upstream.waitFor(() => upstream.calls.some((c) => c.key === 'late-1'), 'late-1 at the upstream');
    // Its lock runs out, the sweeper marks the record outcome_unknown and an
    // operator resolves it: the record is no longer this request's to finish.
    expireLocks(gw.sqlite, 'late-1', 'late');
    await gw.running.gateway.sweep();
    const resolved = await fetch(`${gw.url}/_fencegate/v1/idempotency/late-1/resolve`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"outcome":"released"}',
    });
    expect(resolved.status).toBe(200);
    gate.open();
    upstream.behave(null);
    expect((await pending).status).toBe(201);
    const text = await scrape();
    expect(value(text, 'fencegate_late_finishes_total')).toBe(1);
    expect(value(text, 'fencegate_swept_rows_total', { kind: 'dead_records' })).toBe(1);
    expect(value(text, 'fencegate_sweeps_total', { result: 'ok' })).toBe(1);
  });
});

describe('the text backend (Workers) and prom-client (Node): one set of names', () => {
  test('the same fencegate_* metrics, labels and values after the same observations', async () => {
    const feed = (m: ReturnType<typeof createMetrics>) => {
      m.observe({ route: 'payments', decision: 'forwarded', status: 201, totalMs: 12, upstreamMs: 10 });
      m.observe({ route: 'payments', decision: 'stale-fence', status: 409, totalMs: 1, upstreamMs: undefined });
      m.observe({ route: 'mcp', decision: 'forwarded', status: 200, totalMs: 3, upstreamMs: 2, tool: 'charge' });
      m.storeCall('admit', 1.5, 'ok');
      m.storeCall('finish', 2, 'discarded');
      m.swept(
        {
          expiredRecords: 1,
          unknownRecords: 0,
          oldRejections: 0,
          oldEntities: 0,
          oldFenceHistory: 0,
          oldOperatorActions: 0,
          oldCommands: 0,
          backlog: { expiredRecords: 0, unknownRecords: 0, oldRejections: 0, oldEntities: 0, oldFenceHistory: 0, oldOperatorActions: 0, oldCommands: 0 },
          batches: 1,
        },
        20,
      );
      return m.render({ inflight: 2, stats: { rejections: 1, outcomeUnknown: 0 }, pool: { total: 4, idle: 3, waiting: 1 } });
    };
    const routes = ['payments', 'mcp'];
    const text = await feed(createMetrics({ routes, nodeVersion: '20' }));
    const prom = await feed(createMetrics({ routes, nodeVersion: '20', backend: createPromBackend({ processMetrics: false }) }));
    expect([...names(prom)].sort()).toEqual([...names(text)].sort());
    expect(names(text).size).toBeGreaterThanOrEqual(20);
    // Series for series, whatever the label order.
    const series = (t: string) =>
      t
        .split('\n')
        .filter((l) => l.startsWith('fencegate_'))
        .map((l) =>
          l.replace(
            /\{(.*)\}/,
            (_, inner: string) =>
              `{${inner
                .split(/,(?=[a-z_]+=")/)
                .sort()
                .join(',')}}`,
          ),
        )
        .sort();
    expect(series(prom)).toEqual(series(text));
    expect(value(text, 'fencegate_store_pool_clients', { state: 'waiting' })).toBe(1);
    expect(value(text, 'fencegate_mcp_tool_calls_total', { route: 'mcp', tool: 'charge', outcome: 'accepted' })).toBe(1);
  });

  test('control: without routes the per-route series do not start at zero (what the zero-start check above relies on)', async () => {
    const text = await createMetrics().render({ inflight: 0 });
    expect(value(text, 'fencegate_decisions_total', { route: 'payments', outcome: 'stale', status: '409' })).toBeUndefined();
    expect(
      value(await createMetrics({ routes: ['payments'] }).render({ inflight: 0 }), 'fencegate_decisions_total', {
        route: 'payments',
        outcome: 'stale',
        status: '409',
      }),
    ).toBe(0);
  });

  test('FENCEGATE_VERSION is the package version', () => {
    expect(FENCEGATE_VERSION).toBe(JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')).version);
  });
});
