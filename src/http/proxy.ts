import { randomUUID } from 'node:crypto';
import type { Config, RouteConfig } from '../config/schema.js';
import { fingerprint, sha256Hex } from '../core/fingerprint.js';
import { parsePreferWait } from '../protocol/headers.js';
import { retryAfterSeconds, type Refusal } from '../protocol/problem.js';
import { entityTopic, recordTopic, type Admission, type AdmitInput, type AuditInfo, type FinishInput, type GatewayStore, type StoredResponse } from '../store/types.js';
import { readBody } from './body.js';
import type { HeaderReader, Inbound, Reply } from './inbound.js';
import { entityFromJson, parseCommand } from './command.js';
import { renderRefusal, toReply } from './errors.js';
import { connectionTokens, isHopByHop, START_DEADLINE_PASSED, type Forwarder, type UpstreamResult } from './forward.js';
import type { Logger } from './logger.js';
import { requestShapeProblem } from './request-shape.js';
import { alternativeReadings, normalizePath } from './path.js';
import { createFoldedRouter, createRouter, divergentReading } from './router.js';
import { cutText, REJECTION_TEXT_LIMITS } from '../store/bounds.js';
import type { SignedFenceCheck } from './signed-fence.js';
import { forwardBudget, lockSafetyMs } from './lock-budget.js';


export interface ProxyDeps {
  config: Config;
  store: GatewayStore;
  forwarder: Forwarder;
  logger: Logger;
  problemBase: string;
  /** Resolved `upstreamHeaders` per route name (secrets read from the environment at start-up). */
  upstreamHeaders: Map<string, Record<string, string>>;
  /** Strip the caller's `Authorization` (it authenticates to the gateway, not the upstream). */
  stripAuthorization: boolean;
  /** With `fence.signed`: verifies the fence JWS (and logs its refusal); the header is then never read as an integer. */
  checkSignedFence?: SignedFenceCheck;
  /** Called once per answered request (metrics). */
  observe?: (o: { route: string | null; decision: string; status: number; totalMs: number; upstreamMs: number | undefined }) => void;
}

/** Per-decision log line (DESIGN: ids, codes, durations; no bodies). */
interface Trace {
  request_id: string;
  /** The caller's X-Request-Id, when it sent a well-formed one. */
  client_request_id?: string;
  route: string | null;
  method: string;
  path: string;
  entity?: string | null;
  fence?: string | null;
  idempotency_key?: string | null;
  decision?: string;
  status?: number;
  upstream_ms?: number;
}

const REQUEST_ID = /^[A-Za-z0-9._:@-]{1,128}$/;

/**
 * The proxied request, in the decision order of DESIGN §3: route, headers,
 * body and fingerprint, one-transaction admission, forward, owner-token
 * conditional finish. Refusals never reach the upstream and, before the
 * admission, change no state.
 */
export function createProxyHandler(deps: ProxyDeps) {
  const router = createRouter(deps.config.routes);
  const folded = createFoldedRouter(deps.config.routes);
  const { store, logger } = deps;

  return async function proxy(req: Inbound): Promise<Reply> {
    const started = performance.now();
    // Routed, fingerprinted and forwarded in normal form (./path.ts): an
    // encoding never picks the route. The query is never logged or stored
    // (tokens travel in it); only the fingerprint and the forward carry it.
    const url = { pathname: normalizePath(req.pathname), search: req.search };
    // The gateway's own id, always: a caller's X-Request-Id is kept beside it
    // (audit.clientRequestId), so no caller chooses the id its rows are filed under.
    const requestId = randomUUID();
    const given = req.headers.get('x-request-id');
    const clientRequestId = given !== null && REQUEST_ID.test(given) ? given : null;
    // The path is cut for the log as for the rejection log: any caller can send a 16 KB one.
    const trace: Trace = { request_id: requestId, ...(clientRequestId !== null ? { client_request_id: clientRequestId } : {}), route: null, method: req.method, path: cutText(url.pathname, REJECTION_TEXT_LIMITS.path) };
    const done = (res: Reply, decision: string): Reply => {
      setHeader(res, 'x-request-id', requestId);
      const totalMs = round(performance.now() - started);
      logger.info('decision', { ...trace, decision, status: res.status, total_ms: totalMs });
      deps.observe?.({ route: trace.route, decision, status: res.status, totalMs, upstreamMs: trace.upstream_ms });
      return res;
    };
    const refuse = (route: RouteConfig | null, refusal: Refusal): Reply => {
      refusal.extras = { ...refusal.extras, request_id: requestId };
      return done(toReply(renderRefusal(refusal, route?.errors ?? null, deps.problemBase)), refusal.code);
    };

    // 1. Route.
    const matched = isAdminPath(url.pathname, deps.config.adminPrefix) ? null : router(req.method, url.pathname);
    if (matched === null) return refuse(null, { code: 'no-route', detail: `no route for ${req.method} ${trace.path}` });
    const { route } = matched;
    trace.route = route.name;
    //    One route decision per path: refused when an upstream could read it
    //    another way that routes elsewhere (`%2F`, `%5C`, `;params`, `//`).
    const divergent = divergentReading(router, req.method, matched, alternativeReadings(url.pathname), folded, url.pathname);
    if (divergent !== null) {
      return refuse(route, {
        code: 'invalid-request',
        detail: `the path can also be read as ${JSON.stringify(divergent.slice(0, 256))} (an encoded or raw separator, path parameters or repeated slashes), which another route (or other parameters) would take; send it in one unambiguous form`,
      });
    }

    // 3. Headers (2, caller auth, runs as middleware before this handler).
    //    First what the HTTP parser let through but the upstream would read otherwise.
    const shape = requestShapeProblem(req.headers, url.pathname);
    if (shape !== null) return refuse(route, { code: 'invalid-request', detail: shape });
    const parsed = parseCommand(route, req.headers, matched.params, { signedFences: deps.checkSignedFence !== undefined });
    if (!parsed.ok) return refuse(route, parsed.refusal);
    let { fence, key, entity } = parsed.command;
    const { signedFence } = parsed.command;

    // 4. Body, up to the route's limit, and the fingerprint.
    const read = await readBody(req, route.maxBodyBytes, req.incoming);
    if (!read.ok) {
      if ('aborted' in read) return refuse(route, { code: 'invalid-request', detail: 'the request body ended before its end (the client went away)' });
      return refuse(route, { code: 'payload-too-large', detail: `the body exceeds this route's limit of ${route.maxBodyBytes} bytes` });
    }
    const body = read.body;
    if ('json' in route.entity) {
      const fromBody = entityFromJson(route.entity.json, body);
      if (!fromBody.ok) return refuse(route, fromBody.refusal);
      entity = fromBody.entity;
    }
    if (entity === null && (fence !== null || signedFence !== null || route.fence === 'required')) {
      return refuse(route, { code: 'missing-entity', detail: `a fence needs an entity (${describeEntity(route)})` });
    }
    Object.assign(trace, { entity, fence: fence?.toString() ?? null, idempotency_key: key });

    const pathAndQuery = url.pathname + url.search;
    const { caller } = req;
    const payloadSha256 = sha256Hex(body);
    const audit: AuditInfo = { requestId, clientRequestId, caller, method: req.method, path: url.pathname, payloadSha256 };
    // 3, signed fences (DESIGN §7): checked once the entity is known, refusals logged.
    if (signedFence !== null && deps.checkSignedFence !== undefined) {
      const checked = await deps.checkSignedFence(signedFence, entity!, { audit, idempotencyKey: key });
      if (!checked.ok) return refuse(route, checked.refusal);
      fence = checked.fence;
      trace.fence = fence.toString();
    }
    const input: AdmitInput = {
      scope: caller === null ? route.name : `${route.name}\u0000${caller}`,
      key,
      entity: storeEntity(entity, caller, deps.config),
      fence,
      // With the entity: the same key for another entity is 422, never that entity's replay.
      fingerprint: fingerprint(req.method, pathAndQuery, req.headers.get('content-type') ?? '', payloadSha256, entity),
      mode: route.mode,
      ownerToken: randomUUID(),
      lockMs: route.timeoutMs + route.lockMarginMs,
      retentionMs: route.retention,
      onUnknown: route.onUnknown,
      audit,
    };

    // 5. Admission, re-run after bounded waits (serial slot; Prefer: wait).
    let admission: Admission;
    let admissionSentAt: number;
    try {
      ({ admission, sentAt: admissionSentAt } = await admitWithWaits(store, input, route, req));
    } catch (err) {
      logger.error('store-error', { request_id: requestId, route: route.name, phase: 'admit', error: errorText(err) });
      return refuse(route, { code: 'store-unavailable', detail: 'the gateway could not reach its store; nothing was sent upstream' });
    }

    const fenceExtras = { entity, presented_fence: fence?.toString() ?? null };
    switch (admission.outcome) {
      case 'stale-fence':
        return refuse(route, {
          code: 'stale-fence',
          detail: `fence ${fence} is older than fence ${admission.currentFence} already accepted for this entity`,
          extras: { ...fenceExtras, current_fence: admission.currentFence.toString() },
        });
      case 'idempotency-key-reused':
        return refuse(route, { code: 'idempotency-key-reused', detail: 'this idempotency key was used for a different request (method, path, content type or body differ)', extras: { idempotency_key: key } });
      case 'idempotency-in-progress': {
        const retry_after = retryAfterSeconds(admission.retryAfterMs);
        return refuse(route, { code: 'idempotency-in-progress', detail: 'a request with this idempotency key is still in progress; retry later or send Prefer: wait=N', extras: { idempotency_key: key, retry_after } });
      }
      case 'outcome-unknown':
        return refuse(route, { code: 'outcome-unknown', detail: 'an earlier attempt with this key may have reached the upstream; it needs an operator or an upstream check, not a blind retry', extras: { idempotency_key: key } });
      case 'entity-busy': {
        const retry_after = retryAfterSeconds(admission.retryAfterMs);
        return refuse(route, { code: 'entity-busy', detail: 'another request for this entity is in flight (serial mode)', extras: { entity, retry_after } });
      }
      case 'replay': {
        const res = responseFrom(admission.response, null);
        setHeader(res, 'idempotent-replayed', 'true');
        return done(res, 'replayed');
      }
      case 'forward':
        break;
    }

    // 6. Forward. The caller's disconnect does not cancel this: the outcome
    //    is stored so that its retry with the same key gets the replay.
    //    Only while the admission's lock lives (./lock-budget.ts): a request
    //    delayed past it could land after a newer owner's (G1, G3).
    const lockEnds = admissionSentAt + input.lockMs;
    const locked = key !== null || (entity !== null && route.mode === 'serial');
    const budget = locked
      ? forwardBudget({ sentAt: admissionSentAt, lockMs: input.lockMs, safetyMs: lockSafetyMs(route.lockMarginMs), routeTimeoutMs: route.timeoutMs, now: performance.now() })
      : { timeoutMs: route.timeoutMs, startBy: undefined };
    const base = { scope: input.scope, key, entity: input.entity, ownerToken: input.ownerToken, audit };
    const upstreamStarted = performance.now();
    let result: UpstreamResult;
    if (budget === null) {
      result = { kind: 'refused', error: START_DEADLINE_PASSED };
    } else {
      try {
        result = await deps.forwarder.forward({
          url: joinUrl(route.upstream, pathAndQuery),
          method: req.method,
          headers: upstreamHeaders(req.headers, route, deps, { requestId, entity, fence }),
          body: body.byteLength > 0 ? body : null,
          timeoutMs: budget.timeoutMs,
          maxResponseBytes: route.maxResponseBytes,
          ...(budget.startBy !== undefined ? { startBy: budget.startBy } : {}),
        });
      } catch (err) {
        // A forwarder fault after admission: the request may have left, so the
        // only honest outcome is unknown (G4: still exactly one outcome).
        logger.error('forward-error', { request_id: requestId, route: route.name, error: errorText(err) });
        result = { kind: 'unknown', error: 'forwarder-error', timedOut: false };
      }
    }
    trace.upstream_ms = round(performance.now() - upstreamStarted);

    if (result.kind === 'refused' && result.error === START_DEADLINE_PASSED) {
      // Nothing was sent: release the record and the slot (conditional on the
      // owner token, so a takeover that already happened is left alone). A
      // record this request took over from outcome_unknown goes back to
      // outcome_unknown: the earlier attempt's outcome is as unknown as before,
      // and its fingerprint must keep refusing another payload under the key.
      logger.warn('forward-abandoned', { request_id: requestId, route: route.name, idempotency_key: key, waited_ms: round(performance.now() - admissionSentAt), lock_ms: input.lockMs });
      await finishWithRetries(store, { ...base, outcome: admission.takeover ? 'unknown' : 'released' }, logger, requestId, lockEnds);
      return refuse(route, {
        code: 'admission-expired',
        detail: `the gateway was delayed for longer than this request's ${input.lockMs} ms lock between its admission and the upstream; nothing was sent, retry with the same key is safe`,
        extras: { ...fenceExtras, idempotency_key: key, retry_after: 1 },
      });
    }

    // 7. Finish, conditional on the owner token.
    const { finish, response, decision } = settle(result, route, base, deps.problemBase, requestId, budget?.timeoutMs ?? route.timeoutMs);
    const recorded = await finishWithRetries(store, finish, logger, requestId, lockEnds);
    if (recorded === false) logger.warn('late-finish-discarded', { request_id: requestId, route: route.name, idempotency_key: key });
    return done(response, admission.takeover ? `${decision}-after-takeover` : decision);
  };
}

/**
 * The entity as the store keeps its fence and serial slot. With
 * `fence.entityScope: "caller"` it is the caller id, NUL, then the entity:
 * each authenticated caller has fences of its own, so a caller presenting an
 * unsigned giant fence locks only its own view of the entity (DESIGN §2 G1
 * then holds per caller). Entities are printable ASCII (no NUL), so the last
 * NUL splits the pair unambiguously whatever the caller id holds. The
 * upstream, the answers and the signed-fence check keep the entity as sent.
 */
export function storeEntity(entity: string | null, caller: string | null, config: Config): string | null {
  if (entity === null || caller === null || config.fence.entityScope !== 'caller') return entity;
  return `${caller}\u0000${entity}`;
}

/**
 * The admission, and `sentAt`: `performance.now()` just before the call whose
 * answer this is was sent. The lock it granted is measured from there
 * (./lock-budget.ts); a time taken after the await would miss the pause.
 */
async function admitWithWaits(store: GatewayStore, input: AdmitInput, route: RouteConfig, req: Inbound): Promise<{ admission: Admission; sentAt: number }> {
  const start = Date.now();
  const preferWait = parsePreferWait(req.headers.get('prefer') ?? undefined);
  const keyWaitMs = preferWait === null ? 0 : Math.min(preferWait * 1000, route.maxWaitMs);
  for (;;) {
    const sentAt = performance.now();
    const admission = await store.admit(input);
    const waited = Date.now() - start;
    let topic: string | null = null;
    let budget = 0;
    if (admission.outcome === 'entity-busy' && input.entity !== null) {
      topic = entityTopic(input.entity);
      budget = route.serialWaitMs - waited;
    } else if (admission.outcome === 'idempotency-in-progress' && input.key !== null) {
      topic = recordTopic(input.scope, input.key);
      budget = keyWaitMs - waited;
    }
    // A caller that has gone away stops waiting: nothing was admitted for it.
    if (topic === null || budget <= 0 || req.signal.aborted) return { admission, sentAt };
    await store.waitForChange(topic, budget, req.signal);
  }
}

function settle(
  result: UpstreamResult,
  route: RouteConfig,
  base: Omit<FinishInput, 'outcome'>,
  problemBase: string,
  requestId: string,
  /** The deadline the forward had: the route's, or less when the lock left less. */
  timeoutMs: number,
): { finish: FinishInput; response: Reply; decision: string } {
  const problem = (refusal: Refusal) => toReply(renderRefusal({ ...refusal, extras: { ...refusal.extras, request_id: requestId } }, route.errors, problemBase));
  switch (result.kind) {
    case 'response': {
      const passthrough = responseFrom({ status: result.status, headers: result.headers, body: result.body }, 'hop-by-hop');
      if (route.releaseStatuses.includes(result.status)) {
        // 429 / 503 and the like mean "not processed": safe to retry.
        return { finish: { ...base, outcome: 'released' }, response: passthrough, decision: 'forwarded-released' };
      }
      const keep = new Set(route.replayHeaders.map((h) => h.toLowerCase()));
      const stored: StoredResponse = { status: result.status, headers: result.headers.filter(([n]) => keep.has(n.toLowerCase())), body: result.body };
      return { finish: { ...base, outcome: 'completed', response: stored, retentionMs: route.retention }, response: passthrough, decision: 'forwarded' };
    }
    case 'refused':
      return {
        finish: { ...base, outcome: 'released' },
        response: problem({ code: 'upstream-unavailable', detail: `the request could not be sent to the upstream (${result.error}); nothing was sent, retry with the same key is safe` }),
        decision: 'upstream-unavailable',
      };
    case 'unknown':
      return {
        finish: { ...base, outcome: 'unknown' },
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
        return { finish: { ...base, outcome: 'released' }, response: refusal, decision: 'upstream-response-too-large-released' };
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
        finish: { ...base, outcome: 'completed', response: stored, retentionMs: route.retention },
        response: responseFrom(stored, null),
        decision: 'upstream-response-too-large',
      };
    }
  }
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
async function finishWithRetries(store: GatewayStore, finish: FinishInput, logger: Logger, requestId: string, lockEnds: number): Promise<boolean | null> {
  const delays = [50, 200, 500, 1000];
  // performance.now(): lockEnds is measured on the monotonic clock.
  const giveUpAt = Math.max(lockEnds, performance.now() + 1_250);
  for (let attempt = 0; ; attempt++) {
    try {
      return (await store.finish(finish)).recorded;
    } catch (err) {
      const left = giveUpAt - performance.now();
      if (left <= 0) {
        logger.error('store-error', { request_id: requestId, phase: 'finish', outcome: finish.outcome, attempts: attempt + 1, error: errorText(err) });
        return null;
      }
      // The last attempt falls on the deadline itself.
      await new Promise((r) => setTimeout(r, Math.min(delays[Math.min(attempt, delays.length - 1)]!, left)));
    }
  }
}

function upstreamHeaders(
  incoming: HeaderReader,
  route: RouteConfig,
  deps: ProxyDeps,
  command: { requestId: string; entity: string | null; fence: bigint | null },
): Record<string, string> {
  // `Connection` may not strip what the gateway decided with (../http/forward.ts connectionTokens).
  const conn = connectionTokens(incoming.get('connection'), reliedOn(route));
  const strip = new Set(route.stripHeaders.map((h) => h.toLowerCase()));
  if (deps.stripAuthorization) strip.add('authorization');
  const out: Record<string, string> = {};
  incoming.forEach((value, name) => {
    if (isHopByHop(name, conn) || strip.has(name)) return;
    out[name] = value;
  });
  // Pass the fencing context on, so a cooperating upstream can check it too.
  if (command.entity !== null) out['x-fence-entity'] = command.entity;
  if (command.fence !== null) out[route.fenceHeader.toLowerCase()] = command.fence.toString();
  out['x-request-id'] = command.requestId;
  for (const [name, value] of Object.entries(deps.upstreamHeaders.get(route.name) ?? {})) out[name.toLowerCase()] = value;
  return out;
}

function responseFrom(stored: StoredResponse, filter: 'hop-by-hop' | null): Reply {
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
function setHeader(reply: Reply, name: string, value: string): void {
  reply.headers = reply.headers.filter(([n]) => n !== name);
  reply.headers.push([name, value]);
}

/** Request fields the decision used (or the upstream needs to check it): end-to-end, whatever `Connection` lists. */
function reliedOn(route: RouteConfig): string[] {
  const names = ['content-type', 'content-encoding', 'x-fence-entity', 'x-request-id', route.fenceHeader, route.idempotencyHeader];
  if ('header' in route.entity) names.push(route.entity.header);
  return names;
}

/** Under `adminPrefix` (the path itself, or below it): the admin API's, never proxied. */
function isAdminPath(path: string, adminPrefix: string): boolean {
  return path === adminPrefix || path.startsWith(`${adminPrefix}/`);
}

/** `http://up:9000/base` + `/payments/x?y=1` → `http://up:9000/base/payments/x?y=1`. */
function joinUrl(upstream: string, pathAndQuery: string): string {
  return upstream.replace(/\/+$/, '') + pathAndQuery;
}

function describeEntity(route: RouteConfig): string {
  if ('header' in route.entity) return `header ${route.entity.header}`;
  if ('path' in route.entity) return `path parameter ${route.entity.path}`;
  return `body field ${route.entity.json}`;
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}

export function errorText(err: unknown): string {
  return err instanceof Error ? `${err.name}: ${err.message}` : String(err);
}
