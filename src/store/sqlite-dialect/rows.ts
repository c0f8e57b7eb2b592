import type {
  EntityInfo,
  FenceHistoryPage,
  OperatorAction,
  RecordInfo,
  RecordPage,
  RecordState,
  ReconcileNote,
  RejectionRow,
  StoredResponse,
} from '../types.js';

/**
 * Row mapping for the SQLite dialect, shared by the better-sqlite3 store and
 * the D1 store: the same tables (migrations/gateway/sqlite), times as integer
 * milliseconds (bigint from better-sqlite3's safe integers, doubles from D1),
 * fences and ids cast to text by the statements (./statements.ts).
 * Portable: no driver import.
 */

const str = (v: unknown): string | null => (v === null || v === undefined ? null : String(v));
const num = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v));

/** A page of a keyset read that fetched `limit + 1` rows: the next cursor is the last item's id when there are more. */
export function toPage<T extends { id: string }>(rows: Record<string, unknown>[], limit: number, map: (r: Record<string, unknown>) => T) {
  const items = rows.slice(0, limit).map(map);
  return { items, nextCursor: rows.length > limit ? items[items.length - 1]!.id : null };
}

/** A page of the records keyset read (`limit + 1` rows); its cursor encodes the last item's (created_at, scope, key). */
export function toRecordPage(
  rows: Record<string, unknown>[],
  limit: number,
  cursor: (last: [createdAt: string, scope: string, key: string]) => string,
): RecordPage {
  const page = rows.slice(0, limit);
  const last = page[page.length - 1];
  return {
    items: page.map(toRecord),
    nextCursor: rows.length > limit && last ? cursor([String(last.created_at), String(last.scope), String(last.key)]) : null,
  };
}

/** A page of the fence-history read (`limit + 1` rows), highest fence first; the cursor is the last fence. */
export function toFenceHistoryPage(rows: Record<string, unknown>[], limit: number): FenceHistoryPage {
  const items = rows.slice(0, limit).map((r) => ({ fence: String(r.fence), at: new Date(Number(r.at)), caller: str(r.caller), requestId: str(r.request_id) }));
  return { items, nextCursor: rows.length > limit ? items[items.length - 1]!.fence : null };
}

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
    tool: str(r.tool),
    detail: str(r.detail),
  };
}

/** A row of `ENTITY_INFO`: the slot counts only while it has not expired by the database's `now`. */
export function toEntity(r: Record<string, unknown>): EntityInfo {
  const until = num(r.inflight_until);
  const live = until !== null && until > Number(r.now);
  return {
    entity: String(r.entity),
    fence: str(r.fence),
    acceptedAt: new Date(Number(r.accepted_at)),
    inflight: live ? { until: new Date(until) } : null,
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
    interim: Number(r.interim ?? 0) === 1,
    attemptUntil: r.attempt_until === null || r.attempt_until === undefined ? null : new Date(Number(r.attempt_until)),
    requestId: str(r.request_id),
    ...(r.reconcile_result === null || r.reconcile_result === undefined
      ? {}
      : { lastReconcile: { result: String(r.reconcile_result) as ReconcileNote, at: new Date(Number(r.reconciled_at)) } }),
  };
}

/** A row of `interimOf`: the stored answer (headers as JSON text, body as a BLOB). */
export function toStoredResponse(r: Record<string, unknown>): StoredResponse {
  return { status: Number(r.status ?? 200), headers: JSON.parse(String(r.headers ?? '[]')) as [string, string][], body: toBytes(r.body) };
}

/** better-sqlite3 returns a BLOB as a Buffer; D1 as an array of numbers or an ArrayBuffer. */
export function toBytes(v: unknown): Uint8Array {
  if (v === null || v === undefined) return new Uint8Array(0);
  if (v instanceof Uint8Array) return new Uint8Array(v.buffer.slice(v.byteOffset, v.byteOffset + v.byteLength));
  if (v instanceof ArrayBuffer) return new Uint8Array(v);
  if (ArrayBuffer.isView(v)) return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
  if (Array.isArray(v)) return Uint8Array.from(v as number[]);
  throw new Error(`store: unexpected BLOB value of type ${typeof v}`);
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
