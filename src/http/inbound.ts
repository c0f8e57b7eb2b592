/** The parts of a Node `IncomingMessage` the body reader uses (`c.env.incoming` under @hono/node-server). */
export interface IncomingLike {
  on(event: string, listener: (...args: any[]) => void): unknown;
  off(event: string, listener: (...args: any[]) => void): unknown;
  pause(): unknown;
  readonly readableEnded: boolean;
}

/** What the proxy reads of a header block: `Headers` has this shape, and so does the Node entry's view of the raw headers. */
export interface HeaderReader {
  /** The field's value, repeated fields joined with ", " (as `Headers.get`); null when absent. Case-insensitive. */
  get(name: string): string | null;
  forEach(callback: (value: string, name: string) => void): void;
}

/**
 * A proxied request, whatever server parsed it: Hono's `Request` on Workers
 * and for `app.fetch`, the Node request itself in the Node entry
 * (../entry/node-listener.ts), which skips the WHATWG Request/Response adaptation.
 */
export interface Inbound {
  method: string;
  /** Path and query as URL parsing left them (percent-encoding kept); the proxy brings the path to normal form (./path.ts). */
  pathname: string;
  search: string;
  headers: HeaderReader;
  /** The body as a web stream; read only when `incoming` is absent or already ended. */
  body: ReadableStream<Uint8Array> | null;
  /** The Node request stream, read directly when present. */
  incoming?: IncomingLike;
  /** Aborted once the caller has gone away (read only while waiting). */
  readonly signal: AbortSignal;
}

/** The answer, before any server writes it. Header names are lower case. */
export interface Reply {
  status: number;
  headers: [string, string][];
  /** null for 204, 304 and 1xx, and when `stream` is set. */
  body: Uint8Array | string | null;
  /** The body as a stream, written as it comes (an mcp route's event stream, ./mcp/stream.ts); `body` is then null. */
  stream?: ReadableStream<Uint8Array>;
  /**
   * Work that goes on after the answer's head (an mcp route recording the
   * final answer of an event stream): the request counts as in flight until
   * it settles, so that a closing gateway waits for it before the store goes.
   */
  settled?: Promise<unknown>;
}
