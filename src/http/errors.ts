import type { RouteConfig } from '../config/schema.js';
import { renderProblem, type Refusal, type RenderedError } from '../protocol/problem.js';

/** The error shape a route answers refusals in (DESIGN §5 `errors`). */
export type ErrorShape = RouteConfig['errors'];

/** Renders a refusal in the route's shape; refusals with no route (404 no-route, admin) use problem+json. */
export function renderRefusal(refusal: Refusal, shape: ErrorShape | null, problemBase: string): RenderedError {
  switch (shape) {
    case 'stripe': // filled in by the SDK-compatibility work; problem+json until then
    case 'problem':
    case null:
      return renderProblem(refusal, problemBase);
  }
}

export function toResponse(rendered: RenderedError, extraHeaders: Record<string, string> = {}): Response {
  return new Response(rendered.body, { status: rendered.status, headers: { ...rendered.headers, ...extraHeaders } });
}
