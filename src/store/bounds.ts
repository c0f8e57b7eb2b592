import type { AuditInfo } from './types.js';

/**
 * Bounded rows in the rejection log. Refused requests come from anyone,
 * unauthenticated callers included, and each may leave a row: without a
 * bound, one refused request could store a 16 KB path, and the log's size
 * would be the attacker's choice. Every text field of a rejection row is cut
 * to the length below, with `CUT_MARKER` at the end so that an auditor sees
 * the value was longer (a cut value never passes for a whole one).
 *
 * The entity and the idempotency key are capped at the protocol's own limits
 * (512 and 255 characters, src/protocol/headers.ts), so what the gateway logs
 * of them is never cut; a library caller that hands the store longer values
 * gets them cut in the log only, never in the decision (the fence and the
 * record always use the whole value).
 *
 * ONE function, `boundRejectionText`, computes the values of every rejection
 * row, in every store: the SQLite store's inserts, the PostgreSQL functions
 * (which receive the bounded values as parameters) and the D1 batch program
 * (bound parameters). Lengths are in UTF-16 code units (JavaScript string
 * length), the marker included; a surrogate pair is never split.
 */
export const CUT_MARKER = '…[cut]';

export const REJECTION_TEXT_LIMITS = {
  entity: 512,
  idempotencyKey: 255,
  caller: 256,
  method: 32,
  path: 2048,
  /** sha256 hex is 64. */
  payloadSha256: 64,
  requestId: 128,
  clientRequestId: 128,
  /** MCP tool names are 1–128 characters (MCP 2025-06-18, Tool.name). */
  tool: 128,
  detail: 1024,
  /**
   * A malformed fence, entity or key as presented, quoted in `detail` (the
   * 400s logged before admission, src/store/refusal-log.ts): enough to see
   * what a client sent, never a whole header of an attacker's choosing.
   */
  presented: 128,
} as const;

/** `value` if it fits in `max`, else its start and `CUT_MARKER`, `max` long at most. */
export function cutText(value: string, max: number): string {
  if (value.length <= max) return value;
  let end = Math.max(0, max - CUT_MARKER.length);
  const last = value.charCodeAt(end - 1);
  if (last >= 0xd800 && last <= 0xdbff) end--; // a high surrogate whose pair would be cut off
  return value.slice(0, end) + CUT_MARKER;
}

const cutNullable = (value: string | null | undefined, max: number): string | null => (value === null || value === undefined ? null : cutText(value, max));

/** The text of one rejection row, every field bounded (see above). */
export interface RejectionText {
  entity: string | null;
  idempotencyKey: string | null;
  caller: string | null;
  method: string;
  path: string;
  /** NULL when the body was never read (`payloadSha256: ''`, a refusal before step 4). */
  payloadSha256: string | null;
  requestId: string;
  clientRequestId: string | null;
  tool: string | null;
  detail: string | null;
}

/** The caller and request id of `audit`, bounded as in a rejection row: what a fence-history row keeps, on every admission that raises a fence. */
export function boundAuditIds(a: AuditInfo): { caller: string | null; requestId: string } {
  return { caller: cutNullable(a.caller, REJECTION_TEXT_LIMITS.caller), requestId: cutText(a.requestId, REJECTION_TEXT_LIMITS.requestId) };
}

/**
 * The bounded text of a rejection row, from what the store was handed.
 * @example
 * boundRejectionText({ entity: 'e', idempotencyKey: null, audit: { ...audit, path: '/x'.repeat(9000) } }).path
 * // → '/x/x…/x…[cut]' (2048 characters)
 */
export function boundRejectionText(r: { entity: string | null; idempotencyKey: string | null; audit: AuditInfo; detail?: string | null }): RejectionText {
  const L = REJECTION_TEXT_LIMITS;
  const a = r.audit;
  const { caller, requestId } = boundAuditIds(a);
  return {
    entity: cutNullable(r.entity, L.entity),
    idempotencyKey: cutNullable(r.idempotencyKey, L.idempotencyKey),
    caller,
    method: cutText(a.method, L.method),
    path: cutText(a.path, L.path),
    payloadSha256: a.payloadSha256 === '' ? null : cutText(a.payloadSha256, L.payloadSha256),
    requestId,
    // `?? null`: an AuditInfo built by code that predates the field.
    clientRequestId: cutNullable(a.clientRequestId ?? null, L.clientRequestId),
    tool: cutNullable(a.tool ?? null, L.tool),
    detail: cutNullable(r.detail, L.detail),
  };
}
