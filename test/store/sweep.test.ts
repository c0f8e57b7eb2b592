/**
 * The sweeper keeps up: one sweep works through every batch of every kind of
 * row past its retention, giving the event loop a turn between batches, and
 * reports what it left (`backlog`), which `/metrics` shows. Rows are put in
 * the past in SQL (CONTRIBUTING.md convention 2), several default batches (1,000) of each.
 * The conformance suite (./conformance.ts) holds every store to the same
 * contract with small batches; this file is the SQLite store at full size,
 * and the gateway's metrics.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { createMetrics } from '../../src/http/metrics.js';
import { SqliteGatewayStore } from '../../src/store/sqlite/index.js';
import { SWEEP_BATCH } from '../../src/store/sweep.js';
import type { GatewayStore, SweepOptions } from '../../src/store/types.js';
import { paymentsRoute, startTestGateway, tempDir, type TestGateway } from '../helpers/gateway.js';

const HOUR = 3_600_000;
const N = 3 * SWEEP_BATCH + 500;
const RETENTIONS = { rejectionRetentionMs: HOUR, entityRetentionMs: HOUR, operatorActionRetentionMs: HOUR, commandRetentionMs: HOUR };
const ALL_KINDS = ['expiredRecords', 'unknownRecords', 'oldRejections', 'oldEntities', 'oldFenceHistory', 'oldOperatorActions', 'oldCommands'] as const;

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** `n` rows past a 1 h retention of every kind the sweeper handles, inserted in one transaction. */
function pastRetention(store: SqliteGatewayStore, n: number, tag: string): void {
  const db = store.db;
  const old = Date.now() - 2 * HOUR;
  const seq = `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ${n})`;
  db.transaction(() => {
    db.prepare(`${seq} INSERT INTO idempotency_records (scope, key, fingerprint, state, owner_token, created_at, expires_at, status, headers, body)
      SELECT 'bulk', '${tag}-done-' || i, 'fp', 'completed', 'o', @old, @old, 201, '[]', x'00' FROM n`).run({ old });
    db.prepare(`${seq} INSERT INTO idempotency_records (scope, key, fingerprint, state, owner_token, locked_until, created_at, expires_at)
      SELECT 'bulk', '${tag}-dead-' || i, 'fp', 'in_progress', 'o', @old, @old, @old + 86400000 FROM n`).run({ old });
    db.prepare(`${seq} INSERT INTO rejections (at, reason, entity) SELECT @old, 'stale-fence', '${tag}-' || i FROM n`).run({ old });
    db.prepare(`${seq} INSERT INTO fence_entities (entity, fence, accepted_at) SELECT '${tag}-' || i, 1, @old FROM n`).run({ old });
    db.prepare(`${seq} INSERT INTO fence_history (entity, fence, at) SELECT '${tag}-' || i, 1, @old FROM n`).run({ old });
    db.prepare(`${seq} INSERT INTO operator_actions (at, action, scope, key) SELECT @old, 'resolve-released', 'bulk', '${tag}-' || i FROM n`).run({ old });
    db.prepare(`${seq} INSERT INTO commands (at, outcome, entity) SELECT @old, 'completed', '${tag}-' || i FROM n`).run({ old });
  })();
}

function counts(store: SqliteGatewayStore, tag: string) {
  const n = (sql: string) => Number((store.db.prepare(sql).get(`${tag}-%`) as { n: number }).n);
  return {
    expiredRecords: n("SELECT count(*) AS n FROM idempotency_records WHERE key LIKE ? AND state = 'completed'"),
    unknownRecords: n("SELECT count(*) AS n FROM idempotency_records WHERE key LIKE ? AND state = 'in_progress'"),
    oldRejections: n('SELECT count(*) AS n FROM rejections WHERE entity LIKE ?'),
    oldEntities: n('SELECT count(*) AS n FROM fence_entities WHERE entity LIKE ?'),
    oldFenceHistory: n('SELECT count(*) AS n FROM fence_history WHERE entity LIKE ?'),
    oldOperatorActions: n('SELECT count(*) AS n FROM operator_actions WHERE key LIKE ?'),
    oldCommands: n('SELECT count(*) AS n FROM commands WHERE entity LIKE ?'),
  };
}

/** Turns of the event loop while `p` runs: a setImmediate chain counts one per turn. */
async function turnsDuring<T>(p: () => Promise<T>): Promise<{ value: T; turns: number }> {
  let turns = 0;
  let running = true;
  const tick = () => {
    if (!running) return;
    turns++;
    setImmediate(tick);
  };
  setImmediate(tick);
  const value = await p();
  running = false;
  return { value, turns };
}

const zeros = Object.fromEntries(ALL_KINDS.map((k) => [k, 0]));

describe.each([
  ['group commit', true],
  ['one transaction per batch', false],
] as const)('SQLite sweep at full size (%s)', (_name, groupCommit) => {
  const open = () => {
    const tmp = tempDir('fencegate-sweep-');
    const store = new SqliteGatewayStore({ path: `${tmp.dir}/gateway.db`, groupCommit });
    cleanups.push(tmp.cleanup, () => store.close());
    return store;
  };

  it(`one sweep clears ${N} rows of every kind in batches of ${SWEEP_BATCH}, with event-loop turns between them`, async () => {
    const store = open();
    pastRetention(store, N, 'a');
    const { value: r, turns } = await turnsDuring(() => store.sweep(RETENTIONS));
    for (const k of ALL_KINDS) expect(r[k], k).toBe(N);
    expect(r.backlog).toEqual(zeros);
    // Four batches per kind (three full, one short): 28 transactions, each its own turn.
    expect(r.batches).toBe(4 * ALL_KINDS.length);
    expect(turns).toBeGreaterThanOrEqual(r.batches - 1);
    expect(counts(store, 'a')).toEqual(zeros);
  });

  it('negative control: the old single batch per sweep (maxBatches: 1) leaves rows, and the backlog says how many', async () => {
    const store = open();
    pastRetention(store, N, 'b');
    const r = await store.sweep({ ...RETENTIONS, maxBatches: 1 });
    const left = Object.fromEntries(ALL_KINDS.map((k) => [k, N - SWEEP_BATCH]));
    for (const k of ALL_KINDS) expect(r[k], k).toBe(SWEEP_BATCH);
    expect(r.backlog).toEqual(left);
    expect(counts(store, 'b')).toEqual(left);
  });

  it('a spent time budget leaves a backlog (> 0) that the next sweep clears', async () => {
    const store = open();
    pastRetention(store, N, 'c');
    const cut = await store.sweep({ ...RETENTIONS, timeBudgetMs: 0 });
    expect(cut.batches).toBe(ALL_KINDS.length);
    for (const k of ALL_KINDS) expect(cut.backlog[k], k).toBe(N - SWEEP_BATCH);
    const rest = await store.sweep(RETENTIONS);
    expect(rest.backlog).toEqual(zeros);
    expect(counts(store, 'c')).toEqual(zeros);
  });

  it('a store closed during a sweep stops it between batches', async () => {
    const store = open();
    pastRetention(store, N, 'd');
    const sweeping = store.sweep(RETENTIONS);
    await store.close();
    const r = await sweeping;
    expect(r.batches).toBeLessThan(4 * ALL_KINDS.length);
  });
});

describe("/metrics: the sweeper's rows and backlog", () => {
  let gw: TestGateway;
  afterEach(async () => gw?.close());

  const metric = (text: string, name: string, kind: string): number => {
    const line = text.split('\n').find((l) => l.startsWith(`${name}{kind="${kind}"} `));
    if (line === undefined) throw new Error(`no ${name}{kind="${kind}"} in /metrics`);
    return Number(line.split(' ')[1]);
  };

  it('counts the rows swept, shows 0 backlog after a sweep that caught up, and the rows left after one whose budget ran out', async () => {
    // The real store, whose sweep the test can hand a spent time budget.
    const budget: { ms: number | undefined } = { ms: undefined };
    const wrap = (store: GatewayStore): GatewayStore =>
      new Proxy(store, {
        get(target, prop) {
          if (prop === 'sweep') return (o: SweepOptions) => target.sweep(budget.ms === undefined ? o : { ...o, timeBudgetMs: budget.ms });
          const v = Reflect.get(target, prop, target);
          return typeof v === 'function' ? v.bind(target) : v;
        },
      });
    gw = await startTestGateway({
      routes: [paymentsRoute('http://127.0.0.1:9')],
      config: { rejectionRetention: '1h', entityRetention: '1h', operatorActionRetention: '1h' },
      wrapStore: wrap,
    });
    const scrape = async () => (await fetch(`${gw.url}${gw.config.adminPrefix}/metrics`)).text();
    // No sweep yet: counters at 0, no backlog gauge.
    const before = await scrape();
    expect(metric(before, 'fencegate_swept_rows_total', 'expired_records')).toBe(0);
    expect(before).not.toMatch(/fencegate_sweep_backlog_rows/);

    pastRetention(gw.sqlite, N, 'm');
    const r = await gw.running.gateway.sweep();
    expect(r.expiredRecords).toBe(N);
    const after = await scrape();
    for (const kind of ['expired_records', 'dead_records', 'rejections', 'fence_entities', 'fence_history', 'operator_actions']) {
      expect(metric(after, 'fencegate_swept_rows_total', kind), kind).toBe(N);
      expect(metric(after, 'fencegate_sweep_backlog_rows', kind), kind).toBe(0);
    }
    expect(after).toMatch(/^fencegate_sweeps_total\{result="ok"\} 1$/m);

    pastRetention(gw.sqlite, N, 'n');
    budget.ms = 0;
    await gw.running.gateway.sweep();
    const behind = await scrape();
    expect(metric(behind, 'fencegate_sweep_backlog_rows', 'expired_records')).toBe(N - 1000);
    expect(metric(behind, 'fencegate_sweep_backlog_rows', 'fence_entities')).toBe(N - 1000);
    expect(metric(behind, 'fencegate_swept_rows_total', 'expired_records')).toBe(N + 1000);
  });

  it('renders the backlog of the last sweep and the counters of every sweep (unit)', () => {
    const m = createMetrics();
    const backlog = { ...zeros, oldRejections: 7 } as Record<(typeof ALL_KINDS)[number], number>;
    m.swept(
      {
        expiredRecords: 3,
        unknownRecords: 0,
        oldRejections: 1000,
        oldEntities: 0,
        oldFenceHistory: 0,
        oldOperatorActions: 0,
        oldCommands: 0,
        backlog,
        batches: 2,
      },
      1500,
    );
    m.sweepFailed();
    const text = m.render({ inflight: 0, stats: null });
    expect(text).toMatch(/^fencegate_sweep_backlog_rows\{kind="rejections"\} 7$/m);
    expect(text).toMatch(/^fencegate_swept_rows_total\{kind="expired_records"\} 3$/m);
    expect(text).toMatch(/^fencegate_sweeps_total\{result="failed"\} 1$/m);
    expect(text).toMatch(/^fencegate_sweep_duration_seconds 1.5$/m);
  });
});
