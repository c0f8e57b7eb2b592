import type { GatewayStore, StoredResponse } from '../../store/types.js';
import { errorText } from '../logger.js';
import { newRequestId } from '../request-id.js';
import { joinUrl } from '../upstream-request.js';
import type { Admitted } from './admit.js';
import type { Command } from './codec.js';
import type { Exchange } from './exchange.js';
import { createMcpReconcileQuery } from '../mcp/reconcile.js';
import {
  notBefore,
  RECONCILED_HEADER,
  RECONCILER,
  type ReconcileDeps,
  type ReconcileOutcome,
  type ReconcileResult,
  type ReconcileTarget,
  reported,
  trustedAt,
} from './reconcile-rules.js';

// After stage 6, for a route with `reconcile` (DESIGN §3.12): when the
// admission answers outcome-unknown, the gateway asks the upstream once
// whether the lost attempt was performed, then decides the admission again.
// The same query serves the background reconciler (../reconciler.ts).
//
// A plain route asks a status path (below); an mcp route a status tool
// (../mcp/reconcile.ts), with its own reading of the answer. The store side
// (resolveRecord with notBefore) and the re-admission are the same.

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
