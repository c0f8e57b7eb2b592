/**
 * The Workers entry's background reconcile pass (src/entry/worker-scheduled.ts)
 * on a clock of the test's own: the budget stops new status queries (by time
 * and by count), the per-record back-off outlives one cron event (it is the
 * isolate's), and a pass whose invocation was cut off (never settles) holds
 * the next cron event back only until its bound. End to end inside workerd,
 * against D1 and a real provider: reconcile.workerd.ts.
 */
import { describe, expect, it, vi } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { createWorkerReconciler, reconcileBudgetOf } from '../../src/entry/worker-scheduled.js';
import type { Forwarder } from '../../src/http/forward.js';
import { createJsonLogger } from '../../src/http/logger.js';
import { createMetrics } from '../../src/http/metrics.js';
import type { GatewayStore, RecordInfo, RecordPage } from '../../src/store/types.js';

const config = parseConfig({
  store: { sqlite: ':memory:' },
  routes: [
    {
      name: 'payments',
      match: { path: '/payments/*', methods: ['POST'] },
      upstream: 'http://provider.invalid',
      timeoutMs: 5_000,
      reconcile: { path: '/charges/by-key/{key}', interval: '10s', concurrency: 1 },
    },
  ],
});

function setup(opts: { records: number; budgetMs: number; maxQueries: number; list?: () => Promise<RecordPage>; answerMs?: number }) {
  let clock = 1_000_000;
  const records: RecordInfo[] = Array.from({ length: opts.records }, (_, i) => ({
    scope: 'payments',
    key: `k${i}`,
    state: 'outcome_unknown',
    fingerprint: 'fp',
    entity: null,
    fence: null,
    status: null,
    lockedUntil: null,
    interim: false,
    attemptUntil: null,
    requestId: null,
    createdAt: new Date(clock - 60_000),
    expiresAt: new Date(clock + 86_400_000),
  }));
  let lists = 0;
  const store = {
    listRecords: async (): Promise<RecordPage> => {
      lists++;
      return opts.list ? opts.list() : { items: records, nextCursor: null };
    },
  } as unknown as GatewayStore;
  const asked: string[] = [];
  // The status endpoint answers 500 (settles nothing) after answerMs of the test's clock.
  const forwarder: Forwarder = {
    forward: async (req) => {
      asked.push(req.url);
      clock += opts.answerMs ?? 0;
      return { kind: 'response', status: 500, headers: [], body: new Uint8Array(0) };
    },
  };
  const lines: Record<string, unknown>[] = [];
  const logger = createJsonLogger({ write: (l) => lines.push(JSON.parse(l) as Record<string, unknown>) });
  const reconciler = createWorkerReconciler({
    config,
    store,
    forwarder,
    logger,
    metrics: createMetrics({ routes: ['payments'], reconcileRoutes: ['payments'] }),
    env: {},
    budgetMs: opts.budgetMs,
    maxQueries: opts.maxQueries,
    now: () => clock,
  })!;
  return {
    reconciler,
    asked,
    lines,
    lists: () => lists,
    advance: (ms: number) => {
      clock += ms;
    },
  };
}

describe('the Workers background reconcile pass', () => {
  it('starts no status query once its time budget is spent; the records left are deferred to the next pass', async () => {
    const t = setup({ records: 5, budgetMs: 2_500, maxQueries: 100, answerMs: 1_000 });
    const r = await t.reconciler.run();
    // Queries start at +0, +1 s and +2 s; at +3 s the budget is spent.
    expect(t.asked).toHaveLength(3);
    expect(r).toMatchObject({ seen: 5, asked: { unknown: 3 }, deferred: 2 });
    expect(t.lines.find((l) => l.msg === 'reconcile-pass')).toMatchObject({ seen: 5, deferred: 2, unknown: 3 });
    // The next pass asks the two it left (the three asked back off for 10 s).
    const next = await t.reconciler.run();
    expect(next).toMatchObject({ asked: { unknown: 2 } });
    expect(t.asked.slice(3).map((u) => u.split('/').pop())).toEqual(['k3', 'k4']);
    expect(next.deferred).toBeUndefined();
  });

  it('starts at most maxQueries status queries', async () => {
    const t = setup({ records: 5, budgetMs: 60_000, maxQueries: 2 });
    expect(await t.reconciler.run()).toMatchObject({ asked: { unknown: 2 }, deferred: 3 });
    expect(t.asked).toHaveLength(2);
  });

  it('keeps the per-record back-off between cron events of one isolate', async () => {
    const t = setup({ records: 2, budgetMs: 60_000, maxQueries: 100 });
    await t.reconciler.run();
    expect(t.asked).toHaveLength(2);
    // The next cron event, before the 10 s interval: nothing is due, nothing is asked.
    t.advance(5_000);
    expect(await t.reconciler.run()).toMatchObject({ seen: 2, asked: {} });
    expect(t.asked).toHaveLength(2);
    t.advance(6_000);
    await t.reconciler.run();
    expect(t.asked).toHaveLength(4);
  });

  it('a second cron event joins a running pass; one that never settles holds the next back only until its bound', async () => {
    vi.useFakeTimers();
    try {
      let answer: ((p: RecordPage) => void) | undefined;
      const t = setup({
        records: 1,
        budgetMs: 30_000,
        maxQueries: 100,
        list: () => new Promise<RecordPage>((resolve) => (answer ??= resolve)),
      });
      // A pass that settles: the second event gets its result, and no second listing is made.
      const first = t.reconciler.run();
      const joined = t.reconciler.run();
      expect(t.lists()).toBe(1);
      answer!({ items: [], nextCursor: null });
      expect(await joined).toBe(await first);

      // A pass that never settles (the next listing never answers), as one cut off by a platform limit.
      const dead = t.reconciler.run();
      expect(t.lists()).toBe(2);
      let settled = false;
      const waiting = t.reconciler.run().then(() => (settled = true));
      // Budget 30 s + the route's timeout 5 s + the margin 10 s: until then the event waits for it.
      t.advance(44_000);
      await vi.advanceTimersByTimeAsync(44_000);
      expect(t.lists()).toBe(2);
      expect(settled).toBe(false);
      t.advance(2_000);
      await vi.advanceTimersByTimeAsync(2_000);
      // Then it starts a pass of its own (whose listing hangs as well, here).
      expect(t.lists()).toBe(3);
      void dead;
      void waiting;
    } finally {
      vi.useRealTimers();
    }
  });

  it('reads the budget from the Worker variables, refusing anything but a positive integer', () => {
    expect(reconcileBudgetOf({})).toEqual({ budgetMs: 30_000, maxQueries: 20 });
    expect(reconcileBudgetOf({ FENCEGATE_RECONCILE_BUDGET_MS: '5000', FENCEGATE_RECONCILE_MAX_QUERIES: ' 7 ' })).toEqual({ budgetMs: 5_000, maxQueries: 7 });
    for (const bad of ['0', '-1', '1.5', 'ten', '1e3'])
      expect(() => reconcileBudgetOf({ FENCEGATE_RECONCILE_MAX_QUERIES: bad })).toThrow(/FENCEGATE_RECONCILE_MAX_QUERIES must be a positive integer/);
  });
});
