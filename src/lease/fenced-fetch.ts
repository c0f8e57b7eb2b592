/**
 * `fencedFetch` and `step`: every external action a handler takes carries
 * the lease's fence, and none starts unless the lease is confirmed for at
 * least one more heartbeat interval (DESIGN §3, §6).
 */
import { randomUUID } from 'node:crypto';
import { neverConnected } from '../protocol/connect-errors.js';
import { LeaseError, LeaseLostError, OutcomeUnknownError } from './errors.js';
import type { InFlightRequest, LeaseEvent } from './events.js';
import { startToolSpan } from './tracing.js';

/** Header names; the gateway's defaults (configurable per route there, so here too). */
export interface FenceHeaderNames {
  fence: string;
  entity: string;
  idempotencyKey: string;
  requestId: string;
}

export const DEFAULT_FENCE_HEADERS: FenceHeaderNames = {
  fence: 'X-Execution-Fence',
  entity: 'X-Fence-Entity',
  idempotencyKey: 'Idempotency-Key',
  requestId: 'X-Request-Id',
};

/** The claims of a signed fence (DESIGN §7): entity, token, worker, expiry in epoch seconds. */
export interface FenceClaims {
  ent: string;
  fence: number;
  sub: string;
  /** The lease end (database time) in epoch seconds; the signer adds its grace. */
  exp: number;
}

/**
 * Turns fence claims into the header value, e.g. a compact JWS. The seam for
 * signed fences; without one the header is the decimal token.
 */
export type FenceSigner = (claims: FenceClaims) => string | Promise<string>;

/**
 * What `fencedFetch` and `step` need to know about the lease they act for.
 * A narrow context, so they can be tested with a plain object.
 */
export interface FenceContext {
  workerId: string;
  jobId: number;
  kind: string;
  fencingToken: number;
  /**
   * The job's key (`Lease.jobKey`, `tool-job:<storeId>:<id>`): every step's
   * `Idempotency-Key` is `<jobKey>:<step>`, so two job stores behind one
   * gateway never share a key.
   */
  jobKey: string;
  fenceKey: string;
  /** Aborts when the lease is lost or the attempt ends. */
  signal: AbortSignal;
  /** The latest lease end the database confirmed. */
  leaseUntil(): Date;
  /** Throws `LeaseLostError` or `OwnershipUnknownError` when no new external action may start. */
  assertCanStart(): void;
  /**
   * How long from now the attempt could wait and still start an action
   * after it, by the lease confirmed so far (heartbeats to come are not
   * counted): the confirmed lease left less one heartbeat, on the monotonic
   * clock `assertCanStart` uses. Absent (a plain test context): `leaseUntil()`
   * less the local wall clock stands in.
   */
  waitableMs?(): number;
  /**
   * The gateway refused our fence: the lease is lost. `refusal` says which
   * answer it was (`fence-expired`: a signed fence past its `exp`).
   */
  markLost(cause: 'stale_fence', refusal?: FenceRefusal): void;
  emit(event: LeaseEvent): void;
  /**
   * An external action has started; the returned function is called when it
   * settles (an answer, or an error). The runner keeps the list, so that its
   * `ownership_unknown` event can name the requests in flight.
   */
  started?(request: InFlightRequest): () => void;
}

export interface FenceOptions {
  fetch?: typeof fetch;
  headers?: Partial<FenceHeaderNames>;
  fenceSigner?: FenceSigner;
}

export interface FencedRequestInit extends RequestInit {
  /**
   * The step's name, stable across attempts: the `Idempotency-Key` is
   * `<jobKey>:<step>` (`tool-job:<storeId>:<id>:<step>`), so a retry of the
   * same step replays instead of repeating. Letters, digits and `._~:-`, up to 128.
   */
  step: string;
  /** Bounds the call; past it the outcome is unknown (`OutcomeUnknownError`). */
  timeoutMs?: number;
}

export type FencedFetch = (input: string | URL, init: FencedRequestInit) => Promise<Response>;

export interface StepContext {
  idempotencyKey: string;
  /** The fence header value (the token, or the signed fence). */
  fence: string;
  fenceKey: string;
  requestId: string;
  signal: AbortSignal;
}

export type StepFn = <T>(name: string, action: (ctx: StepContext) => Promise<T> | T) => Promise<T>;

const STEP_NAME = /^[A-Za-z0-9._~:-]{1,128}$/;

/**
 * `<jobKey>:<step>`. The job key carries the store's identity, so the same
 * job id in two job databases never yields the same key (docs/lease.md).
 */
function idempotencyKey(ctx: FenceContext, step: string): string {
  if (!STEP_NAME.test(step)) {
    throw new LeaseError('invalid_input', `step must match ${STEP_NAME} (it becomes part of the Idempotency-Key), got ${JSON.stringify(step)}`);
  }
  if (typeof ctx.jobKey !== 'string' || ctx.jobKey.length === 0) {
    // Never fall back to the job id alone: that key collides across job stores.
    throw new LeaseError('invalid_input', "the fence context has no jobKey (use the lease's jobKey)");
  }
  return `${ctx.jobKey}:${step}`;
}

export async function fenceValue(ctx: FenceContext, signer: FenceSigner | undefined): Promise<string> {
  if (!signer) return String(ctx.fencingToken);
  return signer({
    ent: ctx.fenceKey,
    fence: ctx.fencingToken,
    sub: ctx.workerId,
    exp: Math.floor(ctx.leaseUntil().getTime() / 1000),
  });
}

export type FenceRefusal = 'stale-fence' | 'fence-expired';

/** The header on a replay of an answer the gateway learned from the upstream's status endpoint (DESIGN §3.12). */
export const RECONCILED_HEADER = 'fencegate-reconciled';

/**
 * Waiting for reconciliation (DESIGN §3.12, §6.4): at most this many waits in
 * one `fencedFetch` call, each at most `MAX_RECONCILE_WAIT_MS`; every wait
 * must also end while the lease confirmed so far still covers the next send.
 */
export const MAX_RECONCILE_WAITS = 30;
export const MAX_RECONCILE_WAIT_MS = 60_000;

/**
 * The gateway's hint on a 409 outcome-unknown of a route with `reconcile`
 * (`reconciling: true` in the problem+json, or in the Stripe shape's
 * `error`, and `Retry-After` in seconds): how
 * long to wait before sending the same request again. Undefined for any other
 * answer, a 409 outcome-unknown without the hint included.
 */
async function reconcilingHint(res: Response): Promise<{ retryAfterMs: number } | undefined> {
  if (res.status !== 409 || !/json/i.test(res.headers.get('content-type') ?? '')) return undefined;
  const retryAfter = /^\d{1,9}$/.exec(res.headers.get('retry-after')?.trim() ?? '');
  if (retryAfter === null) return undefined;
  const body = (await res
    .clone()
    .json()
    .catch(() => null)) as { type?: unknown; reconciling?: unknown; error?: { code?: unknown; reconciling?: unknown } } | null;
  const problem = typeof body?.type === 'string' && body.type.endsWith('/outcome-unknown') && body.reconciling === true;
  // The route's Stripe error shape carries the same members under `error` (src/http/errors.ts).
  const stripe = body?.error?.code === 'outcome_unknown' && body.error.reconciling === true;
  return problem || stripe ? { retryAfterMs: Number(retryAfter[0]) * 1000 } : undefined;
}

/** A body `fetch` can send again unchanged; a stream cannot (it is consumed by the first send). */
function resendable(body: RequestInit['body']): boolean {
  return (
    body == null ||
    typeof body === 'string' ||
    body instanceof ArrayBuffer ||
    ArrayBuffer.isView(body) ||
    body instanceof Blob ||
    body instanceof URLSearchParams ||
    body instanceof FormData
  );
}

/** Sleeps `ms`, or rejects with the first of `signals` to abort (also ./mcp.ts's waits). */
export function sleep(ms: number, signals: AbortSignal[]): Promise<void> {
  const signal = AbortSignal.any(signals);
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

/** Which fence refusal this response is (problem+json or the gateway's Stripe shape), if any, and its body. */
async function isFenceRefusal(res: Response): Promise<{ body: unknown; code: FenceRefusal } | undefined> {
  if (res.status !== 409) return undefined;
  if (!/json/i.test(res.headers.get('content-type') ?? '')) return undefined;
  const body = (await res
    .clone()
    .json()
    .catch(() => null)) as { type?: unknown; error?: { code?: unknown } } | null;
  const m = typeof body?.type === 'string' ? /\/(stale-fence|fence-expired)$/.exec(body.type) : null;
  if (m) return { body, code: m[1] as FenceRefusal };
  if (body?.error?.code === 'stale_fence' || body?.error?.code === 'fence_expired')
    return { body, code: body.error.code === 'stale_fence' ? 'stale-fence' : 'fence-expired' };
  return undefined;
}

/**
 * The error text of a refused fence. `fence-expired` is not a newer owner:
 * the signed fence's `exp`, the lease end last confirmed when it was minted,
 * had passed (DESIGN §7), e.g. after a pause past the lease.
 */
export function fenceRefusalText(fence: number, entity: string, refusal: FenceRefusal | undefined, whose = 'a newer owner holds it'): string {
  if (refusal === 'fence-expired') {
    return `the gateway refused fence ${fence} for ${entity} as expired (fence-expired): the signed fence's exp, the lease end last confirmed when it was minted, had passed`;
  }
  return `the gateway refused fence ${fence} for ${entity}: ${whose}`;
}

/** The fields every event of a fenced call carries (as ./runner/attempt.ts `fields` for the attempt's own). */
function eventFields(ctx: FenceContext) {
  return { at: new Date(), workerId: ctx.workerId, jobId: ctx.jobId, kind: ctx.kind, fencingToken: ctx.fencingToken };
}

/**
 * Builds the handler's `fencedFetch`. Each call checks the lease, adds
 * `X-Execution-Fence`, `X-Fence-Entity`, `Idempotency-Key` and
 * `X-Request-Id`, aborts with the lease, and turns the gateway's
 * `stale-fence` answer into lease loss.
 *
 * @example
 * const res = await fencedFetch('http://127.0.0.1:8080/payments/charges', {
 *   step: 'charge', method: 'POST', body: JSON.stringify({ amount: 1200 }),
 *   headers: { 'content-type': 'application/json' }, timeoutMs: 10_000,
 * });
 */
export function createFencedFetch(ctx: FenceContext, options: FenceOptions = {}): FencedFetch {
  const names = { ...DEFAULT_FENCE_HEADERS, ...options.headers };
  const doFetch = options.fetch ?? fetch;

  return async function fencedFetch(input, init) {
    const { step, timeoutMs, signal: callerSignal, headers: callerHeaders, ...rest } = init;
    const key = idempotencyKey(ctx, step);
    ctx.assertCanStart();
    let fence = await fenceValue(ctx, options.fenceSigner);
    // Re-check: a signer may await, and the lease may have changed meanwhile.
    ctx.assertCanStart();

    const headers = new Headers(callerHeaders);
    headers.set(names.fence, fence);
    headers.set(names.entity, ctx.fenceKey);
    headers.set(names.idempotencyKey, key);
    const requestId = headers.get(names.requestId) ?? randomUUID();
    headers.set(names.requestId, requestId);

    const url = new URL(input);
    const method = (rest.method ?? 'GET').toUpperCase();

    ctx.emit({
      type: 'tool_request_started',
      ...eventFields(ctx),
      step,
      idempotencyKey: key,
      requestId,
      method,
      url: url.origin + url.pathname,
    });

    // A 409 outcome-unknown with the gateway's hint is waited out and the same
    // request (key, fence, entity, body) sent again, while the lease confirmed
    // so far covers the wait and the next send (DESIGN §3.12, §6.4).
    const canResend = resendable(rest.body);
    for (let waits = 0; ; waits++) {
      const res = await send(headers);
      const hint = canResend && waits < MAX_RECONCILE_WAITS ? await reconcilingHint(res) : undefined;
      if (hint === undefined || hint.retryAfterMs > MAX_RECONCILE_WAIT_MS || hint.retryAfterMs >= waitable()) {
        if (res.headers.get(RECONCILED_HEADER) === 'true') {
          ctx.emit({
            type: 'outcome_reconciled',
            ...eventFields(ctx),
            step,
            idempotencyKey: key,
            requestId,
            waits,
          });
        }
        return res;
      }
      await res.body?.cancel().catch(() => {});
      try {
        await sleep(
          hint.retryAfterMs,
          [ctx.signal, callerSignal].filter((s): s is AbortSignal => s != null),
        );
      } catch (err) {
        if (ctx.signal.aborted) throw ctx.signal.reason instanceof Error ? ctx.signal.reason : new LeaseLostError('the lease ended', { cause: err });
        throw err;
      }
      // The resend is a new external action: the same gate as the first one. A signed
      // fence is minted again (same token, the lease end confirmed now as its exp).
      ctx.assertCanStart();
      if (options.fenceSigner) {
        fence = await fenceValue(ctx, options.fenceSigner);
        ctx.assertCanStart();
        headers.set(names.fence, fence);
      }
    }

    /** How long the attempt may still wait (FenceContext.waitableMs). */
    function waitable(): number {
      return ctx.waitableMs?.() ?? ctx.leaseUntil().getTime() - Date.now();
    }

    /** One send: bounded by `timeoutMs`, aborted with the lease; a fence refusal ends the lease. */
    async function send(headers: Headers): Promise<Response> {
      const timeout = timeoutMs === undefined ? undefined : AbortSignal.timeout(timeoutMs);
      const signals = [ctx.signal, callerSignal, timeout].filter((s): s is AbortSignal => s != null);
      const settled = ctx.started?.({ step, idempotencyKey: key, requestId, startedAt: new Date() });
      const span = startToolSpan({ ...ctx, step, idempotencyKey: key, requestId, method, url });
      span.inject(headers);
      let res: Response;
      try {
        // Redirects are not followed unless the caller asks: a followed one
        // would send the command, with its fence, entity and key, to wherever
        // Location points, past the gateway; and a failure of that second hop
        // could read as "nothing was sent" although the first one had it. The
        // handler gets the 3xx answer.
        res = await doFetch(url, { ...rest, redirect: rest.redirect ?? 'manual', headers, signal: AbortSignal.any(signals) });
      } catch (err) {
        settled?.();
        span.end(null, err);
        if (ctx.signal.aborted) throw ctx.signal.reason instanceof Error ? ctx.signal.reason : new LeaseLostError('the lease ended', { cause: err });
        if (callerSignal?.aborted) throw err;
        if (timeout?.aborted) {
          throw new OutcomeUnknownError(`step ${step}: no answer within ${timeoutMs} ms; the request may have taken effect, retry only with the same step`, {
            cause: err,
          });
        }
        // With redirects followed, a connect that failed may have been the
        // second hop's, after the first one had the request.
        if (rest.redirect !== 'follow' && neverConnected(err)) throw err;
        throw new OutcomeUnknownError(`step ${step}: the request failed after it may have been sent`, { cause: err });
      }
      settled?.();

      const refusal = await isFenceRefusal(res);
      span.end(res.status, undefined, refusal !== undefined ? 'stale-fence' : res.headers.get('idempotent-replayed') === 'true' ? 'replayed' : undefined);
      if (refusal !== undefined) {
        ctx.markLost('stale_fence', refusal.code);
        throw new LeaseLostError(fenceRefusalText(ctx.fencingToken, ctx.fenceKey, refusal.code), { cause: refusal.body });
      }
      return res;
    }
  };
}

/**
 * Builds the handler's `step`: the same lease check and event as
 * `fencedFetch`, for an external action that is not an HTTP call through the
 * gateway (an SDK, an e-mail): the action gets the idempotency key and fence
 * to pass on.
 *
 * @example
 * await step('receipt', ({ idempotencyKey }) => mailer.send(receipt, { idempotencyKey }));
 */
export function createStep(ctx: FenceContext, options: FenceOptions = {}): StepFn {
  return async function step(name, action) {
    const key = idempotencyKey(ctx, name);
    ctx.assertCanStart();
    const fence = await fenceValue(ctx, options.fenceSigner);
    ctx.assertCanStart();
    const requestId = randomUUID();
    ctx.emit({
      type: 'tool_request_started',
      ...eventFields(ctx),
      step: name,
      idempotencyKey: key,
      requestId,
    });
    const settled = ctx.started?.({ step: name, idempotencyKey: key, requestId, startedAt: new Date() });
    const span = startToolSpan({ ...ctx, step: name, idempotencyKey: key, requestId });
    let error: unknown;
    try {
      return await action({ idempotencyKey: key, fence, fenceKey: ctx.fenceKey, requestId, signal: ctx.signal });
    } catch (err) {
      throw (error = err);
    } finally {
      settled?.();
      span.end(null, error);
    }
  };
}
