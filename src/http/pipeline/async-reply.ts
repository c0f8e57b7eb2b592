import type { AsyncReplyConfig, RouteConfig } from '../../config/schema.js';
import type { FinishInput, GatewayStore, StoredResponse } from '../../store/types.js';
import type { Forwarder, UpstreamResult } from '../forward.js';
import { errorText, type Logger } from '../logger.js';
import { newRequestId } from '../request-id.js';
import { joinUrl } from '../upstream-request.js';
import type { Admitted } from './admit.js';
import type { Command } from './codec.js';
import type { Exchange } from './exchange.js';
import { tokensOf, valueAtPointer } from '../../core/json-pointer.js';
import { RECONCILED_HEADER, RECONCILER } from './reconcile-rules.js';

// The async request-reply pattern on a plain route with `asyncReply`
// (DESIGN §3.12 "Async replies"): a `202 Accepted` with a `Location` is an
// interim answer, not the outcome. The finish records `unknown` keeping it
// (the store's interim answer, DESIGN §3.7): every retry of the key gets the
// 202 replayed while the command is pending. The gateway polls the Location,
// on the route's own upstream origin only, until it answers a final answer,
// which completes the record (marked `fencegate-reconciled: true`): the
// retries get it from then on. Inline (a retry asks once, within the
// route's `maxWaitMs`) and in the background (../async-poller.ts).

export type AsyncRoute = RouteConfig & { asyncReply: AsyncReplyConfig };

/** What one poll of a Location said. */
export type PollResult =
  /** A final answer: the record is completed with it (or was settled meanwhile). */
  | 'final'
  /** 202 again: still pending, nothing changed. */
  | 'pending'
  /** Anything else (404, 5xx, another status, a timeout, a reset, an answer over maxResponseBytes): nothing changed. */
  | 'unknown'
  /** The Location is not on the upstream's origin (or not a URL): never requested, nothing changed. */
  | 'refused-location'
  /** The poll could not be made, or the store failed: nothing changed. */
  | 'error';

/**
 * The interim answer a `202` with a `Location` is on an `asyncReply` route,
 * or null (another status, no Location: an ordinary answer). Its Location is
 * kept resolved against the URL the request was sent to, so that a poll
 * (which has no request path) and a replay mean the same resource the
 * upstream named. The other headers are the route's `replayHeaders`.
 */
export function interimOf(route: RouteConfig, result: UpstreamResult, requestPath: string): StoredResponse | null {
  if (route.asyncReply === undefined || result.kind !== 'response' || result.status !== 202) return null;
  const locations = result.headers.filter(([n]) => n.toLowerCase() === 'location');
  if (locations.length !== 1) return null;
  let location: string;
  try {
    location = new URL(locations[0]![1].trim(), joinUrl(route.upstream, requestPath)).href;
  } catch {
    return null;
  }
  const keep = new Set(route.replayHeaders.map((h) => h.toLowerCase()));
  const headers: [string, string][] = result.headers.filter(([n]) => keep.has(n.toLowerCase()) && n.toLowerCase() !== 'location');
  headers.push(['location', location]);
  return { status: 202, headers, body: result.body };
}

/** The finish of an interim answer: the record stays outcome_unknown, keeping it for `maxAge`. */
export function interimFinish(base: Omit<FinishInput, 'outcome'>, interim: StoredResponse, asyncReply: AsyncReplyConfig): FinishInput {
  return Object.assign({}, base, { outcome: 'unknown' as const, interim, interimRetentionMs: asyncReply.maxAge });
}

/**
 * `url` when it is on the upstream's own origin (scheme, host and port),
 * without credentials in it; else null. The poll is a request the gateway
 * makes on the upstream's word: a Location naming another host (a cloud
 * metadata address, an internal service) must never be fetched (SSRF).
 */
export function sameOrigin(upstream: string, url: string, base?: string): URL | null {
  let u: URL;
  try {
    u = base === undefined ? new URL(url) : new URL(url, base);
  } catch {
    return null;
  }
  if (u.origin !== new URL(upstream).origin || u.username !== '' || u.password !== '') return null;
  u.hash = '';
  return u;
}

export interface AsyncPollTarget {
  route: AsyncRoute;
  scope: string;
  key: string;
  createdAt: Date;
  interim: StoredResponse;
}

export interface AsyncPollDeps {
  store: GatewayStore;
  forwarder: Forwarder;
  logger: Logger;
  /** Resolved `upstreamHeaders` per route name: the poll carries the route's own credentials. */
  upstreamHeaders: Map<string, Record<string, string>>;
}

/**
 * Polls the interim answer's Location once within `timeoutMs` and, on a
 * final answer, completes the record of this attempt with it. What is final:
 * another 2xx than 202 (the status monitor's answer is the outcome); a 303
 * See Other is followed once (its Location on the same origin too) and its
 * 2xx answer is final. A 202 is still pending; anything else (404, 410,
 * another 3xx or 4xx, 5xx, a timeout, a reset, a body over
 * maxResponseBytes) settles nothing. Never throws.
 */
export function createAsyncPoll(deps: AsyncPollDeps) {
  const { store, forwarder, logger } = deps;
  return async function poll(t: AsyncPollTarget, timeoutMs: number, requestId: string = newRequestId()): Promise<PollResult> {
    const { route } = t;
    const done = (result: PollResult, status?: number): PollResult => {
      // Ids and statuses only: never the Location, which may carry the key.
      logger.info('async-poll', { request_id: requestId, route: route.name, idempotency_key: t.key, result, ...(status !== undefined ? { status } : {}) });
      return result;
    };
    const deadline = performance.now() + Math.max(1, timeoutMs);
    const location = t.interim.headers.find(([n]) => n.toLowerCase() === 'location')?.[1];
    const first = location === undefined ? null : sameOrigin(route.upstream, location);
    if (first === null) {
      logger.warn('async-location-refused', { request_id: requestId, route: route.name, idempotency_key: t.key });
      return done('refused-location');
    }
    const get = async (url: URL): Promise<UpstreamResult> =>
      forwarder.forward({
        url: url.href,
        method: 'GET',
        headers: { ...(deps.upstreamHeaders.get(route.name) ?? {}), 'x-request-id': requestId },
        body: null,
        timeoutMs: Math.max(1, Math.floor(deadline - performance.now())),
        maxResponseBytes: route.maxResponseBytes,
      });
    let answer: UpstreamResult;
    try {
      answer = await get(first);
      if (answer.kind === 'response' && answer.status === 303) {
        const next = answer.headers.find(([n]) => n.toLowerCase() === 'location')?.[1];
        const to = next === undefined ? null : sameOrigin(route.upstream, next, first.href);
        if (to === null) {
          logger.warn('async-location-refused', { request_id: requestId, route: route.name, idempotency_key: t.key });
          return done('refused-location', 303);
        }
        // Followed once: a second 303 is not final.
        answer = await get(to);
        if (answer.kind === 'response' && (answer.status === 202 || answer.status === 303)) return done('unknown', answer.status);
      }
    } catch (err) {
      logger.error('async-poll-error', { request_id: requestId, route: route.name, error: errorText(err) });
      return done('error');
    }
    if (answer.kind !== 'response') return done(answer.kind === 'refused' ? 'error' : 'unknown');
    if (answer.status === 202) return done('pending', 202);
    if (answer.status < 200 || answer.status > 299) return done('unknown', answer.status);
    if (stillPending(route.asyncReply.pending, answer.body)) return done('pending', answer.status);
    const keep = new Set(route.replayHeaders.map((h) => h.toLowerCase()));
    const headers: [string, string][] = answer.headers.filter(([n]) => keep.has(n.toLowerCase()) && n.toLowerCase() !== RECONCILED_HEADER);
    headers.push([RECONCILED_HEADER, 'true']);
    const response: StoredResponse = { status: answer.status, headers, body: answer.body };
    try {
      // Refused only when the record is no longer this attempt's (settled meanwhile): final either way.
      await store.resolveRecord({
        scope: t.scope,
        key: t.key,
        createdAt: t.createdAt,
        operator: RECONCILER,
        requestId,
        resolution: { outcome: 'completed', response, retentionMs: route.retention },
        note: `async reply: the Location answered ${answer.status}`,
      });
    } catch (err) {
      logger.error('async-poll-error', { request_id: requestId, route: route.name, error: errorText(err) });
      return done('error');
    }
    return done('final', answer.status);
  };
}

export type AsyncPoll = ReturnType<typeof createAsyncPoll>;

/** The interim answer an admission carries (the store's `outcome-unknown` with `interim`), or null. */
export function interimOfAdmission(admitted: Admitted | null): StoredResponse | null {
  if (admitted === null || admitted.admission.outcome !== 'outcome-unknown') return null;
  return admitted.admission.interim ?? null;
}

/**
 * The inline step: a retry on an `asyncReply` route whose admission answered
 * outcome-unknown with an interim answer polls the Location once, within the
 * route's `maxWaitMs`; a final answer settles the record and the admission
 * is decided again (a replay of it). Otherwise the admission stands, and the
 * pipeline replays the interim 202.
 */
export function createAsyncReplyStage(deps: { store: GatewayStore; poll: AsyncPoll; admit: (x: Exchange, command: Command) => Promise<Admitted | null> }) {
  const { store, poll, admit } = deps;
  return async function asyncReply(x: Exchange, command: Command, admitted: Admitted): Promise<Admitted | null> {
    const route = x.route!;
    const interim = interimOfAdmission(admitted);
    if (route.asyncReply === undefined || interim === null || command.key === null || route.maxWaitMs <= 0 || x.req.signal.aborted) return admitted;
    let createdAt: Date;
    try {
      const record = (await store.getRecords(command.key)).find((r) => r.scope === admitted.input.scope && r.state === 'outcome_unknown');
      // Settled between the admission and this read: decide again.
      if (record === undefined) return admit(x, command);
      createdAt = record.createdAt;
    } catch {
      return admitted;
    }
    const result = await poll({ route: route as AsyncRoute, scope: admitted.input.scope, key: command.key, createdAt, interim }, route.maxWaitMs, x.requestId);
    x.trace.reconcile = `async-${result}`;
    return result === 'final' ? admit(x, command) : admitted;
  };
}

/**
 * Whether a 2xx answer of the status monitor says the job still runs
 * (`asyncReply.pending`, a JSON pointer and the value it holds then): such
 * an answer is not the outcome. An answer that is not JSON, or holds
 * another value, is final.
 */
export function stillPending(pending: AsyncReplyConfig['pending'], body: Uint8Array): boolean {
  if (pending === undefined) return false;
  let doc: unknown;
  try {
    doc = JSON.parse(new TextDecoder().decode(body));
  } catch {
    return false;
  }
  return valueAtPointer(doc, tokensOf(pending.pointer)) === pending.equals;
}
