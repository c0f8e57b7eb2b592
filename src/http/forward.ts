/**
 * How the gateway reaches the upstream. The Node entry uses undici; the
 * Workers entry uses `fetch`. The one distinction that matters for safety is
 * whether the request may have reached the upstream (DESIGN §3.7).
 */
export interface UpstreamRequest {
  url: string;
  method: string;
  headers: Record<string, string>;
  body: Uint8Array | null;
  /** Bound on the whole exchange, response body included. */
  timeoutMs: number;
  /**
   * Most bytes of answer body read and kept. Past it the forwarder stops
   * reading and answers `too-large`: memory per request stays bounded by it,
   * and nothing larger is ever stored for replay.
   */
  maxResponseBytes: number;
  /**
   * A `performance.now()` value: if the first byte would be written after
   * it, nothing is written and the answer is `refused` with
   * `start-deadline-passed` (the caller's own time budget, e.g. what is
   * left of the record's lock after a pause, DESIGN §2 G1). A function is
   * asked at the check itself: a long call's lock, extended while the
   * request waited for a connection (DESIGN §3.6 "Long calls").
   */
  startBy?: number | (() => number);
  /**
   * A message an mcp route passes undecided (a server's `GET` event stream
   * may stay open for the session): a forwarder may send it over a pool of
   * its own, so that open streams never hold the connections decided calls
   * need, and cut it at shutdown (docs/mcp.md "Limits").
   */
  passThrough?: boolean;
}

export type UpstreamResult =
  | { kind: 'response'; status: number; headers: [string, string][]; body: Uint8Array }
  /** No connection was made: nothing reached the upstream, safe to retry. */
  | { kind: 'refused'; error: string }
  /** Timeout or reset after the request may have been sent: outcome unknown. */
  | { kind: 'unknown'; error: string; timedOut: boolean }
  /**
   * The upstream answered `status` (so it acted) with a body over `limit`
   * bytes; reading stopped there and the body was dropped.
   */
  | { kind: 'too-large'; status: number; limit: number };

/**
 * An answer whose body is handed over as it comes (an MCP server's event
 * stream): the forwarder's deadline and size limit stopped at its head, the
 * reader bounds both. Cancelling `body` drops the upstream connection.
 */
export interface StreamedAnswer {
  kind: 'stream';
  status: number;
  headers: [string, string][];
  body: ReadableStream<Uint8Array>;
}

export interface Forwarder {
  forward(request: UpstreamRequest): Promise<UpstreamResult>;
  /**
   * As `forward`, but when `streamIf` says so of the answer's head (status
   * and headers) the body is not buffered: the answer is a `StreamedAnswer`
   * as soon as the head is in. Everything before the head (refused, unknown,
   * the deadline) is as for `forward`. Optional: without it an mcp route
   * reads event streams whole (docs/mcp.md "Limits").
   */
  forwardStreaming?(request: UpstreamRequest, streamIf: (status: number, headers: [string, string][]) => boolean): Promise<UpstreamResult | StreamedAnswer>;
  close?(): Promise<void>;
}

/** The `refused` error of a request whose `startBy` passed before its first byte. */
export const START_DEADLINE_PASSED = 'start-deadline-passed';

/** Whether `req.startBy` has passed at `now` (a function is asked now). */
export function startDeadlinePassed(req: Pick<UpstreamRequest, 'startBy'>, now: number): boolean {
  if (req.startBy === undefined) return false;
  return now > (typeof req.startBy === 'function' ? req.startBy() : req.startBy);
}

/**
 * The answer body, copied out of the transport's chunks as they come (they
 * may be views of the socket's reads or of pooled memory, which must not be
 * kept) into memory of its own that never grows past `limit`. With a
 * declared length the buffer has that size from the start and is handed
 * over without another copy.
 */
export class BodyBuffer {
  private buf: Uint8Array;
  private size = 0;

  constructor(
    private readonly limit: number,
    declared: number | null,
  ) {
    // Zero-filled memory is only touched as bytes arrive: a declared length
    // that never comes costs no resident memory.
    this.buf = new Uint8Array(declared ?? Math.min(limit, 16 * 1024));
  }

  /** false, and nothing kept, if the chunk would take the body past the limit. */
  add(chunk: Uint8Array): boolean {
    const end = this.size + chunk.byteLength;
    if (end > this.limit) return false;
    if (end > this.buf.byteLength) {
      const grown = new Uint8Array(Math.min(this.limit, Math.max(end, this.buf.byteLength * 2)));
      grown.set(this.buf.subarray(0, this.size));
      this.buf = grown;
    }
    this.buf.set(chunk, this.size);
    this.size = end;
    return true;
  }

  /** The body, in an array of exactly its length. */
  take(): Uint8Array {
    return this.size === this.buf.byteLength ? this.buf : this.buf.slice(0, this.size);
  }
}

/** A `content-length` value as a number, or null when absent or not one plain decimal. */
export function declaredLength(value: string | string[] | null | undefined): number | null {
  if (typeof value !== 'string' || !/^\d{1,15}$/.test(value.trim())) return null;
  return Number(value.trim());
}

/** RFC 9110 §7.6.1 hop-by-hop fields, plus ones the transport sets itself. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'host',
  'content-length',
  'expect',
  'http2-settings',
]);

/** Drops hop-by-hop fields, including any the `Connection` header names. */
export function isHopByHop(name: string, connectionTokens: ReadonlySet<string>): boolean {
  const lower = name.toLowerCase();
  return HOP_BY_HOP.has(lower) || connectionTokens.has(lower);
}

/**
 * The field names a `Connection` header declares hop-by-hop (RFC 9110
 * §7.6.1), lower case, without those in `keep`. A sender can name any field
 * there, end-to-end ones included: `Connection: close, Idempotency-Key`
 * would have the key (or the fence, the entity, the content type the
 * fingerprint covers) dropped on the way to the upstream while the gateway
 * decided with it. The request side passes the fields it relies on as
 * `keep`, so such tokens are ignored.
 */
export function connectionTokens(connection: string | null | undefined, keep: Iterable<string> = []): Set<string> {
  const tokens = new Set(
    (connection ?? '')
      .split(',')
      .map((t) => t.trim().toLowerCase())
      .filter(Boolean),
  );
  for (const name of keep) tokens.delete(name.toLowerCase());
  return tokens;
}
