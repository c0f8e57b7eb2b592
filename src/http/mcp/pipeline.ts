import type { RouteConfig } from '../../config/schema.js';
import { readBody } from '../body.js';
import type { StreamedAnswer, UpstreamResult } from '../forward.js';
import type { Inbound, Reply } from '../inbound.js';
import { errorText } from '../logger.js';
import type { ProxyDeps } from '../proxy.js';
import { setHeader } from '../settle.js';
import type { RequestSpan } from '../tracing.js';
import { joinUrl, upstreamHeaders } from '../upstream-request.js';
import { decideCall } from './call.js';
import type { JsonRpcId } from '../../protocol/mcp.js';
import { readMessage } from './message.js';
import { isEventStream, mcpUpstreamHeaders, passthrough, refusalReply } from './outcome.js';
import { ToolAnnotations, toolPolicy } from './policy.js';
import { SseSplitter } from './sse.js';
import { eventsOf, isResponseTo, messageOf, parseData } from './stream.js';

/** What ../proxy.ts has decided of a request on an mcp route when it hands it over. */
export interface McpRequest {
  req: Inbound;
  route: RouteConfig;
  params: Record<string, string>;
  /** Normal form (../path.ts); the query as sent. */
  pathname: string;
  search: string;
  requestId: string;
  clientRequestId: string | null;
  /** The proxy's log line so far (request id, route, method, path). */
  trace: Record<string, unknown>;
  started: number;
  /** The request's span (../tracing.ts), ended with the decision. */
  span?: RequestSpan;
}

/**
 * The pipeline of an mcp route (docs/mcp.md). Only a `tools/call` of a tool
 * that is not read-only is decided (./call.ts); every other message, the
 * server's event stream (GET) and the session's end (DELETE) pass through
 * as they came, both ways, and nothing of them is stored. The route learns
 * its tools' `readOnlyHint`s from the `tools/list` answers that pass, per
 * endpoint (path and query) as the call's decision reads them.
 */
export function createMcpHandler(deps: ProxyDeps) {
  const annotations = new ToolAnnotations();

  return async function mcp(m: McpRequest): Promise<Reply> {
    const { req, route, requestId } = m;
    const trace: Record<string, unknown> = { ...m.trace };
    let toolLabel: string | undefined;
    const done = (reply: Reply, decision: string): Reply => {
      const totalMs = Math.round((performance.now() - m.started) * 100) / 100;
      deps.logger.info('decision', { ...trace, decision, status: reply.status, total_ms: totalMs });
      m.span?.end(trace, decision, reply.status);
      deps.observe?.({ route: route.name, decision, status: reply.status, totalMs, upstreamMs: trace.upstream_ms as number | undefined, ...(toolLabel !== undefined ? { tool: toolLabel } : {}) });
      return reply;
    };
    const answer = (reply: Reply): Reply => {
      setHeader(reply, 'x-request-id', requestId);
      return reply;
    };

    const read = await readBody(req, route.maxBodyBytes, req.incoming);
    // A GET or DELETE has no JSON-RPC request to answer: its refusals keep their HTTP status.
    const httpStatus = req.method !== 'POST';
    if (!read.ok) {
      const refusal =
        'aborted' in read
          ? ({ code: 'invalid-request', detail: 'the request body ended before its end (the client went away)' } as const)
          : ({ code: 'payload-too-large', detail: `the body exceeds this route's limit of ${route.maxBodyBytes} bytes` } as const);
      return answer(done(refusalReply(refusal, null, requestId, { httpStatus }), refusal.code));
    }
    if (req.method !== 'POST') {
      // A GET or DELETE carries no JSON-RPC message: a body on one would reach the upstream undecided (a tools/call smuggled past the decision).
      if (read.body.byteLength > 0) {
        const refusal = { code: 'invalid-request', detail: `a ${req.method} to an mcp route carries no body; send JSON-RPC messages as POST` } as const;
        return answer(done(refusalReply(refusal, null, requestId, { httpStatus }), refusal.code));
      }
      return answer(await pass(m, read.body, null, null, done, trace));
    }

    const message = readMessage(read.body);
    if (message.kind === 'refused') {
      return answer(done(refusalReply(message.refusal, message.id, requestId, message.rpcCode !== undefined ? { rpcCode: message.rpcCode } : {}), message.refusal.code));
    }
    if (message.kind === 'pass') return answer(await pass(m, read.body, message.id, message.listId, done, trace));

    // A name the config lists or the upstream's list had, else one label for all: the metric's labels stay bounded.
    // What the upstream's lists taught is per endpoint: this path and query, where this call goes (./policy.ts).
    const endpoint = m.pathname + m.search;
    toolLabel = route.tools[message.name] !== undefined || annotations.known(route.name, endpoint, message.name) ? message.name : '_unlisted';
    trace.tool = message.name.slice(0, 128);
    const policy = toolPolicy(route, message.name, annotations, endpoint);
    if (policy.readOnly) {
      trace.read_only = policy.readOnlyFrom;
      return answer(await pass(m, read.body, message.id, null, done, trace, 'passed-read-only'));
    }
    return answer(
      await decideCall(deps, message, policy, {
        req,
        body: read.body,
        requestId,
        clientRequestId: m.clientRequestId,
        pathname: m.pathname,
        search: m.search,
        params: m.params,
        trace,
        done,
      }),
    );
  };

  /**
   * Forwards a message that is not decided, and answers what the upstream
   * answered: an event stream as it comes (with no deadline past its head:
   * a GET stream lives as long as the session), anything else read whole.
   * A `tools/list` answer (`listId`) is read on the way for annotations.
   * A refusal answers the message's `id` (null for a GET, a DELETE, a batch).
   */
  async function pass(m: McpRequest, body: Uint8Array, id: JsonRpcId, listId: string | number | null, done: (r: Reply, d: string) => Reply, trace: Record<string, unknown>, decision = 'passed'): Promise<Reply> {
    const { req, route, requestId } = m;
    if (req.method === 'GET' && deps.forwarder.forwardStreaming === undefined) {
      // Read whole, the server's stream would hang until the deadline: say there is none (MCP lets a server answer 405 here).
      const body = JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message: 'this gateway cannot stream; no server event stream on GET' } });
      return done({ status: 405, headers: [['allow', 'POST, DELETE'], ['content-type', 'application/json']], body }, 'passed');
    }
    const request = {
      url: joinUrl(route.upstream, m.pathname + m.search),
      method: req.method,
      headers: mcpUpstreamHeaders(upstreamHeaders(req.headers, route, deps, { requestId, entity: null, fence: null })),
      body: body.byteLength > 0 ? body : null,
      timeoutMs: route.timeoutMs,
      maxResponseBytes: route.maxResponseBytes,
      passThrough: true,
    };
    const started = performance.now();
    let result: UpstreamResult | StreamedAnswer;
    try {
      result = deps.forwarder.forwardStreaming
        ? await deps.forwarder.forwardStreaming(request, (_status, headers) => isEventStream(headers))
        : await deps.forwarder.forward(request);
    } catch (err) {
      deps.logger.error('forward-error', { request_id: requestId, route: route.name, error: errorText(err) });
      result = { kind: 'unknown', error: 'forwarder-error', timedOut: false };
    }
    trace.upstream_ms = Math.round((performance.now() - started) * 100) / 100;
    const httpStatus = req.method !== 'POST';
    switch (result.kind) {
      case 'stream': {
        const stream = listId === null ? result.body : learning(result.body, route, m.pathname + m.search, listId);
        return done(passthrough(result.status, result.headers, stream), decision);
      }
      case 'response':
        if (listId !== null && result.status === 200) learnFrom(result.headers, result.body, route, m.pathname + m.search, listId);
        return done(passthrough(result.status, result.headers, result.status === 204 ? null : result.body), decision);
      case 'refused':
        return done(refusalReply({ code: 'upstream-unavailable', detail: `the message could not be sent to the upstream (${result.error}); nothing was sent` }, id, requestId, { httpStatus }), 'upstream-unavailable');
      case 'unknown':
        return done(refusalReply({ code: 'upstream-timeout', detail: `no complete answer from the upstream (${result.error})` }, id, requestId, { httpStatus }), 'upstream-timeout');
      case 'too-large':
        return done(
          refusalReply({ code: 'upstream-response-too-large', detail: `the upstream's answer exceeded this route's maxResponseBytes of ${result.limit} bytes`, extras: { upstream_status: result.status } }, id, requestId, { httpStatus }),
          'upstream-response-too-large',
        );
    }
  }

  /** The stream as it came, byte for byte, read on the way for the `tools/list` response. */
  function learning(body: ReadableStream<Uint8Array>, route: RouteConfig, endpoint: string, listId: string | number): ReadableStream<Uint8Array> {
    let splitter: SseSplitter | null = new SseSplitter(route.maxResponseBytes);
    return body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, controller) {
          controller.enqueue(chunk);
          const events = splitter?.push(chunk) ?? null;
          if (events === null) splitter = null;
          for (const e of events ?? []) {
            const msg = messageOf(e);
            if (isResponseTo(msg, listId)) annotations.learn(route.name, endpoint, (msg as { result?: unknown }).result);
          }
        },
      }),
    );
  }

  function learnFrom(headers: [string, string][], body: Uint8Array, route: RouteConfig, endpoint: string, listId: string | number): void {
    const messages = isEventStream(headers) ? (eventsOf(body, route.maxResponseBytes) ?? []).map((e) => messageOf(e)) : [parseData(new TextDecoder().decode(body))];
    for (const msg of messages) if (isResponseTo(msg, listId)) annotations.learn(route.name, endpoint, (msg as { result?: unknown }).result);
  }
}
