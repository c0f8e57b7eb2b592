import type { RouteConfig } from '../../config/schema.js';
import { START_DEADLINE_PASSED, type Forwarder, type StreamedAnswer, type UpstreamRequest, type UpstreamResult } from '../forward.js';
import { forwardBudget, lockSafetyMs } from '../lock-budget.js';
import { errorText, type Logger } from '../logger.js';
import { upstreamAttributes } from '../tracing.js';
import { joinUrl, upstreamHeaders, type UpstreamHeaderDeps } from '../upstream-request.js';
import type { Admitted } from './admit.js';
import type { Codec, Command } from './codec.js';
import { roundMs, type Exchange } from './exchange.js';

// Stage 7 of the decision order (DESIGN §3.6): the request the upstream
// gets, only while the admission's lock lives. The caller's disconnect does
// not cancel it: the outcome is stored so that its retry with the same key
// gets the replay.

export interface Forwarded {
  result: UpstreamResult | StreamedAnswer;
  /** The deadline the forward had: the route's, or less when the lock left less. */
  timeoutMs: number;
}

export interface ForwardDeps extends UpstreamHeaderDeps {
  forwarder: Forwarder;
  logger: Logger;
}

export function createForwardStage(deps: ForwardDeps) {
  const send = createSender(deps);
  return async function forward<S>(x: Exchange, codec: Codec<S>, command: Command, admitted: Admitted, body: Uint8Array): Promise<Forwarded> {
    const route = x.route!;
    const { input, sentAt } = admitted;
    // Only while the admission's lock lives (../lock-budget.ts): a request
    // delayed past it could land after a newer owner's (G1, G3).
    const locked = command.key !== null || (command.entity !== null && route.mode === 'serial');
    const budget = locked
      ? forwardBudget({ sentAt, lockMs: input.lockMs, safetyMs: lockSafetyMs(route.lockMarginMs), routeTimeoutMs: route.timeoutMs, now: performance.now() })
      : { timeoutMs: route.timeoutMs, startBy: undefined };
    x.upstreamStarted = performance.now();
    if (budget === null) {
      x.trace.upstream_ms = roundMs(performance.now() - x.upstreamStarted);
      return { result: { kind: 'refused', error: START_DEADLINE_PASSED }, timeoutMs: route.timeoutMs };
    }
    const request: UpstreamRequest = {
      url: joinUrl(route.upstream, x.pathname + x.search),
      method: x.req.method,
      headers: codec.upstreamHeaders(upstreamHeaders(x.req.headers, route, deps, { requestId: x.requestId, entity: command.entity, fence: command.fence })),
      body: body.byteLength > 0 ? body : null,
      timeoutMs: budget.timeoutMs,
      maxResponseBytes: route.maxResponseBytes,
      ...(budget.startBy !== undefined ? { startBy: budget.startBy } : {}),
    };
    x.sent = { url: request.url, headers: request.headers };
    return { result: await send(x, route, request, codec.streamIf), timeoutMs: budget.timeoutMs };
  };
}

/**
 * Sends one upstream request, decided or passed undecided (./pass.ts), in a
 * `fencegate.forward` span whose context the upstream gets as
 * `traceparent`. A forwarder fault after admission means the request may
 * have left, so the only honest outcome is unknown (G4: still exactly one
 * outcome). The time at the upstream goes on the log line.
 */
export function createSender(deps: { forwarder: Forwarder; logger: Logger }) {
  const { forwarder, logger } = deps;
  return async function send(
    x: Exchange,
    route: RouteConfig,
    request: UpstreamRequest,
    streamIf?: (status: number, headers: [string, string][]) => boolean,
  ): Promise<UpstreamResult | StreamedAnswer> {
    const span = x.span.phase('fencegate.forward', { 'http.request.method': request.method, 'url.path': x.trace.path });
    span.inject(request.headers);
    x.upstreamStarted = performance.now();
    let result: UpstreamResult | StreamedAnswer;
    try {
      result =
        streamIf !== undefined && forwarder.forwardStreaming !== undefined
          ? await forwarder.forwardStreaming(request, streamIf)
          : await forwarder.forward(request);
    } catch (err) {
      logger.error('forward-error', { request_id: x.requestId, route: route.name, error: errorText(err) });
      result = { kind: 'unknown', error: 'forwarder-error', timedOut: false };
    }
    span.end(upstreamAttributes(result));
    // For an answer still streaming, the time to its head; a decided call's reader sets it again at the end.
    x.trace.upstream_ms = roundMs(performance.now() - x.upstreamStarted);
    return result;
  };
}
