import type { RouteConfig } from '../config/schema.js';
import type { GatewayStore, RecordInfo } from '../store/types.js';
import { errorText, type Logger } from './logger.js';
import type { AsyncPoll, AsyncRoute, PollResult } from './pipeline/async-reply.js';
import { routeOfScope } from './reconciler.js';

/**
 * The background half of async replies (DESIGN §3.12 "Async replies"):
 * beside the reconciler, it lists the outcome_unknown records of routes with
 * `asyncReply` that keep an interim answer, and polls each one's Location,
 * at most `asyncReply.concurrency` at once per route, each record backing
 * off from `interval` (doubled after each poll that settled nothing, up to
 * `maxInterval`; kept in memory, so a restart polls sooner, which is
 * harmless). Past `maxAge` since its admission a record is no longer polled:
 * its interim answer has lapsed with it and it is the operator's.
 */

const PAGE = 200;
const MAX_PAGES = 50;

export interface AsyncPollPass {
  /** outcome_unknown records with an interim answer on routes with asyncReply. */
  seen: number;
  polled: Partial<Record<PollResult, number>>;
  gaveUp: number;
}

export function createAsyncPoller(deps: { routes: readonly RouteConfig[]; store: GatewayStore; poll: AsyncPoll; logger: Logger; now?: () => number }) {
  const { store, poll, logger } = deps;
  const now = deps.now ?? Date.now;
  const routes = deps.routes.filter((r): r is AsyncRoute => r.asyncReply !== undefined && r.protocol === 'http');
  const backoff = new Map<string, { due: number; waitMs: number }>();
  let stopped = false;

  const pass = async (): Promise<AsyncPollPass> => {
    const result: AsyncPollPass = { seen: 0, polled: {}, gaveUp: 0 };
    if (routes.length === 0 || stopped) return result;
    const queues = new Map<string, { route: AsyncRoute; record: RecordInfo; id: string }[]>();
    const live = new Set<string>();
    const t = now();
    let cursor: string | undefined;
    for (let page = 0; page < MAX_PAGES; page++) {
      const p = await store.listRecords({ state: 'outcome_unknown', limit: PAGE, ...(cursor !== undefined ? { cursor } : {}) });
      for (const record of p.items) {
        const route = routeOfScope(routes, record.scope);
        if (route === undefined || !record.interim) continue;
        result.seen++;
        if (t - record.createdAt.getTime() > route.asyncReply.maxAge) {
          result.gaveUp++;
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
    for (const id of backoff.keys()) if (!live.has(id)) backoff.delete(id);

    await Promise.all(
      [...queues.values()].map(async (q) => {
        const route = q[0]!.route;
        const worker = async () => {
          for (let item = q.shift(); item !== undefined && !stopped; item = q.shift()) {
            const { record, id } = item;
            let r: PollResult;
            try {
              const interim = await store.getInterim({ scope: record.scope, key: record.key, createdAt: record.createdAt });
              // Settled, or lapsed, since the listing.
              if (interim === null) continue;
              // A status monitor answers at once: a minute at most, whatever a long call's own timeout.
              r = await poll({ route, scope: record.scope, key: record.key, createdAt: record.createdAt, interim }, Math.min(route.timeoutMs, 60_000));
            } catch (err) {
              logger.error('async-poll-error', { route: route.name, error: errorText(err) });
              r = 'error';
            }
            result.polled[r] = (result.polled[r] ?? 0) + 1;
            if (r === 'final') backoff.delete(id);
            else {
              const { interval, maxInterval } = route.asyncReply;
              const waitMs = Math.min(backoff.get(id)?.waitMs ?? interval, maxInterval);
              backoff.set(id, { due: now() + waitMs, waitMs: Math.min(waitMs * 2, maxInterval) });
            }
          }
        };
        await Promise.all(Array.from({ length: Math.min(route.asyncReply.concurrency, q.length) }, worker));
      }),
    );
    return result;
  };
  return {
    pass,
    stop(): void {
      stopped = true;
    },
  };
}
