import type { Config, ReconcileConfig, RouteConfig } from '../config/schema.js';
import { ConfigError } from '../config/load.js';
import type { GatewayStore, RecordInfo } from '../store/types.js';
import { errorText, type Logger } from './logger.js';
import { RECONCILE_AGES, type ReconcileAge, type ReconcilePassGauges } from './metrics.js';
import type { ReconcileQuery } from './pipeline/reconcile.js';
import type { ReconcileResult } from './pipeline/reconcile-rules.js';

/**
 * The background reconciler (DESIGN §3.12): beside the sweeper, it lists the
 * outcome_unknown records of routes with `reconcile` and asks the upstream
 * about each, so that records settle with no retry at all. Per route at most
 * `reconcile.concurrency` queries at once; per record a back-off from
 * `reconcile.interval`, doubled after each answer that settled nothing, up to
 * an hour. The back-off is kept in this process's memory: a restart, or
 * another replica, asks again sooner, which is harmless (every decision is
 * the store's conditional resolution). Past `maxAge` since its admission a
 * record is left to an operator: counted in
 * fencegate_reconcile_gave_up_records and shown `reconcile: "gave-up"` in
 * the admin API's record listing.
 */

export type ReconcileRoute = RouteConfig & { reconcile: ReconcileConfig };

/** Most records one pass reads (pages of PAGE): a deeper backlog is worked off over several passes. */
const PAGE = 200;
const MAX_PAGES = 50;
const MAX_BACKOFF_MS = 3_600_000;

export interface ReconcilePass {
  /** outcome_unknown records of routes with reconcile that were seen. */
  seen: number;
  /** Queries asked this pass, by result. */
  asked: Partial<Record<ReconcileResult, number>>;
  /** Records past their route's maxAge. */
  gaveUp: number;
  /** Records due but not asked because the pass's budget ran out (the next pass asks them). */
  deferred?: number;
  /** Routes with asyncReply: Locations polled this pass, by result (./async-poller.ts). */
  polled?: Record<string, number>;
  /** The pass found in-progress records whose lock had expired and had the sweeper mark them outcome_unknown first. */
  markedDead?: number;
}

/**
 * Bounds on one pass, for a runtime with per-invocation limits (the Workers
 * entry, DESIGN §8.3): once one is reached no new status query starts (those
 * running end within their route's timeout), and the records left keep their
 * back-off as it was, so the next pass asks them.
 */
export interface PassBudget {
  /** `now()` at or past which no new query starts. */
  until?: number;
  /** Most status queries started. */
  queries?: number;
  /** Most pages of records read (of 200). */
  pages?: number;
}

/**
 * Whether an attempt on a route this pass settles is still `in_progress`
 * with a lock that has expired by this process's clock: its gateway died,
 * or a SIGTERM drain could not write its finish (DESIGN §3.12 "Shutdown
 * and restart"). Such a record is marked `outcome_unknown` only by the
 * store, against the database clock (the sweeper's dead-records step, or an
 * admission's rule f); this is only the hint that running that step now,
 * before the listing, is worth it, rather than at the next sweep.
 */
export async function deadAttemptsDue(store: GatewayStore, routes: readonly RouteConfig[], now = Date.now()): Promise<boolean> {
  // Every route whose lost answers the pass settles: a status query (a path, or an mcp route's status tool) or a Location polled.
  const settling = routes.filter((r) => r.reconcile !== undefined || (r.protocol === 'http' && r.asyncReply !== undefined));
  if (settling.length === 0) return false;
  let cursor: string | undefined;
  for (let page = 0; page < MAX_PAGES; page++) {
    const p = await store.listRecords({ state: 'in_progress', limit: PAGE, ...(cursor !== undefined ? { cursor } : {}) });
    if (p.items.some((r) => r.lockedUntil !== null && r.lockedUntil.getTime() <= now && routeOfScope(settling, r.scope) !== undefined)) return true;
    if (p.nextCursor === null) return false;
    cursor = p.nextCursor;
  }
  return false;
}

/** The route whose record this is (the scope begins with the route's name, ../key-scope.ts). */
export function routeOfScope<R extends { name: string }>(routes: readonly R[], scope: string): R | undefined {
  const name = scope.split('\u0000')[0];
  return routes.find((r) => r.name === name);
}

/**
 * How the admin API shows an outcome_unknown record of a route with
 * `reconcile`: `pending` while the reconciler still asks, `gave-up` past
 * maxAge (then it is the operator's). Undefined for any other record.
 * The age is read against this process's clock: it only says whether the
 * reconciler still asks, it settles nothing.
 */
export function reconcileStatus(r: RecordInfo, routes: readonly RouteConfig[], now = Date.now()): 'pending' | 'gave-up' | undefined {
  if (r.state !== 'outcome_unknown') return undefined;
  // A command still pending on an asyncReply route: its Location is polled until maxAge (./async-poller.ts).
  const async = r.interim ? routeOfScope(routes, r.scope)?.asyncReply : undefined;
  if (async !== undefined) return now - r.createdAt.getTime() > async.maxAge ? 'gave-up' : 'pending';
  const rc = routeOfScope(routes, r.scope)?.reconcile;
  if (rc === undefined) return undefined;
  return now - r.createdAt.getTime() > rc.maxAge ? 'gave-up' : 'pending';
}

function ageOf(ms: number): ReconcileAge {
  if (ms < 60_000) return 'under_1m';
  if (ms < 3_600_000) return 'under_1h';
  if (ms < 86_400_000) return 'under_1d';
  return 'over_1d';
}

/** Reads `reconcile.headers` secrets once; a missing variable stops start-up naming the field. */
export function resolveReconcileHeaders(config: Config, env: Record<string, string | undefined>): Map<string, Record<string, string>> {
  const out = new Map<string, Record<string, string>>();
  const missing: string[] = [];
  config.routes.forEach((route, i) => {
    if (route.reconcile === undefined) return;
    const headers: Record<string, string> = {};
    for (const [name, spec] of Object.entries(route.reconcile.headers)) {
      if (typeof spec === 'string') headers[name.toLowerCase()] = spec;
      else {
        const value = env[spec.env];
        if (value === undefined || value === '') missing.push(`routes[${i}].reconcile.headers.${name}: environment variable ${spec.env} is not set`);
        else headers[name.toLowerCase()] = spec.prefix + value;
      }
    }
    out.set(route.name, headers);
  });
  if (missing.length > 0) throw new ConfigError(`invalid configuration:\n  ${missing.join('\n  ')}`, missing);
  return out;
}

export function createBackgroundReconciler(deps: {
  routes: readonly RouteConfig[];
  store: GatewayStore;
  query: ReconcileQuery;
  logger: Logger;
  gauges?: (p: ReconcilePassGauges) => void;
  now?: () => number;
}) {
  const { store, query, logger } = deps;
  const now = deps.now ?? Date.now;
  // Plain routes' status paths and mcp routes' status tools alike (the query tells them apart).
  const routes = deps.routes.filter((r): r is ReconcileRoute => r.reconcile !== undefined);
  /** Per attempt (scope, key, createdAt): when it may be asked again, and how long the next wait is. */
  const backoff = new Map<string, { due: number; waitMs: number }>();

  let stopped = false;
  const pass = async (budget: PassBudget = {}): Promise<ReconcilePass> => {
    const result: ReconcilePass = { seen: 0, asked: {}, gaveUp: 0 };
    if (routes.length === 0 || stopped) return result;
    const unknown = new Map(routes.map((r) => [r.name, Object.fromEntries(RECONCILE_AGES.map((a) => [a, 0])) as Record<ReconcileAge, number>]));
    const gaveUp = new Map(routes.map((r) => [r.name, 0]));
    const queues = new Map<string, { route: ReconcileRoute; record: RecordInfo; id: string }[]>();
    const live = new Set<string>();
    let cursor: string | undefined;
    const t = now();
    for (let page = 0; page < Math.min(MAX_PAGES, budget.pages ?? MAX_PAGES); page++) {
      const p = await store.listRecords({ state: 'outcome_unknown', limit: PAGE, ...(cursor !== undefined ? { cursor } : {}) });
      for (const record of p.items) {
        const route = routeOfScope(routes, record.scope);
        if (route === undefined) continue;
        // A command the upstream accepted and still runs (an interim 202, ./async-poller.ts) is not
        // asked about: its status endpoint may well not know it yet, and a "not found" would release
        // the record and send the command again (DESIGN §3.12 "Async replies").
        if (record.interim && route.asyncReply !== undefined) continue;
        result.seen++;
        const age = t - record.createdAt.getTime();
        unknown.get(route.name)![ageOf(age)]++;
        if (age > route.reconcile.maxAge) {
          result.gaveUp++;
          gaveUp.set(route.name, gaveUp.get(route.name)! + 1);
          continue;
        }
        const id = `${record.scope}\u0000${record.key}\u0000${record.createdAt.getTime()}`;
        live.add(id);
        if ((backoff.get(id)?.due ?? 0) > t) continue;
        let q = queues.get(route.name);
        if (q === undefined) queues.set(route.name, (q = []));
        q.push({ route, record, id });
      }
      if (p.nextCursor === null) break;
      cursor = p.nextCursor;
    }
    // Forget the attempts that are gone (settled, or past maxAge).
    for (const id of backoff.keys()) if (!live.has(id)) backoff.delete(id);
    deps.gauges?.({ unknown, gaveUp });
    let started = 0;
    const spent = () => (budget.queries !== undefined && started >= budget.queries) || (budget.until !== undefined && now() >= budget.until);

    await Promise.all(
      [...queues.values()].map(async (q) => {
        const route = q[0]!.route;
        const worker = async () => {
          // Once stopped (the gateway closing) or the budget spent, no new query: those running end within their timeout.
          while (q.length > 0 && !stopped && !spent()) {
            const { record, id } = q.shift()!;
            started++;
            // The entity as the upstream saw it: the store's caller-scoped form ends with it (./pipeline/admit.ts storeEntity).
            const entity = record.entity === null ? null : record.entity.slice(record.entity.lastIndexOf('\u0000') + 1);
            let r: ReconcileResult;
            try {
              const target = {
                route,
                scope: record.scope,
                key: record.key,
                entity,
                fence: record.fence,
                createdAt: record.createdAt,
                requestId: record.requestId,
                attemptUntil: record.attemptUntil,
              };
              r = (await query(target, route.timeoutMs)).result;
            } catch (err) {
              logger.error('reconcile-error', { route: route.name, error: errorText(err) });
              r = 'error';
            }
            result.asked[r] = (result.asked[r] ?? 0) + 1;
            if (r === 'found' || r === 'not-found') backoff.delete(id);
            else {
              const waitMs = Math.min(backoff.get(id)?.waitMs ?? route.reconcile.interval, MAX_BACKOFF_MS);
              backoff.set(id, { due: now() + waitMs, waitMs: Math.min(waitMs * 2, MAX_BACKOFF_MS) });
            }
          }
        };
        await Promise.all(Array.from({ length: Math.min(route.reconcile.concurrency, q.length) }, worker));
      }),
    );
    const left = [...queues.values()].reduce((n, q) => n + q.length, 0);
    if (left > 0) result.deferred = left;
    return result;
  };
  return {
    pass,
    /** Starts no more queries; the gateway then waits for the pass running. */
    stop(): void {
      stopped = true;
    },
  };
}
