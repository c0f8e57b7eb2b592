import type { RouteConfig } from '../config/schema.js';
import { ERROR_CODES, type ErrorCode } from '../protocol/codes.js';
import { renderProblem, retryAfterHeader, type Refusal, type RenderedError } from '../protocol/problem.js';
import type { Reply } from './inbound.js';

/** The error shape a route answers refusals in (DESIGN §5 `errors`). */
export type ErrorShape = RouteConfig['errors'];

type Renderer = (refusal: Refusal, problemBase: string) => RenderedError;

/**
 * Stripe's error `type` per refusal; anything not listed is
 * `invalid_request_error` (4xx) or `api_error` (5xx). Stripe's SDKs throw on
 * any JSON body with an `error` member, and stop retrying on
 * `Stripe-Should-Retry: false`, so a refusal can never pass for a charge.
 */
const STRIPE_TYPES: Partial<Record<ErrorCode, string>> = {
  'idempotency-key-reused': 'idempotency_error',
  'idempotency-in-progress': 'idempotency_error',
  'outcome-unknown': 'idempotency_error',
};

function renderStripe(refusal: Refusal): RenderedError {
  const spec = ERROR_CODES[refusal.code];
  const error = {
    type: STRIPE_TYPES[refusal.code] ?? (spec.status >= 500 ? 'api_error' : 'invalid_request_error'),
    code: refusal.code.replace(/-/g, '_'),
    message: `${spec.title}: ${refusal.detail}`,
    ...refusal.extras,
  };
  return {
    status: spec.status,
    headers: {
      'content-type': 'application/json',
      'stripe-should-retry': String(spec.retryable),
      ...retryAfterHeader(refusal),
    },
    body: JSON.stringify({ error }),
  };
}

/**
 * One renderer per shape: a new provider's shape is one entry here (and its
 * name in the config enum), not a new code path. Statuses are the same in
 * every shape (DESIGN §3.8); only the body and its hints differ.
 */
const RENDERERS: Record<ErrorShape, Renderer> = {
  problem: renderProblem,
  stripe: renderStripe,
};

/** Renders a refusal in the route's shape; refusals with no route (404 no-route, admin) use problem+json. */
export function renderRefusal(refusal: Refusal, shape: ErrorShape | null, problemBase: string): RenderedError {
  return RENDERERS[shape ?? 'problem'](refusal, problemBase);
}

/** The same, as the proxy's transport-neutral answer. */
export function toReply(rendered: RenderedError): Reply {
  return { status: rendered.status, headers: Object.entries(rendered.headers), body: rendered.body };
}

export function toResponse(rendered: RenderedError, extraHeaders: Record<string, string> = {}): Response {
  return new Response(rendered.body, { status: rendered.status, headers: { ...rendered.headers, ...extraHeaders } });
}

/** A refusal as a plain HTTP answer in the route's shape, with the gateway's request id among its members. */
export function httpRefusal(refusal: Refusal, shape: ErrorShape | null, problemBase: string, requestId: string): Reply {
  // Object.assign, not a spread and a property: the same object without V8's slow path (./pipeline/settle.ts finishOf).
  refusal.extras = Object.assign({}, refusal.extras, { request_id: requestId });
  return toReply(renderRefusal(refusal, shape, problemBase));
}
