import { fingerprint, sha256Hex } from '../../core/fingerprint.js';
import type { Refusal } from '../../protocol/problem.js';
import type { Admission, AdmitInput, AuditInfo } from '../../store/types.js';
import { admissionRefusal, admitWithWaits, routeAdmission, storeEntity } from '../admit.js';
import { START_DEADLINE_PASSED, type StreamedAnswer, type UpstreamResult } from '../forward.js';
import type { Inbound, Reply } from '../inbound.js';
import { forwardBudget, lockSafetyMs } from '../lock-budget.js';
import { errorText } from '../logger.js';
import type { ProxyDeps } from '../proxy.js';
import { finishWithRetries } from '../settle.js';
import { joinUrl, upstreamHeaders } from '../upstream-request.js';
import { credentialBindingOf, keyScopeOf } from '../key-scope.js';
import { logRefusal } from '../refusal-log.js';
import { parseToolCommand, presentedInCall } from './command.js';
import type { ToolCall } from './message.js';
import { isEncoded, isEventStream, mcpUpstreamHeaders, passthrough, refusalReply, replayReply, settleBuffered, storedMessage, tooLargeAnswer, type Base, type Settled } from './outcome.js';
import type { ToolPolicy } from './policy.js';
import { CallerStream, pump, sseMessage } from './stream.js';

/** What the pipeline hands a decided call: the request and how to end its log line. */
export interface CallContext {
  req: Inbound;
  body: Uint8Array;
  requestId: string;
  clientRequestId: string | null;
  pathname: string;
  search: string;
  params: Record<string, string>;
  trace: Record<string, unknown>;
  /** Logs the decision line and counts it; returns `reply`. */
  done(reply: Reply, decision: string): Reply;
}

/**
 * A side-effecting tools/call, in the decision order of DESIGN §3 with the
 * call in place of the request: fence, key and entity (./command.ts), the
 * fingerprint (tool name and canonical arguments), the store's one
 * admission, the forward, the owner-token finish. Refusals are JSON-RPC
 * errors to the call's id and never reach the upstream.
 */
export async function decideCall(deps: ProxyDeps, call: ToolCall, policy: ToolPolicy, ctx: CallContext): Promise<Reply> {
  const { store, logger } = deps;
  const route = policy.route;
  const { req, requestId } = ctx;
  const { caller } = req;
  // The tool goes into every rejection row of the call (DESIGN §4), the store's and the log hook's.
  const audit: AuditInfo = { requestId, clientRequestId: ctx.clientRequestId, caller, method: req.method, path: ctx.pathname, payloadSha256: sha256Hex(ctx.body), tool: call.name };
  const refuse = async (refusal: Refusal) => {
    // A malformed or missing fence, entity or key is logged as on plain routes (../refusal-log.ts).
    await logRefusal(deps, refusal, audit, presentedInCall(route, call, refusal.code, req.headers));
    return ctx.done(refusalReply(refusal, call.id, requestId), refusal.code);
  };

  const parsed = parseToolCommand(route, call, req.headers, ctx.params, { signedFences: deps.checkSignedFence !== undefined });
  if (!parsed.ok) return refuse(parsed.refusal);
  let { fence } = parsed.command;
  const { signedFence, key, entity } = parsed.command;
  if (entity === null && (fence !== null || signedFence !== null || route.fence === 'required')) {
    return refuse({ code: 'missing-entity', detail: `a fence needs an entity (_meta["io.fencegate/entity"]${'json' in route.entity ? ` or params${route.entity.json}` : ''})` });
  }
  Object.assign(ctx.trace, { entity, fence: fence?.toString() ?? null, idempotency_key: key });

  if (signedFence !== null && deps.checkSignedFence !== undefined) {
    const checked = await deps.checkSignedFence(signedFence, entity!, { audit, idempotencyKey: key });
    if (!checked.ok) return refuse(checked.refusal);
    fence = checked.fence;
    ctx.trace.fence = fence.toString();
  }
  const tool = `mcp:${call.name}`;
  // The credentials the MCP server sees bind the record as on plain routes (../key-scope.ts credentialBindingOf):
  // it tells its clients apart by them; by default in the fingerprint, so a refreshed OAuth token's retry is 422, not a second call.
  const credentials = credentialBindingOf(route, req.headers, deps.credentialHashing);
  const input: AdmitInput = {
    // Per route and tool (and caller), not per session: a retry on a new session gets the stored answer.
    // And per path: on a `/mcp/*` route `/mcp/tenant-a` and `/mcp/tenant-b` are two endpoints, so two key spaces.
    scope: `${keyScopeOf(route, caller, null, credentials.scope)}\u0000${tool}\u0000path:${ctx.pathname}`,
    key,
    entity: storeEntity(entity, caller, deps.config),
    fence,
    // The path and query as a plain route's (../proxy.ts), the tool and its arguments as written;
    // not the JSON-RPC id, not _meta (progress tokens, the fence), not the session; the credentials with the default binding.
    fingerprint: fingerprint('POST', ctx.pathname + ctx.search, 'application/json', sha256Hex(new TextEncoder().encode(`${tool}\u0000${call.argsDigest}`)), entity, credentials.fingerprint),
    ...routeAdmission(route),
    audit,
  };

  let admission: Admission;
  let sentAt: number;
  try {
    ({ admission, sentAt } = await admitWithWaits(store, input, route, req));
  } catch (err) {
    logger.error('store-error', { request_id: requestId, route: route.name, phase: 'admit', error: errorText(err) });
    return refuse({ code: 'store-unavailable', detail: 'the gateway could not reach its store; nothing was sent upstream' });
  }
  if (admission.outcome === 'replay') return ctx.done(replayReply(admission.response, call.id), 'replayed');
  if (admission.outcome !== 'forward') return refuse(admissionRefusal(admission, { fence, key, entity }));

  const lockEnds = sentAt + input.lockMs;
  const locked = key !== null || (entity !== null && route.mode === 'serial');
  const budget = locked
    ? forwardBudget({ sentAt, lockMs: input.lockMs, safetyMs: lockSafetyMs(route.lockMarginMs), routeTimeoutMs: route.timeoutMs, now: performance.now() })
    : { timeoutMs: route.timeoutMs, startBy: undefined };
  const base: Base = { scope: input.scope, key, entity: input.entity, ownerToken: input.ownerToken, audit };
  const record = async (s: Settled): Promise<Reply> => {
    const recorded = await finishWithRetries(store, s.finish, logger, requestId, lockEnds);
    if (recorded === false) logger.warn('late-finish-discarded', { request_id: requestId, route: route.name, idempotency_key: key });
    return ctx.done(s.reply, admission.takeover ? `${s.decision}-after-takeover` : s.decision);
  };

  const upstreamStarted = performance.now();
  let result: UpstreamResult | StreamedAnswer;
  if (budget === null) {
    result = { kind: 'refused', error: START_DEADLINE_PASSED };
  } else {
    const request = {
      url: joinUrl(route.upstream, ctx.pathname + ctx.search),
      method: req.method,
      headers: mcpUpstreamHeaders(upstreamHeaders(req.headers, route, deps, { requestId, entity, fence })),
      body: ctx.body,
      timeoutMs: budget.timeoutMs,
      maxResponseBytes: route.maxResponseBytes,
      ...(budget.startBy !== undefined ? { startBy: budget.startBy } : {}),
    };
    try {
      result = deps.forwarder.forwardStreaming
        ? await deps.forwarder.forwardStreaming(request, (status, headers) => status === 200 && isEventStream(headers) && !isEncoded(headers))
        : await deps.forwarder.forward(request);
    } catch (err) {
      logger.error('forward-error', { request_id: requestId, route: route.name, error: errorText(err) });
      result = { kind: 'unknown', error: 'forwarder-error', timedOut: false };
    }
  }
  const timeoutMs = budget?.timeoutMs ?? route.timeoutMs;
  const upstreamMs = () => (ctx.trace.upstream_ms = Math.round((performance.now() - upstreamStarted) * 100) / 100);
  const answer = (s: Omit<Settled, 'reply'>, refusal: Refusal) => ({ ...s, reply: refusalReply(refusal, call.id, requestId) });

  switch (result.kind) {
    case 'stream':
      return streamed(result);
    case 'response':
      upstreamMs();
      return record(settleBuffered(result, call, route, base, route.maxResponseBytes));
    case 'refused': {
      upstreamMs();
      if (result.error === START_DEADLINE_PASSED) {
        // Nothing was sent (as in ../proxy.ts): released, or back to outcome_unknown after a takeover.
        const s = answer(
          { finish: { ...base, outcome: admission.takeover ? 'unknown' : 'released' }, decision: 'admission-expired' },
          { code: 'admission-expired', detail: `the gateway was delayed past this call's ${input.lockMs} ms lock before the upstream; nothing was sent, retry with the same key is safe`, extras: { entity, idempotency_key: key, retry_after: 1 } },
        );
        return record(s);
      }
      return record(answer({ finish: { ...base, outcome: 'released' }, decision: 'upstream-unavailable' }, { code: 'upstream-unavailable', detail: `the call could not be sent to the upstream (${result.error}); nothing was sent, retry with the same key is safe` }));
    }
    case 'unknown':
      upstreamMs();
      return record(answer({ finish: { ...base, outcome: 'unknown' }, decision: 'upstream-timeout' }, unknownRefusal(result.timedOut, result.error, timeoutMs)));
    case 'too-large': {
      upstreamMs();
      if (route.releaseStatuses.includes(result.status)) {
        return record(answer({ finish: { ...base, outcome: 'released' }, decision: 'upstream-response-too-large-released' }, { code: 'upstream-response-too-large', detail: `the upstream answered ${result.status} (not processed) with a body over maxResponseBytes; the key was released, a retry is safe` }));
      }
      const { stored, json } = tooLargeAnswer(result.status, result.limit, call, requestId);
      return record({ finish: { ...base, outcome: 'completed', response: stored, retentionMs: route.retention }, reply: { status: 200, headers: stored.headers.slice(), body: json }, decision: 'upstream-response-too-large' });
    }
  }

  /**
   * An event stream: its head and events go to the caller now; the call's
   * response is recorded first and forwarded then; the log line and the
   * in-flight count wait for that (`Reply.settled`).
   */
  function streamed(answer: StreamedAnswer): Reply {
    const caller = new CallerStream(route.maxResponseBytes);
    const left = Math.max(1, timeoutMs - (performance.now() - upstreamStarted));
    const head = passthrough(answer.status, answer.headers, caller.stream);
    const settled = (async () => {
      const end = await pump(answer.body, call.id, { limit: route.maxResponseBytes, timeoutMs: left, forward: (e) => caller.send(e.raw) });
      upstreamMs();
      let s: Omit<Settled, 'reply'>;
      let last: string;
      if (end.kind === 'final') {
        s = { finish: { ...base, outcome: 'completed', response: storedMessage(end.data), retentionMs: route.retention }, decision: 'forwarded' };
        last = end.event.raw;
      } else if (end.kind === 'too-large') {
        const { stored, json } = tooLargeAnswer(answer.status, route.maxResponseBytes, call, requestId);
        s = { finish: { ...base, outcome: 'completed', response: stored, retentionMs: route.retention }, decision: 'upstream-response-too-large' };
        last = sseMessage(json);
      } else {
        s = { finish: { ...base, outcome: 'unknown' }, decision: 'upstream-timeout' };
        last = sseMessage(refusalReply(unknownRefusal(end.timedOut, end.error, timeoutMs), call.id, requestId).body as string);
      }
      await record({ ...s, reply: { status: head.status, headers: head.headers, body: null } });
      caller.send(last);
      caller.close();
    })().catch((err) => {
      logger.error('mcp-stream-error', { request_id: requestId, route: route.name, error: errorText(err) });
      caller.close();
    });
    return { ...head, settled };
  }
}

function unknownRefusal(timedOut: boolean, error: string, timeoutMs: number): Refusal {
  return {
    code: 'upstream-timeout',
    detail: `${timedOut ? `no answer to the call within ${timeoutMs} ms` : `the connection failed (${error})`} after the call may have reached the tool; the outcome is unknown`,
  };
}
