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
 * Cloudflare's own error statuses, for an upstream behind Cloudflare. Its
 * edge never got an HTTP request through to the origin on 521 (connection
 * refused), 522 (TCP handshake timed out), 523 (origin unreachable), 525
 * (TLS handshake failed) and 526 (invalid origin certificate): refused. On
 * 520 (the origin answered something unusable) and 524 (the origin took the
 * request and did not answer in time) it may well have acted: unknown, not
 * an answer to store and replay. Trusted only with `server: cloudflare`, so
 * that an upstream's own odd status is passed through as its answer.
 */
const EDGE_NOT_SENT = new Set([521, 522, 523, 525, 526]);
const EDGE_MAYBE_SENT = new Set([520, 524]);

const IS_WORKERS = (globalThis as { navigator?: { userAgent?: string } }).navigator?.userAgent === 'Cloudflare-Workers';

export interface FetchForwarderOptions {
  /**
   * Content codings the runtime's `fetch` decodes by itself when the body is
   * read. The forwarder asks the upstream for these only, and drops
   * `content-encoding` (and `content-length`) from a response it decoded, so
   * that stored and forwarded responses never claim an encoding their bytes
   * no longer have. Default: `gzip, br` on Workers (workerd leaves `deflate`
   * and `x-gzip` encoded), `gzip, x-gzip, deflate, br` elsewhere (undici).
   */
  decodedEncodings?: readonly string[];
  /** The `fetch` to use. Default `globalThis.fetch`. */
  fetch?: (request: Request) => Promise<Response>;
  /**
   * Test only (a negative control): classifies what `fetch` threw instead of
   * `classifyFetchError`, e.g. to show that a test catches a classification
   * that would call a reset after sending "refused".
   * @internal
   */
  classifyError?: (err: unknown, timedOut: boolean) => UpstreamResult;
}

/**
 * The forwarder for runtimes with only `fetch` (Cloudflare Workers).
 *
 * What `fetch` can and cannot tell (DESIGN §3.7: released vs outcome_unknown):
 *
 * - It CAN tell a response (any status, stored as the upstream's answer) and
 *   a timeout (our `AbortSignal`: `unknown`, `timedOut`).
 * - On Workers it CANNOT tell "connection refused" from "reset after the
 *   request was sent". Probed under workerd (test/workers/upstream-errors.workerd.ts,
 *   docs/deploy-workers.md has the table): a refused connect, a reset on
 *   accept, and an RST or FIN after the whole request arrived all throw the
 *   same `Error` with message `Network connection lost.` and own property
 *   `retryable: true`, no `code`, no `cause`; workerd reads the
 *   request body in every one of them (a stream is pulled even when the
 *   connect is refused). A failed DNS lookup, an untrusted TLS certificate
 *   and an answer that is not HTTP (the upstream had the request) all throw
 *   `internal error; reference = <id>` (no own property). Behind a proxy
 *   worker (Miniflare's default outbound, so `wrangler dev`) both also carry
 *   `remote: true`, the mark of an error tunnelled from another worker;
 *   nothing here reads it. `retryable` is
 *   workerd's "the connection broke", not "nothing was delivered". The one
 *   difference is in workerd's own log (`connect(): Connection refused`),
 *   which the Worker cannot read. So every thrown error is `unknown` (a 504,
 *   the record `outcome_unknown`): never a blind re-send, at the price of an
 *   operator or an `onUnknown: "retry"` route when the upstream was merely
 *   down.
 * - Two cases are known to be "nothing sent", hence `refused` (502, record
 *   released, retry safe): a Node-style error code of a failed connect
 *   (Node's own `fetch`: ECONNREFUSED, a DNS failure, a connect timeout), and
 *   Cloudflare's edge statuses 521/522/523/525/526 with `server: cloudflare`
 *   (an upstream proxied by Cloudflare whose origin never got the request).
 *   Its 520 and 524 are `unknown`.
 *
 * The body is read chunk by chunk and counted (decoded bytes, the ones
 * stored): past `maxResponseBytes` the stream is cancelled and the answer is
 * `too-large`. A passed `startBy` is checked just before `fetch` is called.
 *
 * Redirects are passed through, never followed (`redirect: "manual"`): the
 * caller decides whether to repeat a side effect elsewhere. Cloudflare's
 * `cf-*` request headers describe the client's hop to the edge and are not
 * forwarded (a subrequest may not set some of them).
 */
export function createFetchForwarder(options: FetchForwarderOptions = {}): Forwarder {
  const decoded = new Set((options.decodedEncodings ?? (IS_WORKERS ? ['gzip', 'br'] : ['gzip', 'x-gzip', 'deflate', 'br'])).map((e) => e.toLowerCase()));
  const acceptEncoding = [...decoded].join(', ');
  const doFetch = options.fetch ?? ((input: Request) => globalThis.fetch(input));
  const classify = options.classifyError ?? classifyFetchError;

  type StreamIf = (status: number, headers: [string, string][]) => boolean;
  const run = async (req: UpstreamRequest, streamIf: StreamIf | null): Promise<UpstreamResult | StreamedAnswer> => {
    // A timer of our own rather than AbortSignal.timeout: a streamed answer's body outlives the deadline.
    const deadline = new AbortController();
    const timer = setTimeout(() => deadline.abort(new DOMException('the upstream deadline passed', 'TimeoutError')), req.timeoutMs);
    const signal = deadline.signal;
    try {
      let request: Request;
      try {
        const headers = new Headers();
        for (const [name, value] of Object.entries(req.headers)) {
          if (name.toLowerCase().startsWith('cf-')) continue;
          headers.set(name, value);
        }
        // The gateway reads (and stores) the body itself: ask only for codings
        // the runtime will decode, so the bytes we keep are the plain ones.
        headers.set('accept-encoding', acceptEncoding);
        // The body is the buffered Uint8Array, never a JS ReadableStream: for
        // one, workerd's own pump rejects on a refused connect where no code
        // can catch it (an "uncaught exception" in its log); fetch's rejection
        // already says all there is (test/workers/workerd-output.test.ts).
        request = new Request(req.url, { method: req.method, headers, body: req.body, redirect: 'manual', signal });
      } catch (err) {
        // Refused by the Request constructor (bad URL, bad header): nothing left.
        return { kind: 'refused', error: `invalid-request: ${(err as Error).message}` };
      }
      // The last moment the gateway can still hold the request back.
      if (startDeadlinePassed(req, performance.now())) return { kind: 'refused', error: START_DEADLINE_PASSED };
      try {
        const res = await doFetch(request);
        const out: [string, string][] = [];
        res.headers.forEach((value, name) => out.push([name, value]));
        if (typeof res.headers.getSetCookie === 'function') {
          // forEach joins repeated Set-Cookie fields in some runtimes; keep them apart.
          const cookies = res.headers.getSetCookie();
          if (cookies.length > 0) {
            const rest = out.filter(([n]) => n.toLowerCase() !== 'set-cookie');
            out.length = 0;
            out.push(...rest, ...cookies.map((c): [string, string] => ['set-cookie', c]));
          }
        }
        if (res.headers.get('server')?.toLowerCase() === 'cloudflare') {
          const edge = EDGE_NOT_SENT.has(res.status) ? 'refused' : EDGE_MAYBE_SENT.has(res.status) ? 'unknown' : null;
          if (edge !== null) {
            void res.body?.cancel().catch(() => {});
            if (edge === 'refused') return { kind: 'refused', error: `cloudflare-${res.status}` };
            return { kind: 'unknown', error: `cloudflare-${res.status}`, timedOut: res.status === 524 };
          }
        }
        const headers = withoutDecodedEncoding(out, decoded);
        if (streamIf !== null && streamIf(res.status, headers))
          return { kind: 'stream', status: res.status, headers, body: res.body ?? new ReadableStream({ start: (c) => c.close() }) };
        const body = await readLimited(res, req.maxResponseBytes, headers);
        if (body === null) return { kind: 'too-large', status: res.status, limit: req.maxResponseBytes };
        return { kind: 'response', status: res.status, headers, body };
      } catch (err) {
        // Thrown by fetch itself, or while reading the answer's body.
        return classify(err, signal.aborted);
      }
    } finally {
      clearTimeout(timer);
    }
  };
  return {
    forward: (req) => run(req, null) as Promise<UpstreamResult>,
    forwardStreaming: (req, streamIf) => run(req, streamIf),
  };
}

/**
 * What an error thrown by `fetch` (or by reading its answer) means for the
 * record: `refused` only for a Node-style code that only a failed connect
 * raises; everything else, workerd's errors included (see above), `unknown`.
 */
export function classifyFetchError(err: unknown, timedOut: boolean): UpstreamResult {
  const code = errorCode(err);
  if (CONNECT_ONLY_CODES.has(code)) return { kind: 'refused', error: code };
  return { kind: 'unknown', error: timedOut ? 'timeout' : code, timedOut };
}

/**
 * The body, or null once it would pass `limit` (the stream is then
 * cancelled: no more is read). A `content-length` over the limit refuses it
 * before any read, but only with no content coding left on the answer: the
 * runtime may decode a coding without saying so, and the limit counts the
 * bytes read here (the ones stored), which only reading tells then.
 */
async function readLimited(res: Response, limit: number, headers: [string, string][]): Promise<Uint8Array | null> {
  if (res.body === null) return new Uint8Array(0);
  const encoded = headers.some(([n]) => n.toLowerCase() === 'content-encoding');
  const declared = encoded ? null : declaredLength(headers.find(([n]) => n.toLowerCase() === 'content-length')?.[1]);
  if (declared !== null && declared > limit) {
    void res.body.cancel().catch(() => {});
    return null;
  }
  const body = new BodyBuffer(limit, declared);
  const reader = res.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return body.take();
    if (!body.add(value)) {
      // Not awaited: a stalled upstream must not hold the answer back.
      void reader.cancel().catch(() => {});
      return null;
    }
  }
}

/**
 * `fetch` hands back the decoded bytes but keeps the upstream's
 * `content-encoding`; drop it (and the encoded length) when every coding
 * listed is one the runtime decoded. Any other coding is left as it is,
 * with its bytes untouched.
 */
function withoutDecodedEncoding(headers: [string, string][], decoded: ReadonlySet<string>): [string, string][] {
  const ce = headers.find(([n]) => n.toLowerCase() === 'content-encoding');
  if (ce === undefined) return headers;
  const codings = ce[1]
    .split(',')
    .map((c) => c.trim().toLowerCase())
    .filter((c) => c !== '' && c !== 'identity');
  if (!codings.every((c) => decoded.has(c))) return headers;
  return headers.filter(([n]) => {
    const lower = n.toLowerCase();
    return lower !== 'content-encoding' && lower !== 'content-length';
  });
}

function errorCode(err: unknown): string {
  const code = causeCode(err);
  if (code !== null) return code;
  const message = (err as Error)?.message;
  return typeof message === 'string' && message !== '' ? message : ((err as Error)?.name ?? 'error');
}
