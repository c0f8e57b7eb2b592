import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import { Readable, pipeline } from 'node:stream';
import type { ReadableStream as NodeReadableStream } from 'node:stream/web';
import { toReply } from '../http/errors.js';
import { problemBaseOf, type Gateway } from '../http/gateway.js';
import type { HeaderReader, Inbound, Reply } from '../http/inbound.js';
import { isAdminPath, metadataPathOf } from '../http/pipeline/route.js';
import { renderProblem } from '../protocol/problem.js';

/** A request body left unread after the answer (a refusal before the body was needed) is discarded up to this size and for this long, then the connection closes. */
const DISCARD_LIMIT_BYTES = 1024 * 1024;
const DISCARD_LIMIT_MS = 1_000;

/**
 * The Node server's request listener: proxied requests go to the gateway's
 * `direct` path (caller auth included), read from the Node request and
 * written to the Node response; everything else (the admin API under
 * `adminPrefix`, the protected resource metadata with `auth.resource`,
 * and any request target @hono/node-server would have to
 * judge: absolute form, a backslash, an odd Host) goes to `fallback`, the
 * Hono app's listener.
 *
 * Why: no WHATWG Request/Response objects and no Hono dispatch per proxied
 * request; measured in one run, 1.15× the throughput of the same gateway
 * served through Hono (`node bench/http.mjs --only control,fg-normal,fg-hono`).
 * The decisions are the same function either way
 * (test/gateway/node-path.test.ts compares the two).
 */
export function createNodeListener(gateway: Gateway, fallback: RequestListener): RequestListener {
  const direct = gateway.direct;
  const adminPrefix = gateway.config.adminPrefix;
  const metadataPath = metadataPathOf(gateway.config);
  const backslash = toReply(
    renderProblem(
      {
        code: 'invalid-request',
        detail:
          'the path contains a raw "\\": URL parsing reads it as "/", an upstream may keep it a character, and the two can be routed differently; send "/" or "%5C"',
      },
      problemBaseOf(gateway.config),
    ),
  );
  const headersTooLarge = toReply(
    renderProblem(
      {
        code: 'headers-too-large',
        detail:
          "the request has as many header fields as the HTTP parser keeps (the server's maxHeadersCount): any beyond are dropped unseen, and a request is never decided on part of its headers; send fewer",
      },
      problemBaseOf(gateway.config),
    ),
  );
  return (req, res) => {
    // Node's parser stops keeping header fields at the server's cap and
    // says nothing: a `Transfer-Encoding` or a fence past it would go
    // unchecked (../http/request-shape.ts). At the cap the rest is unknown,
    // so the request is refused on both ways in, before anything else.
    if (atHeaderCap(req)) return write(req, res, headersTooLarge);
    const target = req.url ?? '';
    const host = req.headers.host;
    // A raw backslash in the path has two readings (a separator to URL
    // parsing, a character to many upstreams) and @hono/node-server refuses
    // it with a bare 400: refused here first, as problem+json, on both ways
    // in (caller auth or not), before anything is read or stored.
    const query = target.indexOf('?');
    const slash = target.indexOf('\\');
    if (slash !== -1 && (query === -1 || slash < query)) return write(req, res, backslash);
    if (target[0] !== '/' || target.includes('\\') || host === undefined) return fallback(req, res);
    // As @hono/node-server builds it, so that both paths see the same path.
    let url: URL;
    try {
      url = new URL(`http://${host}${target}`);
    } catch {
      return fallback(req, res);
    }
    if (url.hostname.length !== host.length && url.hostname !== host.replace(/:\d+$/, '')) return fallback(req, res);
    // The admin API's paths and the protected resource metadata go to Hono;
    // the one rule (../http/pipeline/route.ts isAdminPath) takes both readings
    // of the path, so no path is the app's on one way in and proxied on the other.
    if (isAdminPath(url.pathname, adminPrefix, metadataPath)) return fallback(req, res);
    const inbound = new NodeInbound(req, res, url.pathname, url.search);
    direct(inbound)
      .then((reply) => write(req, res, reply))
      // direct() answers its own faults; this is for a fault in writing.
      .catch(() => res.destroy());
  };
}

/**
 * The Node request as an Inbound. A class rather than an object literal: a
 * literal with a getter is built property by property on every request, a
 * class instance from one map, its getter on the prototype.
 */
class NodeInbound implements Inbound {
  readonly method: string;
  readonly headers: HeaderReader;
  readonly body = null;
  private controller: AbortController | null = null;
  constructor(
    readonly incoming: IncomingMessage,
    private readonly res: ServerResponse,
    readonly pathname: string,
    readonly search: string,
  ) {
    this.method = incoming.method ?? 'GET';
    this.headers = rawHeaderReader(incoming.rawHeaders);
  }
  /** Aborted once the caller has gone away: made on first read (only a waiting request reads it). */
  get signal(): AbortSignal {
    if (this.controller === null) {
      const c = (this.controller = new AbortController());
      const res = this.res;
      if (res.closed) c.abort();
      else res.once('close', () => res.writableFinished || c.abort());
    }
    return this.controller.signal;
  }
}

/**
 * Node's default cap when `maxHeadersCount` is unset: its parser keeps 2000
 * `rawHeaders` entries (1000 fields), whatever the http docs' "2000" says.
 */
const DEFAULT_HEADER_ENTRIES = 2000;

/**
 * Whether the parser may have dropped header fields: `rawHeaders` has as
 * many entries as it keeps (twice the server's `maxHeadersCount`; 0 means
 * no cap). It reads the fields in batches and stops after the batch that
 * crosses the cap, so the length is at or past the cap, never short of it.
 */
function atHeaderCap(req: IncomingMessage): boolean {
  const max = (req.socket as { server?: { maxHeadersCount?: number | null } }).server?.maxHeadersCount;
  const entries = typeof max === 'number' ? max * 2 : DEFAULT_HEADER_ENTRIES;
  return entries > 0 && req.rawHeaders.length >= entries;
}

function write(req: IncomingMessage, res: ServerResponse, reply: Reply): void {
  if (res.destroyed) return;
  // A HEAD answer has no body here: it carries the upstream's Content-Length
  // (../http/plain/outcome.ts) or none, never a computed 0, which would tell the
  // caller the resource is empty.
  const head = req.method === 'HEAD';
  const flat: string[] = [];
  let hasLength = false;
  for (const [name, value] of reply.headers) {
    flat.push(name, value);
    if (name === 'content-length') hasLength = true;
  }
  if (reply.stream !== undefined) return writeStream(req, res, reply.status, flat, reply.stream);
  if (reply.body !== null && !hasLength && !head)
    flat.push('content-length', String(typeof reply.body === 'string' ? Buffer.byteLength(reply.body) : reply.body.byteLength));
  try {
    res.writeHead(reply.status, flat);
    res.end(reply.body ?? undefined);
  } catch {
    // A header Node refuses to write: the caller gets a cut connection
    // (@hono/node-server would answer 500 and then cut). The outcome is
    // already recorded, so a retry with the same key gets the replay.
    res.destroy();
    return;
  }
  if (!req.readableEnded) discardRest(req);
}

/**
 * A streamed answer (an mcp route's event stream), written chunk by chunk as
 * it comes, with the response's backpressure; the caller going away cancels
 * the stream (what that cancels upstream is the stream's owner's choice).
 */
function writeStream(req: IncomingMessage, res: ServerResponse, status: number, flat: string[], body: ReadableStream<Uint8Array>): void {
  try {
    res.writeHead(status, flat);
    res.flushHeaders();
  } catch {
    void body.cancel().catch(() => {});
    res.destroy();
    return;
  }
  pipeline(Readable.fromWeb(body as NodeReadableStream<Uint8Array>), res, () => {});
  if (!req.readableEnded) discardRest(req);
}

/** Reads and drops what is left of the request body, so the connection can carry the next request; past the limit, closes it. */
function discardRest(req: IncomingMessage): void {
  let left = DISCARD_LIMIT_BYTES;
  const cut = () => req.socket.destroySoon();
  const timer = setTimeout(cut, DISCARD_LIMIT_MS);
  timer.unref();
  req.on('data', (chunk: Buffer) => {
    left -= chunk.byteLength;
    if (left < 0) cut();
  });
  req.once('end', () => clearTimeout(timer));
  req.once('close', () => clearTimeout(timer));
  req.resume();
}

/**
 * The raw header block read as `Headers` reads it: names case-insensitive,
 * a repeated field's values joined with ", " (the parsers of the fence,
 * entity and Host headers rely on that join to see repeats).
 */
export function rawHeaderReader(raw: string[]): HeaderReader {
  const fields = new Map<string, string>();
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!.toLowerCase();
    const prev = fields.get(name);
    fields.set(name, prev === undefined ? raw[i + 1]! : `${prev}, ${raw[i + 1]}`);
  }
  return {
    get: (name) => fields.get(name.toLowerCase()) ?? null,
    forEach: (callback) => fields.forEach(callback),
  };
}
