import type { RouteConfig } from '../../config/schema.js';
import type { JsonRpcId } from '../../protocol/mcp.js';
import type { Forwarder, StreamedAnswer, UpstreamResult } from '../forward.js';
import type { Exchange } from '../pipeline/exchange.js';
import { joinUrl, upstreamHeaders, type UpstreamHeaderDeps } from '../upstream-request.js';
import { isEventStream, mcpUpstreamHeaders } from './outcome.js';
import { SseSplitter, type SseEvent } from './sse.js';
import { parseData, pump, roleIn, type PumpEnd } from './stream.js';

// A decided tools/call whose answer comes on another stream than its POST's
// (docs/mcp.md "Resumed streams", DESIGN §3.7): Streamable HTTP lets a
// server close a request's event stream before the response (SSE polling,
// MCP 2025-11-25: the `retry:` field tells the client when to come back)
// and a client resume it with `GET` and `Last-Event-ID`; the response then
// comes on the GET. The gateway ties such a GET to the call it resumes, and
// resumes a closed stream itself, so the answer is recorded under the
// call's key as if the POST had carried it. What the live process knows is
// in memory, bounded (InFlightCalls); a gateway that crashed mid-call left
// the record outcome_unknown, which reconciliation covers (DESIGN §3.12).

/** At most this many calls watched at once per process (the oldest is forgotten: its GETs pass untied, its cancels are forwarded). */
export const MAX_WATCHED_CALLS = 10_000;
/** At most this many event ids remembered per call (the newest: a client resumes from the last it saw). */
export const MAX_EVENT_IDS = 64;
/** The gateway resumes one call's stream at most this many times (within the call's deadline). */
export const MAX_RESUMES = 100;
/** A hinted reconnection time below this is waited this long (a server that closes at once with `retry: 0` is not asked in a tight loop). */
export const MIN_RESUME_DELAY_MS = 50;

/** The answer to a call, as it came on some stream: its JSON-RPC text and the whole event. */
export interface Answer {
  data: string;
  event: SseEvent;
}

/** One decided tools/call in flight, as this process knows it. */
export class CallWatch {
  /** The event ids seen on the call's streams (the POST's, and the resumed ones), newest last. */
  readonly eventIds: string[] = [];
  /** The last event id of the call's stream, and the last `retry:` hint (ms). */
  lastEventId: string | null = null;
  retryMs: number | null = null;
  /** Live client GETs tied to the call (the gateway does not resume while one is: it would take the stream from it). */
  clientResumes = 0;
  /** Set once the answer came on a tied GET. */
  answer: Answer | null = null;
  private readonly stopper = new AbortController();
  private answered!: () => void;
  /** Resolves when the answer came on a tied GET. */
  readonly answeredElsewhere = new Promise<void>((r) => void (this.answered = r));
  private markDone!: () => void;
  /** Resolves once the call's outcome is recorded (or given up): a tied GET passes the answer on only then. */
  readonly done = new Promise<void>((r) => void (this.markDone = r));
  closed = false;

  constructor(
    readonly session: string,
    readonly id: JsonRpcId,
    /** `performance.now()` past which the call is forgotten (its lock's end, at the latest). */
    public expiresAt: number,
    private readonly calls: InFlightCalls,
  ) {}

  /** Once the call is sent: watched until `ms` from now (what is left of its deadline and lock). */
  extend(ms: number): void {
    this.expiresAt = Math.max(this.expiresAt, performance.now() + ms);
  }

  /** Stops the reading of the call's own stream once the answer came elsewhere. */
  get stop(): AbortSignal {
    return this.stopper.signal;
  }

  /** An event of one of the call's streams: its id becomes a point a client may resume from. */
  saw(event: SseEvent): void {
    if (event.retry !== null) this.retryMs = event.retry;
    if (event.id === null || this.closed) return;
    this.lastEventId = event.id;
    this.calls.index(this, event.id);
  }

  /** A tied GET ended, or got no stream. */
  untie(): void {
    if (this.clientResumes > 0) this.clientResumes--;
  }

  /** The answer, read on a tied GET: the first one counts. */
  deliver(answer: Answer): boolean {
    if (this.closed || this.answer !== null) return false;
    this.answer = answer;
    this.stopper.abort();
    this.answered();
    return true;
  }

  /** The outcome is recorded (or the call given up): forgotten, and a tied GET holding the answer lets it go. */
  close(): void {
    if (!this.closed) this.calls.forget(this);
    this.closed = true;
    this.markDone();
  }
}

/**
 * The decided calls in flight of one process, by session: by JSON-RPC id (a
 * `notifications/cancelled` names it) and by the event ids seen on their
 * streams (a resuming GET names one in `Last-Event-ID`). Only calls with an
 * `Mcp-Session-Id` are watched: without a session there is no stream to
 * resume and no cancel a server could tie to the call. Bounded: at most
 * MAX_WATCHED_CALLS calls, MAX_EVENT_IDS ids each; a call is forgotten when
 * its outcome is recorded, or at the latest past its lock.
 */
export class InFlightCalls {
  private readonly calls = new Map<string, CallWatch>();
  private readonly events = new Map<string, CallWatch>();

  /** Watches a call (null without a session, or while another call with the same session and id is watched). */
  open(session: string | null, id: JsonRpcId, lockMs: number): CallWatch | null {
    if (session === null || session === '' || id === null) return null;
    const now = performance.now();
    for (const [key, w] of this.calls) {
      if (w.expiresAt > now && this.calls.size < MAX_WATCHED_CALLS) break;
      this.calls.delete(key);
      w.close();
    }
    const key = requestKey(session, id);
    const live = this.calls.get(key);
    // A second call under the same session and id (a client that reuses ids) is not watched: the first keeps its ties.
    if (live !== undefined && !live.closed && live.expiresAt > now) return null;
    const watch = new CallWatch(session, id, now + lockMs, this);
    this.calls.set(key, watch);
    return watch;
  }

  /**
   * The live call `Last-Event-ID` resumes on this session, if this process
   * saw that id on one. The call counts the GET as live from now (the server
   * may move the call's stream to it before its head is back): the caller
   * ends that with `watchResumed`'s end, or `CallWatch.untie` when no stream came.
   */
  tiedTo(session: string | null, lastEventId: string | null): CallWatch | undefined {
    if (session === null || lastEventId === null) return undefined;
    const w = this.events.get(eventKey(session, lastEventId));
    if (w === undefined || w.closed || w.expiresAt <= performance.now()) return undefined;
    w.clientResumes++;
    return w;
  }

  /** The live call a `notifications/cancelled` for `requestId` on this session names. */
  cancelled(session: string | null, requestId: JsonRpcId): CallWatch | undefined {
    if (session === null || requestId === null) return undefined;
    const w = this.calls.get(requestKey(session, requestId));
    return w !== undefined && !w.closed && w.expiresAt > performance.now() ? w : undefined;
  }

  /** @internal CallWatch.saw */
  index(watch: CallWatch, eventId: string): void {
    const key = eventKey(watch.session, eventId);
    if (this.events.get(key) === watch) return;
    this.events.set(key, watch);
    watch.eventIds.push(eventId);
    if (watch.eventIds.length > MAX_EVENT_IDS) this.unindex(watch, watch.eventIds.shift()!);
  }

  /** @internal CallWatch.close */
  forget(watch: CallWatch): void {
    const key = requestKey(watch.session, watch.id);
    if (this.calls.get(key) === watch) this.calls.delete(key);
    for (const id of watch.eventIds) this.unindex(watch, id);
  }

  /** How many calls are watched (tests, and the bound). */
  get size(): number {
    return this.calls.size;
  }

  private unindex(watch: CallWatch, eventId: string): void {
    const key = eventKey(watch.session, eventId);
    if (this.events.get(key) === watch) this.events.delete(key);
  }
}

const requestKey = (session: string, id: JsonRpcId) => `${session}\u0000${typeof id}\u0000${String(id)}`;
const eventKey = (session: string, eventId: string) => `${session}\u0000${eventId}`;

/**
 * What ties a request to the calls of its session (`Mcp-Session-Id`), or null
 * without one: the session id within the route, the endpoint and the
 * authenticated caller, so that a GET or a cancel on another route, endpoint
 * or caller that names the same session and event ids is never tied to the
 * call (its answer recorded under another's key, its cancel withheld).
 */
export function sessionOf(x: Exchange): string | null {
  const session = x.req.headers.get('mcp-session-id');
  if (session === null) return null;
  return `${x.route?.name ?? ''}\u0000${x.pathname}${x.search}\u0000${x.caller ?? ''}\u0000${session}`;
}

/**
 * The request id a `notifications/cancelled` names, when `body` is one
 * (a single message, not a batch); undefined otherwise.
 */
export function cancelledRequestId(body: Uint8Array): JsonRpcId | undefined {
  // Cheap first: almost every message is not a cancel.
  const text = new TextDecoder().decode(body);
  if (!text.includes('notifications/cancelled')) return undefined;
  const msg = parseData(text) as { method?: unknown; id?: unknown; params?: { requestId?: unknown } } | undefined;
  if (msg === null || typeof msg !== 'object' || Array.isArray(msg)) return undefined;
  if (msg.method !== 'notifications/cancelled' || 'id' in msg) return undefined;
  const requestId = msg.params?.requestId;
  return typeof requestId === 'string' || (typeof requestId === 'number' && Number.isInteger(requestId)) ? requestId : undefined;
}

/** The gateway's own resuming GET to the upstream, for the call `x` (its session, its credentials). */
export type ResumeUpstream = (x: Exchange, lastEventId: string, timeoutMs: number) => Promise<UpstreamResult | StreamedAnswer>;

/**
 * The resuming GET: to the call's URL, with the headers its POST had upstream
 * (the session, the protocol version, the route's credentials), without the
 * body's, `Accept: text/event-stream` and the `Last-Event-ID`.
 */
export function createUpstreamResume(deps: UpstreamHeaderDeps & { forwarder: Forwarder }): ResumeUpstream | undefined {
  const { forwarder } = deps;
  if (forwarder.forwardStreaming === undefined) return undefined;
  return (x, lastEventId, timeoutMs) => {
    const route: RouteConfig = x.route!;
    const headers = mcpUpstreamHeaders(upstreamHeaders(x.req.headers, route, deps, { requestId: x.requestId, entity: null, fence: null }));
    for (const name of Object.keys(headers)) {
      const n = name.toLowerCase();
      if (n === 'content-type' || n === 'content-length' || n === 'content-encoding' || n === 'transfer-encoding' || n === 'accept' || n === 'last-event-id')
        delete headers[name];
    }
    headers.accept = 'text/event-stream';
    headers['last-event-id'] = lastEventId;
    return forwarder.forwardStreaming!(
      { url: joinUrl(route.upstream, x.pathname + x.search), method: 'GET', headers, body: null, timeoutMs, maxResponseBytes: route.maxResponseBytes },
      (status, h) => status === 200 && isEventStream(h),
    );
  };
}

/**
 * Reads a decided call's event stream to the call's answer, across the
 * streams that carry it: the POST's; a GET of the client's tied to it (the
 * answer handed over by `watchResumed`); and, when the server closed the
 * stream before the answer (with an event id to resume from), the gateway's
 * own GET with `Last-Event-ID`, after the `retry:` the server asked for, as
 * long as `deadline` (the call's, within its lock) allows. Every event goes to
 * `forward` as it comes; the answer is returned, not forwarded (./stream.ts pump).
 */
export async function follow(
  first: ReadableStream<Uint8Array>,
  call: { id: JsonRpcId },
  options: {
    limit: number;
    deadline: number;
    forward: (event: SseEvent) => void;
    watch: CallWatch | null;
    resume: ((lastEventId: string, timeoutMs: number) => Promise<UpstreamResult | StreamedAnswer>) | null;
    /** Each resume the gateway makes, for the log line. */
    resumed?: () => void;
  },
): Promise<PumpEnd> {
  const { watch } = options;
  const left = () => options.deadline - performance.now();
  const elsewhere = (): PumpEnd | null => (watch?.answer ? { kind: 'final', data: watch.answer.data, event: watch.answer.event } : null);
  const timedOut: PumpEnd = { kind: 'ended', error: 'timeout', timedOut: true };
  let body: ReadableStream<Uint8Array> | null = first;
  for (let resumes = 0; ; resumes++) {
    if (body !== null) {
      const end = await pump(body, call.id, {
        limit: options.limit,
        timeoutMs: Math.max(1, left()),
        forward: options.forward,
        ...(watch !== null ? { seen: (e: SseEvent) => watch.saw(e), stop: watch.stop } : {}),
      });
      if (end.kind !== 'ended') return end;
      const answered = elsewhere();
      if (answered !== null) return answered;
      if (end.timedOut || watch === null) return end;
      body = null;
      // A client's GET holds the stream: its answer is waited for, not taken from it.
      if ((await clientHolds(watch, left)) === 'answered') return elsewhere()!;
      if (left() <= 0) return timedOut;
      if (options.resume === null || watch.lastEventId === null || resumes >= MAX_RESUMES) return end;
    }
    const delay = Math.max(MIN_RESUME_DELAY_MS, watch!.retryMs ?? 0);
    if (delay >= left()) {
      // The server asks for a reconnection after the call's deadline: the answer is not read in time.
      if (await until(watch!.answeredElsewhere, left())) return elsewhere()!;
      return timedOut;
    }
    if (await until(watch!.answeredElsewhere, delay)) return elsewhere()!;
    if ((await clientHolds(watch!, left)) === 'answered') return elsewhere()!;
    if (left() <= 0) return timedOut;
    options.resumed?.();
    let result: UpstreamResult | StreamedAnswer;
    try {
      result = await options.resume!(watch!.lastEventId!, Math.max(1, left()));
    } catch {
      return { kind: 'ended', error: 'resume-failed', timedOut: false };
    }
    if (result.kind === 'stream') {
      body = result.body;
      continue;
    }
    if (result.kind === 'unknown' && result.timedOut) return timedOut;
    return { kind: 'ended', error: `resume-failed (${result.kind === 'response' ? `status ${result.status}` : result.kind})`, timedOut: false };
  }
}

/**
 * While a client's GET tied to the call is live: waits for the answer it
 * carries ('answered'), or until it is gone ('gone': the gateway may resume
 * itself) or the deadline passed.
 */
async function clientHolds(watch: CallWatch, left: () => number): Promise<'answered' | 'gone'> {
  while (watch.clientResumes > 0 && left() > 0) {
    if (await until(watch.answeredElsewhere, Math.min(left(), 200))) return 'answered';
  }
  return watch.answer !== null ? 'answered' : 'gone';
}

/** True when `promise` settles within `ms`. */
async function until(promise: Promise<void>, ms: number): Promise<boolean> {
  if (ms <= 0) return false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<boolean>((r) => (timer = setTimeout(() => r(false), ms)));
  try {
    return await Promise.race([promise.then(() => true), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A client's GET that resumes a watched call's stream: passed on event by
 * event as the events complete; each event's id becomes one the client may
 * resume from again; the call's answer is handed to the call
 * (`watch.deliver`, which records it under the call's key) and passed on once
 * the outcome is recorded, as a POST's answer is (./stream.ts pump). An event
 * over `limit` ends the stream (it could not be read).
 */
export function watchResumed(body: ReadableStream<Uint8Array>, watch: CallWatch, limit: number): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  const splitter = new SseSplitter(limit);
  const encoder = new TextEncoder();
  // Counted from the GET's arrival (InFlightCalls.tiedTo) until the stream ends.
  let live = true;
  const leave = () => {
    if (live) watch.untie();
    live = false;
  };
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      for (;;) {
        let next: Awaited<ReturnType<typeof reader.read>>;
        try {
          next = await reader.read();
        } catch (err) {
          leave();
          controller.error(err);
          return;
        }
        const events = next.done ? splitter.end() : splitter.push(next.value);
        if (events === null) {
          leave();
          void reader.cancel().catch(() => {});
          controller.close();
          return;
        }
        let out = '';
        for (const e of events) {
          watch.saw(e);
          if (roleIn(e, watch.id) === 'answer' && watch.deliver({ data: e.data!, event: e })) {
            if (out !== '') controller.enqueue(encoder.encode(out));
            out = '';
            // Recorded first, then passed on: a client that saw it and retries gets the replay.
            await watch.done;
          }
          out += e.raw;
        }
        if (out !== '') controller.enqueue(encoder.encode(out));
        if (next.done) {
          leave();
          controller.close();
          return;
        }
        if (out !== '') return;
      }
    },
    cancel(reason) {
      leave();
      return reader.cancel(reason).catch(() => {});
    },
  });
}
