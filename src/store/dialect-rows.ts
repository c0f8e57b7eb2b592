import type { OperatorAction, RecordInfo, RecordState, RejectionRow } from './types.js';

/**
 * Row mapping for the SQLite dialect, shared by the better-sqlite3 store and
 * the D1 store: the same tables (migrations/gateway/sqlite), times as integer
 * milliseconds, fences as integers (bigint from better-sqlite3's safe
 * integers, text where D1 casts them). Portable: no driver import.
 */

/** The database clock in integer milliseconds (G6): the only clock in expiry conditions. */
export const NOW_MS = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

const str = (v: unknown): string | null => (v === null || v === undefined ? null : String(v));
const num = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v));

export function toRejection(r: Record<string, unknown>): RejectionRow {
  return {
    id: String(r.id),
    at: new Date(Number(r.at)),
    reason: String(r.reason),
    entity: str(r.entity),
    presentedFence: str(r.presented_fence),
    currentFence: str(r.current_fence),
    idempotencyKey: str(r.idempotency_key),
    caller: str(r.caller),
    method: str(r.method),
    path: str(r.path),
    payloadSha256: str(r.payload_sha256),
    requestId: str(r.request_id),
    clientRequestId: str(r.client_request_id),
    detail: str(r.detail),
  };
}

export function toRecord(r: Record<string, unknown>): RecordInfo {
  return {
    scope: String(r.scope),
    key: String(r.key),
    state: r.state as RecordState,
    fingerprint: String(r.fingerprint),
    entity: str(r.entity),
    fence: str(r.fence),
    status: num(r.status),
    lockedUntil: r.locked_until === null || r.locked_until === undefined ? null : new Date(Number(r.locked_until)),
    createdAt: new Date(Number(r.created_at)),
    expiresAt: new Date(Number(r.expires_at)),
  };
}

export function toAction(r: Record<string, unknown>): OperatorAction {
  return {
    id: String(r.id),
    at: new Date(Number(r.at)),
    action: String(r.action) as OperatorAction['action'],
    scope: String(r.scope),
    key: String(r.key),
    entity: str(r.entity),
    fence: str(r.fence),
    fingerprint: str(r.fingerprint),
    status: num(r.status),
    operator: str(r.operator),
    note: str(r.note),
    requestId: str(r.request_id),
  };
}
