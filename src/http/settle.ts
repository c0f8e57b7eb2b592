import type { RouteConfig } from '../config/schema.js';
import type { Refusal } from '../protocol/problem.js';
import type { FinishInput, GatewayStore, StoredResponse } from '../store/types.js';
import { MIN_RETRY_MS, retryDelayMs } from '../store/retry-schedule.js';
import { renderRefusal, toReply } from './errors.js';
import { connectionTokens, isHopByHop, type UpstreamResult } from './forward.js';
import type { Reply } from './inbound.js';
import { errorText, type Logger } from './logger.js';

// Step 7 of the decision order (DESIGN §3.7): what the upstream's answer (or
// its absence) means for the record, what the caller is told, and the
// finish that records it.

export function settle(
  result: UpstreamResult,
  route: RouteConfig,
  base: Omit<FinishInput, 'outcome'>,
  problemBase: string,
  requestId: string,
  /** The deadline the forward had: the route's, or less when the lock left less. */
  timeoutMs: number,
): { finish: FinishInput; response: Reply; decision: string } {
  const problem = (refusal: Refusal) => toReply(renderRefusal(Object.assign({}, refusal, { extras: Object.assign({}, refusal.extras, { request_id: requestId }) }), route.errors, problemBase));
  switch (result.kind) {
    case 'response': {
      const passthrough = responseFrom({ status: result.status, headers: result.headers, body: result.body }, 'hop-by-hop');
      const headLength = base.audit.method === 'HEAD' ? declaredLengthOf(result.headers) : null;
      if (headLength !== null) setHeader(passthrough, 'content-length', headLength);
      if (route.releaseStatuses.includes(result.status)) {
        // 429 / 503 and the like mean "not processed": safe to retry.
        return { finish: finishOf(base, { outcome: 'released' }), response: passthrough, decision: 'forwarded-released' };
      }
      const keep = replayHeaderSet(route);
      const kept = result.headers.filter(([n]) => keep.has(n.toLowerCase()));
      const headers: [string, string][] = headLength === null ? kept : [...kept.filter(([n]) => n.toLowerCase() !== 'content-length'), ['content-length', headLength]];
      const stored: StoredResponse = { status: result.status, headers, body: result.body };
      return { finish: finishOf(base, { outcome: 'completed', response: stored, retentionMs: route.retention }), response: passthrough, decision: 'forwarded' };
    }
    case 'refused':
      return {
        finish: finishOf(base, { outcome: 'released' }),
        response: problem({ code: 'upstream-unavailable', detail: `the request could not be sent to the upstream (${result.error}); nothing was sent, retry with the same key is safe` }),
        decision: 'upstream-unavailable',
      };
    case 'unknown':
      return {
        finish: finishOf(base, { outcome: 'unknown' }),
        response: problem({
          code: 'upstream-timeout',
          detail: `${result.timedOut ? `no complete answer within ${timeoutMs} ms` : `the connection failed (${result.error})`} after the request may have been sent; the outcome is unknown`,
        }),
        decision: 'upstream-timeout',
      };
    case 'too-large': {
      const extras = { upstream_status: result.status, max_response_bytes: result.limit };
      if (route.releaseStatuses.includes(result.status)) {
        // "Not processed" (429, 503): nothing happened upstream, so the key is
        // released as for a small answer; only the answer itself is lost.
        const refusal = problem({
          code: 'upstream-response-too-large',
          detail: `the upstream answered ${result.status} (not processed) with a body over this route's maxResponseBytes of ${result.limit} bytes, which was not kept; the key was released, a retry with the same key is safe`,
          extras,
        });
        return { finish: finishOf(base, { outcome: 'released' }), response: refusal, decision: 'upstream-response-too-large-released' };
      }
      // The upstream answered, so it received the request and acted on it;
      // only its answer is lost. Forwarding the key again could repeat the
      // effect (G2), so the refusal itself is stored as the key's answer:
      // the caller and every retry get these same bytes, the retries as a
      // replay, for as long as the record is retained.
      const refusal = problem({
        code: 'upstream-response-too-large',
        detail: `the upstream answered ${result.status}: it received the request and acted on it, but its answer exceeded this route's maxResponseBytes of ${result.limit} bytes and was not kept; do not retry blindly (a retry with this key gets this same answer), check the outcome with the upstream`,
        extras,
      });
      const stored: StoredResponse = {
        status: refusal.status,
        headers: refusal.headers,
        body: typeof refusal.body === 'string' ? new TextEncoder().encode(refusal.body) : (refusal.body ?? new Uint8Array(0)),
      };
      return {
        finish: finishOf(base, { outcome: 'completed', response: stored, retentionMs: route.retention }),
        response: responseFrom(stored, null),
        decision: 'upstream-response-too-large',
      };
    }
  }
}

/**
 * `{ ...base, ...end }`, the same object: in Node 20's V8 an object spread
 * followed by more properties takes a slow path (~2 µs a call, measured),
 * Object.assign onto a new object does not.
 */
export function finishOf(base: Omit<FinishInput, 'outcome'>, end: { outcome: 'released' | 'unknown' } | { outcome: 'completed'; response: StoredResponse; retentionMs: number }): FinishInput {
  return Object.assign({}, base, end);
}

/** A route's `replayHeaders`, lower case, made once per route config (not per answer). */
const replaySets = new WeakMap<readonly string[], ReadonlySet<string>>();
function replayHeaderSet(route: RouteConfig): ReadonlySet<string> {
  let keep = replaySets.get(route.replayHeaders);
  if (keep === undefined) replaySets.set(route.replayHeaders, (keep = new Set(route.replayHeaders.map((h) => h.toLowerCase()))));
  return keep;
}

/**
 * The finish must land, or the record would wait for its lock to expire and
 * become outcome_unknown although the gateway knows the answer. Retries ride
 * out a store outage (a PostgreSQL restart or failover, a busy SQLite file)
 * for as long as the record's lock lives (`timeoutMs + lockMarginMs` from the
 * admission; at least ~1.25 s), the margin the lock keeps for this finish.
 * A PostgreSQL restart under load (test/replicas/postgres-restart.test.ts)
 * kept the server away ~1.5 s; with a fixed 1.25 s of retries every request
 * at the upstream at that moment ended outcome_unknown although it had been
 * answered. Past the lock a retry is harmless (the finish is conditional on
 * the owner token) but the caller has waited long enough.
 */
export async function finishWithRetries(store: GatewayStore, finish: FinishInput, logger: Logger, requestId: string, lockEnds: number): Promise<boolean | null> {
  // performance.now(): lockEnds is measured on the monotonic clock.
  const giveUpAt = Math.max(lockEnds, performance.now() + MIN_RETRY_MS);
  for (let attempt = 0; ; attempt++) {
    try {
      return (await store.finish(finish)).recorded;
    } catch (err) {
      const left = giveUpAt - performance.now();
      if (left <= 0) {
        logger.error('store-error', { request_id: requestId, phase: 'finish', outcome: finish.outcome, attempts: attempt + 1, error: errorText(err) });
        return null;
      }
      // Jittered (../store/retry-schedule.ts); the last attempt falls on the deadline itself.
      await new Promise((r) => setTimeout(r, retryDelayMs(attempt, left)));
    }
  }
}

export function responseFrom(stored: StoredResponse, filter: 'hop-by-hop' | null): Reply {
  const headers: [string, string][] = [];
  const conn = filter ? connectionTokens(stored.headers.find(([n]) => n.toLowerCase() === 'connection')?.[1]) : new Set<string>();
  for (const [name, value] of stored.headers) {
    if (filter && isHopByHop(name, conn)) continue;
    headers.push([name.toLowerCase(), value]);
  }
  const noBody = stored.status === 204 || stored.status === 304 || (stored.status >= 100 && stored.status < 200);
  return { status: stored.status, headers, body: noBody ? null : stored.body };
}

/** Sets a header of a Reply (names are lower case there), replacing any value it had, as `Headers.set` does. */
export function setHeader(reply: Reply, name: string, value: string): void {
  reply.headers = reply.headers.filter(([n]) => n !== name);
  reply.headers.push([name, value]);
}

/**
 * A HEAD answer's `Content-Length` (RFC 9110 §9.3.2: the length a GET would
 * have had). It is hop-by-hop for every other answer, where the gateway
 * frames the body it writes; a HEAD answer has no body, so without this the
 * caller would be told nothing, or 0, about the resource's size. Kept only in
 * canonical form: one decimal, no list.
 */
function declaredLengthOf(headers: [string, string][]): string | null {
  const values = headers.filter(([n]) => n.toLowerCase() === 'content-length').map(([, v]) => v.trim());
  return values.length === 1 && /^(0|[1-9][0-9]{0,15})$/.test(values[0]!) ? values[0]! : null;
}
