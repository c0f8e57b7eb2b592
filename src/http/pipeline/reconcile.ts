import type { ReconcileConfig, RouteConfig } from '../../config/schema.js';
import type { GatewayStore, StoredResponse } from '../../store/types.js';
import type { Forwarder } from '../forward.js';
import { errorText, type Logger } from '../logger.js';
import { newRequestId } from '../request-id.js';
import { joinUrl } from '../upstream-request.js';
import type { Admitted } from './admit.js';
import type { Command } from './codec.js';
import type { Exchange } from './exchange.js';
import { createMcpReconcileQuery } from '../mcp/reconcile.js';

// After stage 6, for a route with `reconcile` (DESIGN §3.12): when the
// admission answers outcome-unknown, the gateway asks the upstream once
// whether the lost attempt was performed, then decides the admission again.
// The same query serves the background reconciler (../reconciler.ts).
//
// A plain route asks a status path (below); an mcp route a status tool
// (../mcp/reconcile.ts), with its own reading of the answer. The store side
// (resolveRecord with notBefore) and the re-admission are the same.

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
    settleMs: route.reconcile.settleTime,
    legacyBoundMs: route.timeoutMs + route.lockMarginMs + (route.longCall?.lockWindow ?? 0) + route.reconcile.settleTime,
  };
}

/** This process's estimate (ms since the epoch) of when a "not found" about `t` will be trusted: a hint only, the release is the database's decision. */
export function trustedAt(t: Pick<ReconcileTarget, 'route' | 'createdAt' | 'attemptUntil'>): number {
  const nb = notBefore(t.route);
  return t.attemptUntil === null ? t.createdAt.getTime() + nb.legacyBoundMs : t.attemptUntil.getTime() + nb.settleMs;
}

/** The template's path with each variable percent-encoded, or null when it names one the record lacks (or whose value is a dot segment). */
export function reconcilePath(template: string, values: Record<string, string | null>): string | null {
  let missing = false;
  const path = template.replace(/\{([a-z_]+)\}/g, (_, name: string) => {
    const v = values[name];
    if (v === null || v === undefined) {
      missing = true;
      return '';
    }
    // A value that is a dot segment would move the query to another path
    // (`/customers/../charges`), encoded or not (URL parsing reads `%2E%2E`
    // as `..` too): no query is made for it, so nothing is settled.
    if (v === '.' || v === '..') {
      missing = true;
      return '';
    }
    return encodeURIComponent(v);
  });
  return missing ? null : path;
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

export function createReconcileQuery(deps: ReconcileDeps) {
  const { store, forwarder, logger } = deps;
  // An mcp route asks a status tool instead (../mcp/reconcile.ts); the store side is the same.
  const mcpQuery = createMcpReconcileQuery(deps);
  /** Asks the upstream about `t` within `timeoutMs` and settles the record as the answer allows. Never throws. */
  return async function query(t: ReconcileTarget, timeoutMs: number, requestId: string = newRequestId()): Promise<ReconcileOutcome> {
    if (t.route.protocol === 'mcp') return mcpQuery(t, timeoutMs, requestId);
    const { route } = t;
    const rc = route.reconcile;
    const done = (result: ReconcileResult, changed = false) => reported(deps, t, requestId, result, changed);
    const path = reconcilePath(rc.path, { key: t.key, entity: t.entity, fence: t.fence, request_id: t.requestId });
    if (path === null) return done('error');
    let answer;
    try {
      answer = await forwarder.forward({
        url: joinUrl(route.upstream, path),
        method: rc.method,
        headers: { ...(deps.headers.get(route.name) ?? {}), 'x-request-id': requestId },
        body: null,
        timeoutMs: Math.max(1, timeoutMs),
        maxResponseBytes: route.maxResponseBytes,
      });
    } catch (err) {
      logger.error('reconcile-error', { request_id: requestId, route: route.name, error: errorText(err) });
      return done('error');
    }
    if (answer.kind === 'refused') return done('error');
    // A timeout, a reset, or a found answer over maxResponseBytes: nothing is known for sure.
    if (answer.kind !== 'response') return done('unknown');
    const base = { scope: t.scope, key: t.key, operator: RECONCILER, requestId, createdAt: t.createdAt };
    try {
      if (rc.found.includes(answer.status)) {
        const keep = new Set(route.replayHeaders.map((h) => h.toLowerCase()));
        const headers: [string, string][] = answer.headers.filter(([n]) => keep.has(n.toLowerCase()) && n.toLowerCase() !== RECONCILED_HEADER);
        headers.push([RECONCILED_HEADER, 'true']);
        const response: StoredResponse = { status: answer.status, headers, body: rc.method === 'HEAD' ? new Uint8Array(0) : answer.body };
        // Refused only when the record is no longer this attempt's (settled meanwhile): changed either way.
        await store.resolveRecord({
          ...base,
          resolution: { outcome: 'completed', response, retentionMs: route.retention },
          note: `status query answered ${answer.status}: performed`,
        });
        return done('found', true);
      }
      if (rc.notFound.includes(answer.status)) {
        // Trusted only once the attempt can no longer be in flight nor still be landing: decided
        // by the database clock inside the release (DESIGN §3.12, G6), never by this process's.
        const r = await store.resolveRecord({
          ...base,
          resolution: { outcome: 'released', notBefore: notBefore(route) },
          note: `status query answered ${answer.status}: not performed`,
        });
        if (r.ok) return done('not-found', true);
        if (r.reason === 'too-early') return done('not-yet-trusted');
        return done('not-found', true);
      }
    } catch (err) {
      logger.error('reconcile-error', { request_id: requestId, route: route.name, error: errorText(err) });
      return done('error');
    }
    return done('unknown');
  };
}

export type ReconcileQuery = ReturnType<typeof createReconcileQuery>;

/**
 * The inline step: a retry on a plain route with `reconcile` whose admission
 * answered outcome-unknown. One status query, bounded by the route's
 * `maxWaitMs` (as `Prefer: wait` is); when it settled the record (or someone
 * else did meanwhile) the admission is decided again: a found answer is then
 * replayed, a released record forwarded. Otherwise the admission stands
 * (409 outcome-unknown). Null: the store could not be reached on the re-admission.
 */
export function createReconcileStage(deps: { store: GatewayStore; query: ReconcileQuery; admit: (x: Exchange, command: Command) => Promise<Admitted | null> }) {
  const { store, query, admit } = deps;
  return async function reconcile(x: Exchange, command: Command, admitted: Admitted): Promise<Admitted | null> {
    const route = x.route!;
    if (route.reconcile === undefined || command.key === null || route.maxWaitMs <= 0 || x.req.signal.aborted) return admitted;
    let record;
    try {
      record = (await store.getRecords(command.key)).find((r) => r.scope === admitted.input.scope && r.state === 'outcome_unknown');
    } catch {
      return admitted;
    }
    // Settled between the admission and this read: decide again.
    if (record === undefined) return admit(x, command);
    const target: ReconcileTarget = {
      route: route as ReconcileTarget['route'],
      scope: record.scope,
      key: record.key,
      entity: command.entity,
      fence: record.fence,
      createdAt: record.createdAt,
      requestId: record.requestId,
      attemptUntil: record.attemptUntil,
    };
    const { result, changed } = await query(target, route.maxWaitMs, x.requestId);
    x.trace.reconcile = result;
    // For the refusal's Retry-After (reconcileHint): the database decided "too early" by its own
    // clock; this is this process's estimate of the rest, a hint only, never a decision (G6).
    if (result === 'not-yet-trusted') x.reconcileTrustedInMs = trustedAt(target) - Date.now();
    return changed ? admit(x, command) : admitted;
  };
}

/**
 * What a 409 outcome-unknown on a route with `reconcile` adds (DESIGN §3.12):
 * the gateway is still asking, so the caller may ask again after
 * `retryAfterMs` with the same request. That is the time until a "not found"
 * would be trusted when the inline query just said "too early", never more
 * than the reconcile `interval` (each retry asks the status endpoint again,
 * so a lagging "found" is seen at that pace); else the interval. Null on a
 * route without `reconcile`, or a gateway without the status query: the
 * refusal is then exactly as before.
 */
export function reconcileHint(x: Exchange, enabled: boolean): { retryAfterMs: number } | null {
  const rc = x.route?.reconcile;
  if (!enabled || rc === undefined) return null;
  const trustedIn = x.reconcileTrustedInMs;
  return { retryAfterMs: trustedIn === undefined ? rc.interval : Math.max(0, Math.min(trustedIn, rc.interval)) };
}
