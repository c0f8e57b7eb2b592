import { Agent, errors, type Dispatcher } from 'undici';
import { causeCode, type Forwarder, type UpstreamRequest, type UpstreamResult } from './forward.js';

/**
 * Errors of a connection that was never made. Trusted only before undici
 * started writing the request (`onRequestStart`): Linux also reports
 * EHOSTUNREACH or ENETUNREACH on an open connection whose retransmissions
 * ran out after an ICMP unreachable, and by then the request may have landed.
 */
const NOT_CONNECTED = new Set([
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EADDRNOTAVAIL',
  'UND_ERR_CONNECT_TIMEOUT',
]);

const deadlinePassed = () => new errors.RequestAbortedError('the upstream deadline passed');

export interface UndiciForwarderOptions {
  /** Upper bound on connections per upstream origin. Default 256. */
  connections?: number;
  /** undici's `connect` option for the pool (TLS options, or a connector of your own). */
  connect?: Agent.Options['connect'];
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
 * writes nothing once that call aborts. Before it, a failed connect or the
 * deadline is `refused` (nothing was sent, a retry is safe); after it,
 * every failure is `unknown`.
 */
export function createUndiciForwarder(options: UndiciForwarderOptions = {}): Forwarder {
  const agent = new Agent({ connections: options.connections ?? 256, keepAliveTimeout: 4_000, connect: options.connect });
  return {
    forward(req: UpstreamRequest): Promise<UpstreamResult> {
      return new Promise((resolve) => {
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
        const chunks: Buffer[] = [];
        let size = 0;
        let timedOut = false;
        let settled = false;
        /** Set by onRequestStart: from then on the request may have been sent. */
        let abort: ((reason: Error) => void) | null = null;
        const finish = (result: UpstreamResult) => {
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
        // The deadline covers the whole exchange, response body included.
        const timer = setTimeout(() => {
          timedOut = true;
          if (abort !== null) abort(deadlinePassed());
          else fail(deadlinePassed());
        }, req.timeoutMs);
        const handler: Dispatcher.DispatchHandler = {
          onRequestStart(controller) {
            if (timedOut) controller.abort(deadlinePassed());
            else abort = (reason) => controller.abort(reason);
          },
          onResponseStart(_controller, statusCode, responseHeaders) {
            // 1xx informational answers come here first; never the answer.
            if (statusCode < 200) return;
            status = statusCode;
            headers = responseHeaders;
          },
          onResponseData(_controller, chunk) {
            chunks.push(chunk);
            size += chunk.length;
          },
          onResponseEnd() {
            // A copy into a buffer of its own: the chunks are views into the
            // socket's reads, and Buffer.concat would use Node's shared pool
            // for small bodies.
            const body = new Uint8Array(size);
            let at = 0;
            for (const chunk of chunks) {
              body.set(chunk, at);
              at += chunk.length;
            }
            const list: [string, string][] = [];
            for (const name in headers) {
              const value = headers[name];
              if (value === undefined) continue;
              if (Array.isArray(value)) for (const v of value) list.push([name, v]);
              else list.push([name, value]);
            }
            finish({ kind: 'response', status, headers: list, body });
          },
          onResponseError(_controller, err) {
            fail(err);
          },
        };
        try {
          agent.dispatch(
            {
              origin: url.origin,
              path: url.search ? `${url.pathname}${url.search}` : url.pathname,
              method: req.method,
              headers: req.headers,
              body: req.body,
              headersTimeout: req.timeoutMs,
              bodyTimeout: req.timeoutMs,
            },
            handler,
          );
        } catch (err) {
          // undici reports invalid options through onResponseError; should it
          // throw instead, the answer is the one request() gave.
          fail(err);
        }
      });
    },
    async close() {
      await agent.close();
    },
  };
}

function errorCode(err: unknown): string {
  return causeCode(err) ?? (err as Error)?.name ?? 'error';
}
