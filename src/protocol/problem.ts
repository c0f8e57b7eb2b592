import { ERROR_CODES, type ErrorCode } from './codes.js';

/** Where problem `type` URIs point: `<base><code>`, e.g. `/_fencegate/problems/stale-fence`. */
export const DEFAULT_PROBLEM_BASE = '/_fencegate/problems/';

/** Fields that help the caller act on a refusal (DESIGN §3.8). */
export interface ProblemExtras {
  entity?: string | null;
  presented_fence?: string | null;
  current_fence?: string | null;
  /** Seconds. */
  retry_after?: number;
  request_id?: string;
  [field: string]: unknown;
}

/** A refusal, before it is rendered in the route's error shape. */
export interface Refusal {
  code: ErrorCode;
  detail: string;
  extras?: ProblemExtras;
}

export interface RenderedError {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/**
 * RFC 9457 problem details. `type` is a URI reference ending in the code;
 * by default relative to the gateway, which serves a description there.
 */
export function renderProblem(refusal: Refusal, base = DEFAULT_PROBLEM_BASE): RenderedError {
  const spec = ERROR_CODES[refusal.code];
  const body = {
    type: `${base}${refusal.code}`,
    title: spec.title,
    status: spec.status,
    detail: refusal.detail,
    ...dropUndefined(refusal.extras ?? {}),
  };
  return {
    status: spec.status,
    headers: { 'content-type': 'application/problem+json', ...retryAfterHeader(refusal) },
    body: JSON.stringify(body),
  };
}

/** `Retry-After` (RFC 9110 §10.2.3, delay-seconds) where a retry can succeed. */
export function retryAfterHeader(refusal: Refusal): Record<string, string> {
  const s = refusal.extras?.retry_after;
  return typeof s === 'number' ? { 'retry-after': String(s) } : {};
}

/** Milliseconds to whole seconds for `Retry-After`, at least 1. */
export function retryAfterSeconds(ms: number): number {
  return Math.max(1, Math.ceil(ms / 1000));
}

function dropUndefined(o: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));
}
