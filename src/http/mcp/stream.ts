import type { JsonRpcId } from '../../protocol/mcp.js';
import { SseSplitter, type SseEvent } from './sse.js';

// An MCP server's event stream for one request (Streamable HTTP, POST
// answered with text/event-stream): its events go to the caller as they
// come (progress notifications), and the JSON-RPC response to the request
// is picked out of it.

const encoder = new TextEncoder();

/**
 * The caller's side of a streamed answer. Never slows the reading of the
 * upstream: a caller that has gone away (or reads so slowly that `maxQueued`
 * bytes wait for it) is dropped, and the upstream is read on, so that the
 * call's outcome is recorded whatever the caller does (G4).
 */
export class CallerStream {
  readonly stream: ReadableStream<Uint8Array>;
  private controller!: ReadableStreamDefaultController<Uint8Array>;
  private gone = false;

  constructor(private readonly maxQueued: number) {
    this.stream = new ReadableStream<Uint8Array>(
      {
        start: (c) => void (this.controller = c),
        cancel: () => void (this.gone = true),
      },
      { highWaterMark: 0, size: (chunk) => chunk.byteLength },
    );
  }

  send(text: string): void {
    if (this.gone) return;
    const bytes = encoder.encode(text);
    if ((this.controller.desiredSize ?? 0) < -this.maxQueued) {
      this.gone = true;
      this.controller.error(new Error('the caller reads too slowly'));
      return;
    }
    this.controller.enqueue(bytes);
  }

  close(): void {
    if (this.gone) return;
    this.gone = true;
    try {
      this.controller.close();
    } catch {
      // Cancelled meanwhile.
    }
  }
}

export type PumpEnd =
  /** The response to the request arrived: its exact text (`data`) and the whole event. */
  | { kind: 'final'; data: string; event: SseEvent }
  /** One event passed `limit` characters (the answer is not kept). */
  | { kind: 'too-large' }
  /** The stream ended, failed or ran out of time before the response. */
  | { kind: 'ended'; error: string; timedOut: boolean };

/**
 * Reads `body` until the JSON-RPC response to `id` (or its end, a failure,
 * the deadline). Every event before the response is handed to `forward` at
 * once; the response's event is not: the caller of `pump` records it first
 * and forwards it then, so that a caller who saw the result and retries gets
 * the replay, not `idempotency-in-progress`.
 */
export async function pump(
  body: ReadableStream<Uint8Array>,
  id: JsonRpcId,
  options: {
    limit: number;
    timeoutMs: number;
    forward: (event: SseEvent) => void;
    observe?: (message: unknown) => void;
    /** Every whole event, first (its `id:` and `retry:`: where a resumed stream starts, ./resume.ts). */
    seen?: (event: SseEvent) => void;
    /** Stops the reading (the answer came on another stream, ./resume.ts): the end is `ended` with error `stopped`. */
    stop?: AbortSignal;
  },
): Promise<PumpEnd> {
  const splitter = new SseSplitter(options.limit);
  const reader = body.getReader();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    void reader.cancel().catch(() => {});
  }, options.timeoutMs);
  const stop = () => void reader.cancel().catch(() => {});
  options.stop?.addEventListener('abort', stop, { once: true });
  if (options.stop?.aborted) stop();
  const failure = (err: unknown) => (timedOut ? 'timeout' : options.stop?.aborted ? 'stopped' : errorName(err));
  try {
    for (;;) {
      let next: Awaited<ReturnType<typeof reader.read>>;
      try {
        next = await reader.read();
      } catch (err) {
        return { kind: 'ended', error: failure(err), timedOut };
      }
      const events = next.done ? splitter.end() : splitter.push(next.value);
      if (events === null) {
        void reader.cancel().catch(() => {});
        return { kind: 'too-large' };
      }
      for (const event of events) {
        options.seen?.(event);
        // Parsed once: what observe sees and what decides the event's role.
        const data = parseData(event.data);
        const message = messageOf(event, data);
        if (message !== undefined) options.observe?.(message);
        const role = roleIn(event, id, data);
        if (role === 'answer') {
          // The request is answered: nothing after it belongs to this call.
          void reader.cancel().catch(() => {});
          return { kind: 'final', data: event.data!, event };
        }
        if (role === 'other') options.forward(event);
      }
      if (next.done) return { kind: 'ended', error: timedOut || options.stop?.aborted ? failure(null) : 'stream-ended-without-response', timedOut };
    }
  } finally {
    clearTimeout(timer);
    options.stop?.removeEventListener('abort', stop);
  }
}

/**
 * What one event of the answer to request `id` is to the call:
 * - `answer`: a `message` event holding the JSON-RPC response to `id`,
 *   the one event recorded as the call's answer;
 * - `foreign`: a JSON-RPC response that is not that (another id, or an
 *   event type other than `message`, which an EventSource or the MCP SDK
 *   never reads as a message): never recorded, and not passed on, for a
 *   client that matched it by id would take it as the answer to another of
 *   its requests, and one that ignores the type as this call's answer, an
 *   answer no retry would be replayed (docs/mcp.md "What is stored");
 * - `other`: anything else (notifications, server requests, comments),
 *   passed on as it came.
 */
export function roleIn(event: SseEvent, id: JsonRpcId, message: unknown = parseData(event.data)): 'answer' | 'foreign' | 'other' {
  if (!isResponse(message)) return 'other';
  return event.type === 'message' && isResponseTo(message, id) ? 'answer' : 'foreign';
}

/** The JSON-RPC message of a `message` event (the only type an MCP client reads as one); undefined for any other event. */
export function messageOf(event: SseEvent, data: unknown = parseData(event.data)): unknown {
  return event.type === 'message' ? data : undefined;
}

/** A JSON-RPC response: an object with `result` or `error` and no `method`. */
function isResponse(message: unknown): boolean {
  if (message === null || typeof message !== 'object' || Array.isArray(message)) return false;
  const m = message as Record<string, unknown>;
  return m.method === undefined && ('result' in m || 'error' in m);
}

/** A JSON-RPC response (result or error, no method) whose id is `id`. */
export function isResponseTo(message: unknown, id: JsonRpcId): message is { id: JsonRpcId; result?: unknown; error?: unknown } {
  if (message === null || typeof message !== 'object' || Array.isArray(message)) return false;
  const m = message as Record<string, unknown>;
  return m.method === undefined && m.id === id && ('result' in m || 'error' in m);
}

/** The events of a whole event-stream body (a forwarder that cannot stream read it all). */
export function eventsOf(body: Uint8Array, limit: number): SseEvent[] | null {
  const splitter = new SseSplitter(limit);
  const events = splitter.push(body);
  return events === null ? null : [...events, ...splitter.end()];
}

export function parseData(data: string | null): unknown {
  if (data === null) return undefined;
  try {
    return JSON.parse(data);
  } catch {
    return undefined;
  }
}

/** One JSON-RPC message as an SSE event, as an MCP server sends it. */
export function sseMessage(json: string): string {
  return `event: message\ndata: ${json}\n\n`;
}

function errorName(err: unknown): string {
  return (err as { code?: string })?.code ?? (err as Error)?.name ?? 'error';
}
