/**
 * The background reconcile pass on Workers (DESIGN §3.12, §8.3): the Node
 * gateway runs it on a timer; a Worker has no timer that outlives a request,
 * so the cron trigger's `scheduled` event runs one pass (./worker.ts).
 *
 * A pass runs inside one invocation, so it is bounded by what an invocation
 * may do: a wall-clock budget after which no new status query starts (the
 * running ones end within their route's `timeoutMs`), a number of status
 * queries (each one `fetch` subrequest and at most one D1 batch; D1 allows
 * 50 queries per invocation on the Free plan, 1000 on Paid), and at most
 * PAGES pages of records read. The records a pass leaves keep their back-off
 * as it was: the next pass asks them.
 *
 * The per-record back-off lives in the isolate's memory (one reconciler per
 * isolate). A cron event may land on another isolate, or on a new one, which
 * then asks sooner than the back-off says: harmless, since every decision is
 * the store's conditional resolution (a found answer completes the record
 * once, a not-found one releases it only past the bound by the database
 * clock).
 */
import { ConfigError } from '../config/load.js';
import type { Config } from '../config/schema.js';
import type { Forwarder } from '../http/forward.js';
import type { Logger } from '../http/logger.js';
import type { Metrics } from '../http/metrics.js';
import { createReconcileQuery } from '../http/pipeline/reconcile.js';
import { createBackgroundReconciler, type PassBudget, type ReconcilePass, resolveReconcileHeaders } from '../http/reconciler.js';
import type { GatewayStore } from '../store/types.js';

/** Default wall-clock budget of one pass: no new status query starts after it. */
export const RECONCILE_BUDGET_MS = 30_000;
/** Default most status queries one pass starts. */
export const RECONCILE_MAX_QUERIES = 20;
/** Pages of records one pass reads (200 each, newest first). */
const PAGES = 5;
/** Past its budget plus the longest route timeout plus this, a pass is taken for dead (its invocation was cut off). */
const STALE_MARGIN_MS = 10_000;

export interface WorkerReconciler {
  /** One pass (or the one running in this isolate, joined), logged as the Node gateway logs it. */
  run(): Promise<ReconcilePass>;
}

/** Reads FENCEGATE_RECONCILE_BUDGET_MS and FENCEGATE_RECONCILE_MAX_QUERIES (positive integers), or the defaults. */
export function reconcileBudgetOf(env: Record<string, unknown>): { budgetMs: number; maxQueries: number } {
  const read = (name: string, fallback: number): number => {
    const v = env[name];
    if (v === undefined || v === '') return fallback;
    const n = typeof v === 'string' && /^[0-9]+$/.test(v.trim()) ? Number(v.trim()) : Number.NaN;
    if (!Number.isSafeInteger(n) || n < 1) throw new ConfigError(`${name} must be a positive integer (it is ${JSON.stringify(v).slice(0, 40)})`, [name]);
    return n;
  };
  return { budgetMs: read('FENCEGATE_RECONCILE_BUDGET_MS', RECONCILE_BUDGET_MS), maxQueries: read('FENCEGATE_RECONCILE_MAX_QUERIES', RECONCILE_MAX_QUERIES) };
}

/**
 * The isolate's reconciler, or null when no route has `reconcile` (then the
 * cron trigger only sweeps, as before). `metrics` is the gateway's, so that
 * `/metrics` shows the pass's gauges and query counts.
 */
export function createWorkerReconciler(deps: {
  config: Config;
  store: GatewayStore;
  forwarder: Forwarder;
  logger: Logger;
  metrics: Metrics;
  env: Record<string, string>;
  budgetMs: number;
  maxQueries: number;
  now?: () => number;
}): WorkerReconciler | null {
  const { config, store, forwarder, logger, metrics } = deps;
  const now = deps.now ?? Date.now;
  const routes = config.routes.filter((r) => r.reconcile !== undefined && r.protocol === 'http');
  if (routes.length === 0) return null;
  const query = createReconcileQuery({
    store,
    forwarder,
    logger,
    headers: resolveReconcileHeaders(config, deps.env),
    counted: (route, result) => metrics.reconciled(route, result),
  });
  const reconciler = createBackgroundReconciler({ routes: config.routes, store, query, logger, gauges: (p) => metrics.reconcilePass(p), now });
  const staleAfterMs = deps.budgetMs + Math.max(...routes.map((r) => r.timeoutMs)) + STALE_MARGIN_MS;
  let running: { pass: Promise<ReconcilePass>; startedAt: number } | null = null;

  const run = (): Promise<ReconcilePass> => {
    const t = now();
    // A second cron event while a pass runs joins it. A pass whose
    // invocation was cut off (a platform limit) never settles: the joiner
    // waits for it only until its bound, then starts a pass of its own.
    if (running !== null && t - running.startedAt < staleAfterMs) {
      const joined = running.pass;
      let timer: ReturnType<typeof setTimeout> | undefined;
      const bound = new Promise<ReconcilePass>((resolve) => {
        timer = setTimeout(() => resolve(run()), running!.startedAt + staleAfterMs - t);
      });
      return Promise.race([joined, bound]).finally(() => clearTimeout(timer));
    }
    const budget: PassBudget = { until: t + deps.budgetMs, queries: deps.maxQueries, pages: PAGES };
    const current = {
      startedAt: t,
      pass: reconciler.pass(budget).then(
        (r) => {
          if (Object.keys(r.asked).length > 0 || r.gaveUp > 0 || r.deferred !== undefined)
            logger.info('reconcile-pass', { seen: r.seen, gave_up: r.gaveUp, ...(r.deferred !== undefined ? { deferred: r.deferred } : {}), ...r.asked });
          return r;
        },
        (err: unknown) => {
          logger.error('reconcile-failed', { error: String(err) });
          throw err;
        },
      ),
    };
    running = current;
    void current.pass
      .finally(() => {
        if (running === current) running = null;
      })
      .catch(() => {});
    return current.pass;
  };
  return { run };
}
