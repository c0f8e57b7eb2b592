import type { ReconcileConfig, RouteConfig } from '../../config/schema.js';
import type { GatewayStore } from '../../store/types.js';
import type { Forwarder } from '../forward.js';
import { errorText, type Logger } from '../logger.js';

// What every status query shares (DESIGN §3.12), a plain route's status path
// (./reconcile.ts) and an mcp route's status tool (../mcp/reconcile.ts): its
// results, the record it asks about, when a "not found" may be trusted, and
// how its end is reported. Its own file so that neither query imports the other.

/** What the status query said, as the metrics count it. */
export type ReconcileResult =
  /** The upstream has the command: the record is completed with its answer. */
  | 'found'
  /** The upstream has no such command, and the attempt can no longer be in flight: released. */
  | 'not-found'
  /** "Not found", but too soon to trust (the attempt's lock or settle time has not passed by the database clock): nothing changed. */
  | 'not-yet-trusted'
  /** Any other answer (5xx, another status, a timeout, a found answer too large): nothing changed. */
  | 'unknown'
  /** The query could not be made, or the store failed: nothing changed. */
  | 'error';

export const RECONCILE_RESULTS: readonly ReconcileResult[] = ['found', 'not-found', 'not-yet-trusted', 'unknown', 'error'];

/** The header every replay of a reconciled answer carries (DESIGN §3.12). */
export const RECONCILED_HEADER = 'fencegate-reconciled';

/** The operator every reconcile decision is logged under (operator_actions). */
export const RECONCILER = 'reconciler';

/** The outcome_unknown record to reconcile: which attempt, and the values its template may name. */
export interface ReconcileTarget {
  route: RouteConfig & { reconcile: ReconcileConfig };
  scope: string;
  key: string;
  /** The entity as the upstream saw it (not the store's caller-scoped form), or null. */
  entity: string | null;
  fence: string | null;
  /** The attempt's admission, as the store returned it: the resolution is conditional on it. */
  createdAt: Date;
  /** The gateway's request id of the attempt last sent (`{request_id}`), or null for a record that keeps none. */
  requestId: string | null;
  /** The attempt's own lock end (RecordInfo.attemptUntil), or null for a record that keeps none: for the hint only. */
  attemptUntil: Date | null;
}

export interface ReconcileOutcome {
  result: ReconcileResult;
  /** The record is no longer this outcome_unknown attempt (settled by this query, or by someone else meanwhile): the admission is worth deciding again. */
  changed: boolean;
}

export interface ReconcileDeps {
  store: GatewayStore;
  forwarder: Forwarder;
  logger: Logger;
  /** Resolved `reconcile.headers` per route name (secrets read at start-up). */
  headers: Map<string, Record<string, string>>;
  /** Called once per status query asked. */
  counted?: (route: string, result: ReconcileResult) => void;
}

/**
 * When a "not found" may release the record (DESIGN §3.12): `settleTime`
 * after the attempt's own lock end, by the database clock; for a record that
 * keeps no lock end of its attempt (written before it was kept), as before:
 * `timeoutMs + lockMarginMs + settleTime` after its admission (plus a long
 * call's `lockWindow`: it may be sent up to one window after its admission,
 * DESIGN §3.6 "Long calls"; its renewals move the attempt's lock end).
 */
export function notBefore(route: RouteConfig & { reconcile: { settleTime: number } }): { settleMs: number; legacyBoundMs: number } {
  return {
    // A long call's request stays open upstream for the whole `timeoutMs` after it is sent,
    // while its lock end is only the last renewal plus `lockWindow` (a renewal that failed
    // leaves it short): its attempt can be in flight until `timeoutMs` past that end.
    settleMs: route.reconcile.settleTime + (route.longCall !== undefined ? route.timeoutMs : 0),
    legacyBoundMs: route.timeoutMs + route.lockMarginMs + (route.longCall?.lockWindow ?? 0) + route.reconcile.settleTime,
  };
}

/** This process's estimate (ms since the epoch) of when a "not found" about `t` will be trusted: a hint only, the release is the database's decision. */
export function trustedAt(t: Pick<ReconcileTarget, 'route' | 'createdAt' | 'attemptUntil'>): number {
  const nb = notBefore(t.route);
  return t.attemptUntil === null ? t.createdAt.getTime() + nb.legacyBoundMs : t.attemptUntil.getTime() + nb.settleMs;
}

/**
 * Every status query's end, a path's or a status tool's (../mcp/reconcile.ts):
 * counted, logged, and an answer that settled nothing kept with the record
 * (its last one, by the database clock) for the record listing.
 */
export async function reported(
  deps: Pick<ReconcileDeps, 'store' | 'logger' | 'counted'>,
  t: Pick<ReconcileTarget, 'scope' | 'key' | 'createdAt'> & { route: { name: string } },
  requestId: string,
  result: ReconcileResult,
  changed: boolean,
): Promise<ReconcileOutcome> {
  const route = t.route.name;
  deps.counted?.(route, result);
  // Ids and statuses only (convention 10): never the query's path or arguments, which may carry the key.
  deps.logger.info('reconcile', { request_id: requestId, route, idempotency_key: t.key, result, changed });
  if (!changed) {
    // A store fault here changes no decision.
    try {
      await deps.store.noteReconcile({ scope: t.scope, key: t.key, createdAt: t.createdAt, result });
    } catch (err) {
      deps.logger.error('reconcile-error', { request_id: requestId, route, phase: 'note', error: errorText(err) });
    }
  }
  return { result, changed };
}
