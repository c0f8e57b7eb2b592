import type { Config, RouteConfig } from '../config/schema.js';
import { bodyDigest, fingerprint, sha256Hex } from '../core/fingerprint.js';
import type { Refusal } from '../protocol/problem.js';
import type { Admission, AdmitInput, AuditInfo, GatewayStore } from '../store/types.js';
import { admissionRefusal, admitWithWaits, routeAdmission, storeEntity } from './admit.js';
import { readBody } from './body.js';
import type { Inbound, Reply } from './inbound.js';
import { entityFromJson, keyFromJson, parseCommand } from './command.js';
import { credentialBindingOf, echoKey, keyScopeOf, warnGlobalKeys, type CredentialHashing } from './key-scope.js';
import { renderRefusal, toReply } from './errors.js';
import { START_DEADLINE_PASSED, type Forwarder, type UpstreamResult } from './forward.js';
import { errorText, type Logger } from './logger.js';
import { bodyMethodProblem, requestShapeProblem } from './request-shape.js';
import { requestIds } from './request-id.js';
import { MAX_READING_CHARS, normalizePath, readingsWithin } from './path.js';
import { createFoldedRouter, createRouter, divergentReading } from './router.js';
import { cutText, REJECTION_TEXT_LIMITS } from '../store/bounds.js';
import type { SignedFenceCheck } from './signed-fence.js';
import { forwardBudget, lockSafetyMs } from './lock-budget.js';
import { finishOf, finishWithRetries, responseFrom, setHeader, settle } from './settle.js';
import { joinUrl, upstreamHeaders } from './upstream-request.js';
import { createMcpHandler } from './mcp/pipeline.js';
import { logRefusal, presentedHeader } from './refusal-log.js';
import { startRequestSpan, upstreamAttributes } from './tracing.js';


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
  /** How the credentials the upstream sees enter key scopes (./key-scope.ts credentialScopeOf). */
  credentialHashing: CredentialHashing;
  /** With `fence.signed`: verifies the fence JWS (and logs its refusal); the header is then never read as an integer. */
  checkSignedFence?: SignedFenceCheck;
  /** Called once per answered request (metrics). */
  observe?: (o: { route: string | null; decision: string; status: number; totalMs: number; upstreamMs: number | undefined; tool?: string }) => void;
}

/** Per-decision log line (DESIGN §3.11: ids, codes, durations; no bodies). */
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

/**
 * The proxied request, in the decision order of DESIGN §3: route, headers,
 * body and fingerprint, one-transaction admission, forward, owner-token
 * conditional finish. Refusals never reach the upstream and, before the
 * admission, change no state.
 */
export function createProxyHandler(deps: ProxyDeps) {
  const router = createRouter(deps.config.routes);
  const folded = createFoldedRouter(deps.config.routes);
  const mcp = createMcpHandler(deps);
  const { store, logger } = deps;
  warnGlobalKeys(deps.config, logger);

  return async function proxy(req: Inbound): Promise<Reply> {
    const started = performance.now();
    // Routed, fingerprinted and forwarded in normal form (./path.ts): an
    // encoding never picks the route. The query is never logged or stored
    // (tokens travel in it); only the fingerprint and the forward carry it.
    const url = { pathname: normalizePath(req.pathname), search: req.search };
    // The gateway's own id, always: a caller's X-Request-Id is kept beside it
    // (audit.clientRequestId), so no caller chooses the id its rows are filed under.
    const { requestId, clientRequestId } = requestIds(req);
    // The path is cut for the log as for the rejection log: any caller can send a 16 KB one.
    const trace: Trace = { request_id: requestId, ...(clientRequestId !== null ? { client_request_id: clientRequestId } : {}), route: null, method: req.method, path: cutText(url.pathname, REJECTION_TEXT_LIMITS.path) };
    const span = startRequestSpan(req.headers, req.method, trace.path, requestId);
    const done = (res: Reply, decision: string): Reply => {
      setHeader(res, 'x-request-id', requestId);
      span.end(trace, decision, res.status);
      const totalMs = round(performance.now() - started);
      // The trace itself, completed: done runs once per request and nothing
      // reads the trace after it, so no copy (the same fields, in the same order).
      const line: Trace & { total_ms?: number } = trace;
      line.decision = decision;
      line.status = res.status;
      line.total_ms = totalMs;
      logger.info('decision', line as unknown as Record<string, unknown>);
      deps.observe?.({ route: trace.route, decision, status: res.status, totalMs, upstreamMs: trace.upstream_ms });
      return res;
    };
    const refuse = async (route: RouteConfig | null, refusal: Refusal): Promise<Reply> => {
      // A malformed or missing fence, entity or key goes to the rejection log too (./refusal-log.ts, DESIGN §3.11).
      if (route !== null) await logRefusal(deps, refusal, { requestId, clientRequestId, caller: req.caller, method: req.method, path: url.pathname, payloadSha256: '' }, presentedHeader(route, refusal.code, req.headers));
      // Object.assign, not a spread and a property: the same object without V8's slow path (./settle.ts finishOf).
      refusal.extras = Object.assign({}, refusal.extras, { request_id: requestId });
      return done(toReply(renderRefusal(refusal, route?.errors ?? null, deps.problemBase)), refusal.code);
    };

    // 1. Route.
    const matched = isAdminPath(url.pathname, deps.config.adminPrefix) ? null : router(req.method, url.pathname);
    if (matched === null) return refuse(null, { code: 'no-route', detail: `no route for ${req.method} ${trace.path}` });
    const { route } = matched;
    trace.route = route.name;
    //    One route decision per path: refused when an upstream could read it
    //    another way that routes elsewhere (`%2F`, `%5C`, `%252F`, `;params`,
    //    `a./`, `ſ`, `//`, ./path.ts READINGS).
    //    Within a bound of work (./path.ts MAX_READING_CHARS): a long path
    //    with every kind of ambiguity would cost tens of milliseconds.
    const readings = readingsWithin(url.pathname);
    if (readings === null) {
      return refuse(route, {
        code: 'invalid-request',
        detail: `the path is ${url.pathname.length} characters long and can be read in too many ways (encoded or raw separators, a second decoding, path parameters, trailing dots or spaces, Unicode folding, repeated slashes) for the gateway to check them all within its bound of ${MAX_READING_CHARS} characters; send it shorter or in one unambiguous form`,
      });
    }
    const divergent = divergentReading(router, req.method, matched, readings, folded, url.pathname);
    if (divergent !== null) {
      return refuse(route, {
        code: 'invalid-request',
        detail: `the path can also be read as ${JSON.stringify(divergent.slice(0, 256))} (an encoded or raw separator, a second decoding, path parameters, trailing dots or spaces, Unicode folding, repeated slashes, case), which another route (or other parameters) would take; send it in one unambiguous form`,
      });
    }

    // 3. Headers (2, caller auth, runs as middleware before this handler).
    //    First what the HTTP parser let through but the upstream would read otherwise.
    const shape = requestShapeProblem(req.headers, url.pathname, url.search, route);
    if (shape !== null) return refuse(route, { code: 'invalid-request', detail: shape });
    // An MCP endpoint: JSON-RPC in the body, only tools/call decided (./mcp/pipeline.ts).
    if (route.protocol === 'mcp') return mcp({ req, route, params: matched.params, pathname: url.pathname, search: url.search, requestId, clientRequestId, trace: { ...trace }, started, span });
    const parsed = parseCommand(route, req.headers, matched.params, { signedFences: deps.checkSignedFence !== undefined, claims: req.claims ?? null });
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
    //    A method override in the body (Rails, Symfony and Laravel read one), as in the query (step 3).
    const bodyMethod = bodyMethodProblem(req.method, req.headers.get('content-type'), body, route, req.headers.get('content-encoding'));
    if (bodyMethod !== null) return refuse(route, { code: 'invalid-request', detail: bodyMethod });
    if ('json' in route.entity) {
      const fromBody = entityFromJson(route.entity.json, body);
      if (!fromBody.ok) return refuse(route, fromBody.refusal);
      entity = fromBody.entity;
    }
    const bodyKey = keyFromJson(route, key, body);
    if (!bodyKey.ok) return refuse(route, bodyKey.refusal);
    key = bodyKey.key;
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
    // The credentials the upstream sees bind the record, in its fingerprint or its scope (./key-scope.ts credentialBindingOf).
    const credentials = credentialBindingOf(route, req.headers, deps.credentialHashing);
    const input: AdmitInput = {
      scope: keyScopeOf(route, caller, parsed.command.keyScope, credentials.scope),
      key,
      entity: storeEntity(entity, caller, deps.config),
      fence,
      // With the entity and the credentials: the same key for another entity, or from another caller, is 422, never their replay.
      fingerprint: fingerprint(req.method, pathAndQuery, req.headers.get('content-type') ?? '', bodyDigest(route.fingerprint, body, payloadSha256, req.headers.get('content-type') ?? ''), entity, credentials.fingerprint),
      ...routeAdmission(route),
      audit,
    };

    // 5. Admission, re-run after bounded waits (serial slot; Prefer: wait).
    let admission: Admission;
    let admissionSentAt: number;
    const admitSpan = span.phase('fencegate.admit');
    try {
      ({ admission, sentAt: admissionSentAt } = await admitWithWaits(store, input, route, req));
      admitSpan.end({ 'fencegate.admission': admission.outcome, 'fencegate.takeover': admission.outcome === 'forward' && admission.takeover });
    } catch (err) {
      admitSpan.end({ 'fencegate.admission': 'store-error' }, err);
      logger.error('store-error', { request_id: requestId, route: route.name, phase: 'admit', error: errorText(err) });
      return refuse(route, { code: 'store-unavailable', detail: 'the gateway could not reach its store; nothing was sent upstream' });
    }

    if (admission.outcome === 'replay') {
      const res = responseFrom(admission.response, null);
      setHeader(res, 'idempotent-replayed', 'true');
      echoKey(res, route, key);
      return done(res, 'replayed');
    }
    if (admission.outcome !== 'forward') return refuse(route, admissionRefusal(admission, { fence, key, entity }));

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
      const forwardSpan = span.phase('fencegate.forward', { 'http.request.method': req.method, 'url.path': trace.path });
      try {
        result = await deps.forwarder.forward({
          url: joinUrl(route.upstream, pathAndQuery),
          method: req.method,
          headers: forwardSpan.inject(upstreamHeaders(req.headers, route, deps, { requestId, entity, fence })),
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
      forwardSpan.end(upstreamAttributes(result));
    }
    trace.upstream_ms = round(performance.now() - upstreamStarted);

    if (result.kind === 'refused' && result.error === START_DEADLINE_PASSED) {
      // Nothing was sent: release the record and the slot (conditional on the
      // owner token, so a takeover that already happened is left alone). A
      // record this request took over from outcome_unknown goes back to
      // outcome_unknown: the earlier attempt's outcome is as unknown as before,
      // and its fingerprint must keep refusing another payload under the key.
      logger.warn('forward-abandoned', { request_id: requestId, route: route.name, idempotency_key: key, waited_ms: round(performance.now() - admissionSentAt), lock_ms: input.lockMs });
      await finishWithRetries(store, finishOf(base, { outcome: admission.takeover ? 'unknown' : 'released' }), logger, requestId, lockEnds);
      return refuse(route, {
        code: 'admission-expired',
        detail: `the gateway was delayed for longer than this request's ${input.lockMs} ms lock between its admission and the upstream; nothing was sent, retry with the same key is safe`,
        extras: { entity, presented_fence: fence?.toString() ?? null, idempotency_key: key, retry_after: 1 },
      });
    }

    // 7. Finish, conditional on the owner token.
    const { finish, response, decision } = settle(result, route, base, deps.problemBase, requestId, budget?.timeoutMs ?? route.timeoutMs);
    const finishSpan = span.phase('fencegate.finish', { 'fencegate.finish': finish.outcome });
    const recorded = await finishWithRetries(store, finish, logger, requestId, lockEnds);
    finishSpan.end({ 'fencegate.recorded': recorded === null ? 'store-error' : recorded });
    if (recorded === false) logger.warn('late-finish-discarded', { request_id: requestId, route: route.name, idempotency_key: key });
    echoKey(response, route, key);
    return done(response, admission.takeover ? `${decision}-after-takeover` : decision);
  };
}

/** Under `adminPrefix` (the path itself, or below it): the admin API's, never proxied. */
function isAdminPath(path: string, adminPrefix: string): boolean {
  return path === adminPrefix || path.startsWith(`${adminPrefix}/`);
}

function describeEntity(route: RouteConfig): string {
  if ('header' in route.entity) return `header ${route.entity.header}`;
  if ('path' in route.entity) return `path parameter ${route.entity.path}`;
  return `body field ${route.entity.json}`;
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}

