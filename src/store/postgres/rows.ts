import type { OperatorAction, RecordInfo, ReconcileNote } from '../types.js';
import { decodeNullable, decodeText } from './text.js';

/**
 * Rows as PostgreSQL returns them: the store interface's shapes under their
 * column names, text in the escaped form of ./text.ts, bigints as text.
 */

/**
 * The record columns of every read (./reads.ts, ./audit.ts), never the body;
 * `interim`: an outcome_unknown record that carries an interim answer now
 * (DESIGN §3.7), by the database clock.
 */
export const RECORD_COLUMNS = `scope, key, state, fingerprint, entity, fence::text AS fence, status, locked_until, created_at, expires_at,
  (state = 'outcome_unknown' AND status IS NOT NULL AND expires_at > clock_timestamp()) AS interim, attempt_until, request_id, reconcile_result, reconciled_at`;

/** idempotency_records (the reads of ./reads.ts and the operator pages of ./audit.ts). */
export type RecordRow = Omit<RecordInfo, 'lockedUntil' | 'createdAt' | 'expiresAt' | 'attemptUntil' | 'requestId' | 'lastReconcile'> & {
  reconcile_result: ReconcileNote | null;
  reconciled_at: Date | null;
  attempt_until: Date | null;
  request_id: string | null;
  locked_until: Date | null;
  created_at: Date;
  expires_at: Date;
};

/** operator_actions; `id` is null where a resolution logged nothing (./audit.ts). */
export type ActionRow = Omit<OperatorAction, 'id' | 'requestId'> & { id: string | null; request_id: string | null };

export function toRecord(r: RecordRow): RecordInfo {
  return {
    scope: decodeText(r.scope),
    key: decodeText(r.key),
    state: r.state,
    fingerprint: decodeText(r.fingerprint),
    entity: decodeNullable(r.entity),
    fence: r.fence,
    status: r.status,
    lockedUntil: r.locked_until,
    createdAt: r.created_at,
    expiresAt: r.expires_at,
    interim: r.interim === true,
    attemptUntil: r.attempt_until,
    requestId: decodeNullable(r.request_id),
    ...(r.reconcile_result === null ? {} : { lastReconcile: { result: r.reconcile_result, at: r.reconciled_at! } }),
  };
}

export function toAction(r: ActionRow): OperatorAction {
  return {
    id: r.id!,
    at: r.at,
    action: r.action,
    scope: decodeText(r.scope),
    key: decodeText(r.key),
    entity: decodeNullable(r.entity),
    fence: r.fence,
    fingerprint: decodeNullable(r.fingerprint),
    status: r.status,
    operator: decodeNullable(r.operator),
    note: decodeNullable(r.note),
    requestId: decodeNullable(r.request_id),
  };
}

/**
 * A created_at as epoch ms, truncated as the driver's Date of it is (the
 * `createdAt` that listRecords and getRecords return, which a resolution
 * names its attempt by): timestamptz keeps µs, the Date only ms.
 */
export const createdMs = (column: string): string => `(extract(epoch FROM date_trunc('milliseconds', ${column})) * 1000)::bigint`;
