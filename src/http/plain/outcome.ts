import type { RouteConfig } from '../../config/schema.js';
import type { Refusal } from '../../protocol/problem.js';
import type { FinishInput, StoredResponse } from '../../store/types.js';
import { renderRefusal, toReply } from '../errors.js';
import type { UpstreamResult } from '../forward.js';
import { finishOf } from '../pipeline/settle.js';
import { responseFrom, setHeader } from '../pipeline/reply.js';
import type { Settled } from '../pipeline/codec.js';
import { interimFinish, interimOf } from '../pipeline/async-reply.js';

// Stage 8 for a plain HTTP route (DESIGN §3.7): what the upstream's answer
// (or its absence) means for the record, and what the caller is told.

export function settleHttp(
  result: UpstreamResult,
  route: RouteConfig,
  base: Omit<FinishInput, 'outcome'>,
  problemBase: string,
  requestId: string,
  /** The deadline the forward had: the route's, or less when the lock left less. */
  timeoutMs: number,
): Settled {
  const problem = (refusal: Refusal) =>
    toReply(renderRefusal(Object.assign({}, refusal, { extras: Object.assign({}, refusal.extras, { request_id: requestId }) }), route.errors, problemBase));
  switch (result.kind) {
    case 'response': {
      const passthrough = responseFrom({ status: result.status, headers: result.headers, body: result.body }, 'hop-by-hop');
      const headLength = base.audit.method === 'HEAD' ? declaredLengthOf(result.headers) : null;
      if (headLength !== null) setHeader(passthrough, 'content-length', headLength);
      // On a route with `asyncReply`, a 202 with a Location is not the outcome yet (../pipeline/async-reply.ts).
      const interim = interimOf(route, result, base.audit.path);
      if (interim !== null) return { finish: interimFinish(base, interim, route.asyncReply!), reply: passthrough, decision: 'forwarded-interim' };
      if (route.releaseStatuses.includes(result.status)) {
        // 429 / 503 and the like mean "not processed": safe to retry.
        return { finish: finishOf(base, { outcome: 'released' }), reply: passthrough, decision: 'forwarded-released' };
      }
      const keep = replayHeaderSet(route);
      const kept = result.headers.filter(([n]) => keep.has(n.toLowerCase()));
      const headers: [string, string][] =
        headLength === null ? kept : [...kept.filter(([n]) => n.toLowerCase() !== 'content-length'), ['content-length', headLength]];
      const stored: StoredResponse = { status: result.status, headers, body: result.body };
      return { finish: finishOf(base, { outcome: 'completed', response: stored, retentionMs: route.retention }), reply: passthrough, decision: 'forwarded' };
    }
    case 'refused':
      return {
        finish: finishOf(base, { outcome: 'released' }),
        reply: problem({
          code: 'upstream-unavailable',
          detail: `the request could not be sent to the upstream (${result.error}); nothing was sent, retry with the same key is safe`,
        }),
        decision: 'upstream-unavailable',
      };
    case 'unknown':
      return {
        finish: finishOf(base, { outcome: 'unknown' }),
        reply: problem({
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
        return { finish: finishOf(base, { outcome: 'released' }), reply: refusal, decision: 'upstream-response-too-large-released' };
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
        reply: responseFrom(stored, null),
        decision: 'upstream-response-too-large',
      };
    }
  }
}

/** A route's `replayHeaders`, lower case, made once per route config (not per answer). */
const replaySets = new WeakMap<readonly string[], ReadonlySet<string>>();
function replayHeaderSet(route: RouteConfig): ReadonlySet<string> {
  let keep = replaySets.get(route.replayHeaders);
  if (keep === undefined) replaySets.set(route.replayHeaders, (keep = new Set(route.replayHeaders.map((h) => h.toLowerCase()))));
  return keep;
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
