import type { RouteConfig } from '../../config/schema.js';
import { renderMcpRefusal, REFUSAL_HEADER, type JsonRpcId } from '../../protocol/mcp.js';
import type { Refusal } from '../../protocol/problem.js';
import type { FinishInput, StoredResponse } from '../../store/types.js';
import { connectionTokens, isHopByHop, type UpstreamResult } from '../forward.js';
import type { Reply } from '../inbound.js';
import { eventsOf, isResponseTo, parseData, roleIn } from './stream.js';

// Step 7 for a tools/call (DESIGN §3.7 as docs/mcp.md "What is stored"
// reads it): what the upstream's answer means for the record, and what the
// caller is told. The stored answer is the JSON-RPC response alone, as
// application/json: never the session's headers, never the event stream.

const encoder = new TextEncoder();

export type Base = Omit<FinishInput, 'outcome'>;

export interface Settled {
  finish: FinishInput;
  reply: Reply;
  decision: string;
}

/** A refusal as the caller's answer: a JSON-RPC error to `id` (docs/mcp.md "Error codes"). */
export function refusalReply(refusal: Refusal, id: JsonRpcId, requestId: string, options: { httpStatus?: boolean; rpcCode?: number } = {}): Reply {
  const rendered = renderMcpRefusal({ ...refusal, extras: { ...refusal.extras, request_id: requestId } }, id, options);
  return { status: rendered.status, headers: Object.entries(rendered.headers), body: rendered.body };
}

/** The upstream's answer as it came, hop-by-hop fields dropped. */
export function passthrough(status: number, headers: [string, string][], body: Reply['body'] | ReadableStream<Uint8Array>): Reply {
  const conn = connectionTokens(headers.find(([n]) => n.toLowerCase() === 'connection')?.[1]);
  const kept = headers.filter(([n]) => !isHopByHop(n, conn)).map(([n, v]): [string, string] => [n.toLowerCase(), v]);
  return body instanceof ReadableStream ? { status, headers: kept, body: null, stream: body } : { status, headers: kept, body };
}

/** The record of a JSON-RPC response (its exact text) to keep for replay. */
export function storedMessage(data: string): StoredResponse {
  return { status: 200, headers: [['content-type', 'application/json']], body: encoder.encode(data) };
}

/**
 * The upstream's answer to a tools/call, read whole (JSON, or an event
 * stream a forwarder could not stream). Released (nothing ran): a status in
 * `releaseStatuses`, and a transport refusal (`transportRefusal`). Completed
 * (stored): a 200 that holds the JSON-RPC response to the call, a tool
 * result with `isError: true` included (the tool ran), and any other 4xx, as
 * a plain route stores one (a proxy's 408 or 499 may come after the tool
 * ran). Anything else (a 5xx, a 2xx without the response) leaves the
 * outcome unknown; the caller gets the upstream's answer as it came.
 */
export function settleBuffered(
  result: Extract<UpstreamResult, { kind: 'response' }>,
  call: { id: JsonRpcId },
  route: RouteConfig,
  base: Base,
  limit: number,
): Settled {
  const reply = passthrough(result.status, result.headers, result.status === 204 ? null : result.body);
  if (route.releaseStatuses.includes(result.status) || transportRefusal(result.status, result.headers, result.body)) {
    return { finish: { ...base, outcome: 'released' }, reply, decision: 'forwarded-released' };
  }
  if (result.status >= 400 && result.status < 500) {
    const kept = result.headers.filter(([n]) => ['content-type', 'content-encoding'].includes(n.toLowerCase()));
    const stored: StoredResponse = { status: result.status, headers: kept.map(([n, v]) => [n.toLowerCase(), v]), body: result.body };
    return { finish: { ...base, outcome: 'completed', response: stored, retentionMs: route.retention }, reply, decision: 'forwarded' };
  }
  // An encoded answer (an upstream that ignored `Accept-Encoding: identity`) cannot be read: the outcome is unknown.
  if (result.status !== 200 || isEncoded(result.headers)) return { finish: { ...base, outcome: 'unknown' }, reply, decision: 'upstream-no-response' };
  const found = responseIn(result.headers, result.body, call.id, limit);
  if (found === null) {
    // Readable, but no response to the call in it (none, or one to another id): that is never handed on as the call's answer.
    const refusal: Refusal = {
      code: 'upstream-timeout',
      detail:
        'the upstream answered 200 without a JSON-RPC response to this call (none, or one to another id) after the call may have reached the tool; the outcome is unknown',
    };
    return { finish: { ...base, outcome: 'unknown' }, reply: refusalReply(refusal, call.id, base.audit.requestId), decision: 'upstream-no-response' };
  }
  // An event stream read whole: passed on without the responses that are not the call's answer (./stream.ts roleIn).
  if (found.body !== null) reply.body = found.body;
  return { finish: { ...base, outcome: 'completed', response: storedMessage(found.data), retentionMs: route.retention }, reply, decision: 'forwarded' };
}

/** The statuses a Streamable HTTP transport refuses a message with before reading it (bad headers, unknown session, wrong method or media type). */
const TRANSPORT_STATUSES = new Set([400, 404, 405, 406, 415]);

/**
 * An answer that proves the message was not processed: one of
 * TRANSPORT_STATUSES with no body, or with a JSON-RPC error whose id is null
 * (the transport could not tie it to the call, so no tool ran; a server that
 * ran the call answers to its id).
 */
export function transportRefusal(status: number, headers: [string, string][], body: Uint8Array): boolean {
  if (!TRANSPORT_STATUSES.has(status)) return false;
  if (body.byteLength === 0) return true;
  if (isEncoded(headers)) return false;
  const msg = parseData(new TextDecoder().decode(body));
  return msg !== null && typeof msg === 'object' && !Array.isArray(msg) && 'error' in msg && (msg as { id?: unknown }).id === null;
}

/**
 * The text of the JSON-RPC response to `id` in a whole answer body, or null.
 * For an event stream also the body to pass on when it held responses that
 * are not the answer (`body`; null: the body as it came), as a streamed
 * answer drops them (./stream.ts pump).
 */
function responseIn(headers: [string, string][], body: Uint8Array, id: JsonRpcId, limit: number): { data: string; body: string | null } | null {
  if (isEventStream(headers)) {
    const events = eventsOf(body, limit) ?? [];
    // One parse of each event's data, for both uses below.
    const roles = events.map((e) => roleIn(e, id));
    const answer = events[roles.indexOf('answer')];
    if (answer === undefined) return null;
    const kept = events.filter((_, i) => roles[i] !== 'foreign');
    return { data: answer.data!, body: kept.length === events.length ? null : kept.map((e) => e.raw).join('') };
  }
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(body);
  } catch {
    return null;
  }
  return isResponseTo(parseData(text), id) ? { data: text, body: null } : null;
}

/**
 * The upstream acted (it answered) but its answer passed maxResponseBytes:
 * the refusal itself becomes the key's answer, as on plain routes
 * (../plain/outcome.ts), so no retry runs the tool again.
 */
export function tooLargeAnswer(status: number, limit: number, call: { id: JsonRpcId }, requestId: string): { stored: StoredResponse; json: string } {
  const reply = refusalReply(
    {
      code: 'upstream-response-too-large',
      detail: `the tool ran (the upstream answered ${status}), but its answer exceeded this route's maxResponseBytes of ${limit} bytes and was not kept; do not retry blindly (a retry with this key gets this same answer), check the outcome with the upstream`,
      extras: { upstream_status: status, max_response_bytes: limit },
    },
    call.id,
    requestId,
  );
  const json = reply.body as string;
  return {
    stored: {
      status: 200,
      headers: [
        ['content-type', 'application/json'],
        [REFUSAL_HEADER, 'upstream-response-too-large'],
      ],
      body: encoder.encode(json),
    },
    json,
  };
}

/**
 * A stored answer for a retry: the same response under the retry's own
 * JSON-RPC id (a client matches answers by id), as application/json, marked
 * replayed. A stored body that is not a JSON-RPC response (a record an
 * operator resolved by hand) is returned as it is.
 */
export function replayReply(stored: StoredResponse, id: JsonRpcId): Reply {
  const text = new TextDecoder().decode(stored.body);
  const message = parseData(text);
  let body: string | Uint8Array = stored.body;
  if (message !== null && typeof message === 'object' && !Array.isArray(message) && ('result' in message || 'error' in message)) {
    body = JSON.stringify({ ...(message as Record<string, unknown>), id });
  }
  const headers: [string, string][] = stored.headers.map(([n, v]) => [n.toLowerCase(), v]);
  headers.push(['idempotent-replayed', 'true']);
  return { status: stored.status, headers, body };
}

/**
 * The upstream request's headers on an mcp route, with `Accept-Encoding:
 * identity`: the gateway reads the answer to a call (the JSON-RPC response,
 * the event stream's events) and the forwarder does not decode, so a
 * caller's `gzip` would leave it a body it cannot read (docs/mcp.md).
 */
export function mcpUpstreamHeaders(headers: Record<string, string>): Record<string, string> {
  for (const name of Object.keys(headers)) if (name.toLowerCase() === 'accept-encoding') delete headers[name];
  headers['accept-encoding'] = 'identity';
  return headers;
}

/** An answer with a content coding other than identity: its bytes are not the JSON-RPC text. */
export function isEncoded(headers: [string, string][]): boolean {
  return headers.some(([n, v]) => n.toLowerCase() === 'content-encoding' && v.split(',').some((c) => c.trim().toLowerCase() !== 'identity' && c.trim() !== ''));
}

export function isEventStream(headers: [string, string][]): boolean {
  const ct = headers.find(([n]) => n.toLowerCase() === 'content-type')?.[1] ?? '';
  return ct.split(';')[0]!.trim().toLowerCase() === 'text/event-stream';
}
