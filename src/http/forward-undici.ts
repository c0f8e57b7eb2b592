import { Agent, buildConnector, errors, type Dispatcher } from 'undici';
import type { Config } from '../config/schema.js';
import { causeCode, CONNECT_ONLY_CODES } from '../protocol/connect-errors.js';
import {
  BodyBuffer,
  declaredLength,
  START_DEADLINE_PASSED,
  startDeadlinePassed,
  type Forwarder,
  type StreamedAnswer,
  type UpstreamRequest,
  type UpstreamResult,
} from './forward.js';

/**
 * Errors of a connection that was never made: the connect-only codes, and
 * EHOSTUNREACH and ENETUNREACH. All are trusted only before undici started
 * writing the request (`onRequestStart`): Linux also reports the last two on
 * an open connection whose retransmissions ran out after an ICMP
 * unreachable, and by then the request may have landed.
 */
const NOT_CONNECTED: ReadonlySet<string> = new Set([...CONNECT_ONLY_CODES, 'EHOSTUNREACH', 'ENETUNREACH', ...tlsVerifyCodes()]);

/**
 * The upstream's certificate refused (an unknown CA, an expired or a
 * mismatched certificate; routes[].tls): Node checks it once the handshake
 * is done and destroys the socket before `secureConnect`, and undici writes
 * nothing before that, so the request never left (DESIGN §3.7): a
 * misconfigured CA answers 502 upstream-unavailable, and every attempt does
 * not leave an outcome_unknown record behind. A server that refuses our
 * client certificate is not among them: under TLS 1.3 its alert comes after
 * our side finished the handshake, when the request may have been written.
 */
function tlsVerifyCodes(): string[] {
  return [
    'UNABLE_TO_GET_ISSUER_CERT',
    'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
    'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
    'UNABLE_TO_DECRYPT_CERT_SIGNATURE',
    'UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY',
    'CERT_SIGNATURE_FAILURE',
    'CERT_NOT_YET_VALID',
    'CERT_HAS_EXPIRED',
    'ERROR_IN_CERT_NOT_BEFORE_FIELD',
    'ERROR_IN_CERT_NOT_AFTER_FIELD',
    'DEPTH_ZERO_SELF_SIGNED_CERT',
    'SELF_SIGNED_CERT_IN_CHAIN',
    'CERT_CHAIN_TOO_LONG',
    'CERT_REVOKED',
    'INVALID_CA',
    'PATH_LENGTH_EXCEEDED',
    'INVALID_PURPOSE',
    'CERT_UNTRUSTED',
    'CERT_REJECTED',
    'HOSTNAME_MISMATCH',
    'ERR_TLS_CERT_ALTNAME_INVALID',
  ];
}

const deadlinePassed = () => new errors.RequestAbortedError('the upstream deadline passed');
const tooLargeAbort = () => new errors.RequestAbortedError('the answer exceeds maxResponseBytes');
const startDeadlineAbort = () => new errors.RequestAbortedError('the start deadline passed');
const streamCancelled = () => new errors.RequestAbortedError('the reader cancelled the streamed answer');
const shuttingDown = () => new errors.RequestAbortedError('the gateway is shutting down');

/** Bytes a streamed answer queues before the socket is paused (backpressure to the upstream). */
const STREAM_HIGH_WATER_BYTES = 64 * 1024;

/**
 * Event-loop turns the deadline waits, once due, before it aborts a request
 * already sent. A process that was paused (SIGSTOP, a long GC or VM pause)
 * past the deadline wakes with the timer due, and libuv runs due timers at
 * the start of a loop turn, before that turn reads the sockets: an answer
 * that arrived during the pause sits unread in the socket, and aborting
 * right away would make it an outcome_unknown although the gateway has it.
 * Each turn polls the sockets once (without waiting), so two turns read what
 * had already arrived; the deadline is late by two turns at most.
 */
const DEADLINE_GRACE_TURNS = 2;

export interface UndiciForwarderOptions {
  /** Upper bound on connections per upstream origin. Default 256. */
  connections?: number;
  /**
   * Upper bound on connections per origin for pass-through requests
   * (`passThrough`, an mcp route's undecided messages and event streams),
   * which have a pool of their own. Default 256.
   */
  passThroughConnections?: number;
  /** How long close() lets pass-through requests finish before it cuts them (an event stream never does). Default 1000 ms. */
  passThroughCloseGraceMs?: number;
  /** undici's `connect` option for the pool (TLS options, or a connector of your own). */
  connect?: Agent.Options['connect'];
  /**
   * TLS per upstream origin (`https://host:port`, as `upstreamTlsOf` makes
   * it from the routes' `tls`): a CA that replaces the system's, a client
   * certificate and key for mutual TLS. Other origins keep `connect`.
   */
  tls?: Record<string, UpstreamTls>;
  /**
   * Test only (a negative control): loop turns the due deadline waits for
   * an answer already in the socket. Default 2; 0 aborts at once.
   * @internal
   */
  deadlineGraceTurns?: number;
}

/**
 * The Node forwarder: one undici dispatch over a keep-alive pool. undici
 * never retries a non-idempotent request on its own, which is what a payment
 * proxy needs: one attempt, and an honest answer about whether it may have
 * landed.
 *
 * `Agent.dispatch` with a handler that collects the body, rather than
 * undici's `request()`: the gateway buffers every answer anyway (it is
 * stored for replay), and `request()` adds per call an AsyncResource, a
 * Readable for the body, an AbortController for the deadline and a second
 * URL parse. The dispatch options are the ones `request()` derives from
 * the same arguments (origin, path and query of the parsed URL).
 *
 * Whether the request may have reached the upstream is decided by one fact:
 * undici calls `onRequestStart` just before it writes the first byte, and
 * writes nothing once that call aborts. Before it, a failed connect, the
 * deadline or a passed `startBy` is `refused` (nothing was sent, a retry is
 * safe); after it, every failure is `unknown`.
 *
 * The body is read up to `maxResponseBytes`: a larger `content-length`, or
 * the chunk that would cross the limit, aborts the dispatch (undici then
 * destroys the connection and reads no more) and the answer is `too-large`.
 */
export function createUndiciForwarder(options: UndiciForwarderOptions = {}): Forwarder {
  const connect = withUpstreamTls(options.connect, options.tls);
  // No headers or body timeout of undici's own, here and per dispatch: the route's deadline is the only one, so a
  // long call (DESIGN §3.6 "Long calls": hours) is not cut at undici's default 300 s.
  const agent = new Agent({ connections: options.connections ?? 256, keepAliveTimeout: 4_000, headersTimeout: 0, bodyTimeout: 0, connect });
  // Pass-through streams (an MCP server's GET stream lives as long as its
  // session) get a pool of their own: however many are open, decided calls
  // keep theirs, and close() can cut them without touching a decided call.
  const passAgent = new Agent({ connections: options.passThroughConnections ?? 256, keepAliveTimeout: 4_000, connect });
  /** How to cut each pass-through answer still streaming (Agent.destroy alone leaves its reader waiting). */
  const openStreams = new Set<() => void>();
  const graceTurns = options.deadlineGraceTurns ?? DEADLINE_GRACE_TURNS;
  type StreamIf = (status: number, headers: [string, string][]) => boolean;
  const run = (req: UpstreamRequest, streamIf: StreamIf | null): Promise<UpstreamResult | StreamedAnswer> =>
    new Promise((resolve) => {
      // The router never lets CONNECT through; dispatch would hand the
      // socket over and never answer.
      if (req.method.toUpperCase() === 'CONNECT') return resolve({ kind: 'refused', error: 'CONNECT-not-forwarded' });
      let url: URL;
      try {
        url = new URL(req.url);
      } catch (err) {
        // As request() answered (the route's upstream is checked at start-up).
        return resolve({ kind: 'unknown', error: errorCode(err), timedOut: false });
      }
      let status = 0;
      let headers: Record<string, string | string[] | undefined> = {};
      let body: BodyBuffer | null = null;
      let timedOut = false;
      let settled = false;
      /** Set by onRequestStart: from then on the request may have been sent. */
      let abort: ((reason: Error) => void) | null = null;
      /** Set once a streamed answer was handed over: the body goes to it. */
      const streamed: { c: ReadableStreamDefaultController<Uint8Array> | null; done?: () => void } = { c: null };
      const finish = (result: UpstreamResult | StreamedAnswer) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        resolve(result);
      };
      const fail = (err: unknown) => {
        const code = errorCode(err);
        if (abort === null && NOT_CONNECTED.has(code)) return finish({ kind: 'refused', error: code });
        // The deadline before the first byte: still connecting, or queued
        // for a busy pool; onRequestStart aborts it if it ever comes.
        if (abort === null && timedOut) return finish({ kind: 'refused', error: 'deadline-before-send' });
        const timeout = timedOut || code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT';
        finish({ kind: 'unknown', error: timeout ? 'timeout' : code, timedOut: timeout });
      };
      // The upstream answered and so acted, but its body is over the limit:
      // stop reading (the abort destroys the connection) and drop it.
      const tooLarge = (controller: Dispatcher.DispatchController) => {
        body = null;
        finish({ kind: 'too-large', status, limit: req.maxResponseBytes });
        controller.abort(tooLargeAbort());
      };
      // The deadline covers the whole exchange, response body included.
      // It is the only one (undici's own headers and body timeouts are
      // off), so that nothing else cuts the answer short during the grace.
      const timer = setTimeout(() => {
        timedOut = true;
        // Not sent yet: nothing can be waiting in a socket.
        if (abort === null) return fail(deadlinePassed());
        afterTurns(graceTurns, () => {
          if (!settled) abort!(deadlinePassed());
        });
      }, req.timeoutMs);
      const handler: Dispatcher.DispatchHandler = {
        onRequestStart(controller) {
          if (timedOut) return controller.abort(deadlinePassed());
          // The caller's own budget (e.g. what is left of the record's
          // lock) ran out before the first byte: nothing is written.
          if (startDeadlinePassed(req, performance.now())) {
            finish({ kind: 'refused', error: START_DEADLINE_PASSED });
            return controller.abort(startDeadlineAbort());
          }
          abort = (reason) => controller.abort(reason);
        },
        onResponseStart(controller, statusCode, responseHeaders) {
          // 1xx informational answers come here first; never the answer.
          if (statusCode < 200) return;
          status = statusCode;
          headers = responseHeaders;
          if (streamIf !== null && streamIf(statusCode, headerList(responseHeaders))) {
            // From here the reader owns the deadline and the size: the timer stops in finish().
            const body = new ReadableStream<Uint8Array>(
              {
                start: (c) => void (streamed.c = c),
                pull: () => controller.resume(),
                cancel: () => {
                  openStreams.delete(cut);
                  controller.abort(streamCancelled());
                },
              },
              { highWaterMark: STREAM_HIGH_WATER_BYTES, size: (chunk) => chunk.byteLength },
            );
            const cut = () => {
              openStreams.delete(cut);
              try {
                streamed.c?.error(shuttingDown());
              } catch {
                // Already closed.
              }
              controller.abort(shuttingDown());
            };
            if (req.passThrough === true) {
              openStreams.add(cut);
              streamed.done = () => openStreams.delete(cut);
            }
            return finish({ kind: 'stream', status, headers: headerList(responseHeaders), body });
          }
          // The length of a HEAD, 204 or 304 answer describes bytes it does not carry.
          const bodyless = req.method.toUpperCase() === 'HEAD' || statusCode === 204 || statusCode === 304;
          const declared = bodyless ? null : declaredLength(responseHeaders['content-length']);
          if (declared !== null && declared > req.maxResponseBytes) return tooLarge(controller);
          body = new BodyBuffer(req.maxResponseBytes, declared);
        },
        onResponseData(controller, chunk) {
          if (streamed.c !== null) {
            try {
              // A copy: the chunk may be a view of pooled memory.
              streamed.c.enqueue(new Uint8Array(chunk));
              if ((streamed.c.desiredSize ?? 1) <= 0) controller.pause();
            } catch {
              // Cancelled by the reader: the abort is on its way.
            }
            return;
          }
          if (settled || body === null) return;
          if (!body.add(chunk)) tooLarge(controller);
        },
        onResponseEnd() {
          streamed.done?.();
          if (streamed.c !== null) return closeQuietly(streamed.c);
          if (settled) return;
          finish({ kind: 'response', status, headers: headerList(headers), body: body?.take() ?? new Uint8Array(0) });
        },
        onResponseError(_controller, err) {
          streamed.done?.();
          if (streamed.c !== null) return streamed.c.error(err);
          fail(err);
        },
      };
      try {
        (req.passThrough === true ? passAgent : agent).dispatch(
          {
            origin: url.origin,
            path: url.search ? `${url.pathname}${url.search}` : url.pathname,
            method: req.method,
            headers: req.headers,
            body: req.body,
            headersTimeout: 0,
            bodyTimeout: 0,
          },
          handler,
        );
      } catch (err) {
        // undici reports invalid options through onResponseError; should it
        // throw instead, the answer is the one request() gave.
        fail(err);
      }
    });
  return {
    forward: (req) => run(req, null) as Promise<UpstreamResult>,
    forwardStreaming: (req, streamIf) => run(req, streamIf),
    async close() {
      // Decided calls are drained before close() (the gateway waits for them); a
      // pass-through stream may never end, so after the grace it is cut.
      // The timer is not unref'd: it may be all that keeps the process alive until the streams are cut.
      let passClosed = false;
      let timer: ReturnType<typeof setTimeout> | undefined;
      const grace = new Promise<void>((r) => (timer = setTimeout(r, options.passThroughCloseGraceMs ?? 1_000)));
      await Promise.all([agent.close(), Promise.race([passAgent.close().then(() => void (passClosed = true)), grace])]);
      clearTimeout(timer);
      if (passClosed) return;
      for (const cut of [...openStreams]) cut();
      await passAgent.destroy();
    },
  };
}

function headerList(headers: Record<string, string | string[] | undefined>): [string, string][] {
  const list: [string, string][] = [];
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined) continue;
    if (Array.isArray(value)) for (const v of value) list.push([name, v]);
    else list.push([name, value]);
  }
  return list;
}

function closeQuietly(c: ReadableStreamDefaultController<Uint8Array>): void {
  try {
    c.close();
  } catch {
    // Already cancelled by the reader.
  }
}

/** Runs `fn` after `turns` turns of the event loop (each one polls the sockets), or now for 0. */
function afterTurns(turns: number, fn: () => void): void {
  if (turns <= 0) fn();
  else setImmediate(() => afterTurns(turns - 1, fn));
}

function errorCode(err: unknown): string {
  return causeCode(err) ?? (err as Error)?.name ?? 'error';
}

/** PEM text of one upstream's TLS settings. */
export interface UpstreamTls {
  ca?: string;
  cert?: string;
  key?: string;
}

/** `https://host:port`, the default port spelled out, so that the route's URL and undici's connect options name an origin alike. */
function originKey(protocol: string, hostname: string, port: string): string {
  return `${protocol}//${hostname.toLowerCase()}:${port || (protocol === 'https:' ? '443' : '80')}`;
}

/**
 * The routes' upstream TLS (`routes[].tls`, files already read by the Node
 * entry, ../config/prepare.ts) by upstream origin: undici pools connections
 * per origin, so TLS is chosen per origin too, and the schema refuses two
 * routes that name one origin with different TLS (docs/deploy.md §5).
 */
export function upstreamTlsOf(config: Config): Record<string, UpstreamTls> {
  const out: Record<string, UpstreamTls> = {};
  for (const route of config.routes) {
    if (route.tls === undefined) continue;
    const u = new URL(route.upstream);
    const pem = (v: string | { pem: string } | undefined) => (typeof v === 'object' ? v.pem : undefined);
    const tls: UpstreamTls = {};
    for (const part of ['ca', 'cert', 'key'] as const) {
      const text = pem(route.tls[part]);
      if (text !== undefined) tls[part] = text;
    }
    out[originKey(u.protocol, u.hostname, u.port)] = tls;
  }
  return out;
}

/**
 * undici's `connect` with each configured origin's TLS options: a connector
 * of its own per origin (its own TLS session cache), the given `connect`
 * (or undici's default) for every other origin.
 */
function withUpstreamTls(connect: Agent.Options['connect'], tls: Record<string, UpstreamTls> | undefined): Agent.Options['connect'] {
  if (tls === undefined || Object.keys(tls).length === 0) return connect;
  const fallback = typeof connect === 'function' ? connect : buildConnector(connect ?? {});
  const byOrigin = new Map(Object.entries(tls).map(([origin, t]) => [origin, buildConnector({ ...(typeof connect === 'object' ? connect : {}), ...t })]));
  return (opts, callback) => {
    const own = byOrigin.get(originKey(opts.protocol, opts.hostname, String(opts.port ?? '')));
    return (own ?? fallback)(opts, callback);
  };
}
