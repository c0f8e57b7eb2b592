import type { Statement } from 'better-sqlite3';
import type { AdmissionState, EntityRow, IdempotencyRecord } from '../../core/admission.js';
import type { RecordState, StoredResponse } from '../types.js';
import type { SqliteDatabase } from '../../db/sqlite-open.js';

/**
 * The rows one admission or finish touches (DESIGN §3.5, §3.7), read and
 * written for the pure rules of ../../core/admission.ts: `read` before
 * `decide` / `finish`, `apply` after, inside the caller's write transaction.
 *
 * `apply` writes only the columns that changed (an UPDATE that names an
 * indexed column costs its index update even when the value stays), each
 * update and delete conditional on the row as it was read. Inside
 * `BEGIN IMMEDIATE` nothing else writes, so the condition always holds; a
 * write that finds the row otherwise changes nothing, and that is a fault,
 * never a decision: `apply` throws and the transaction rolls back.
 * Positional parameters and raw rows: better-sqlite3 binds and builds them
 * faster than named parameters and row objects, and this is the hot path.
 */
export interface AdmissionRows {
  read(scope: string, key: string | null, entity: string | null): AdmissionState;
  apply(scope: string, key: string | null, entity: string | null, was: AdmissionState, next: AdmissionState): void;
}

// Raw rows: arrays in the SELECT's column order.
type EntitySqlRow = [fence: bigint | null, acceptedAt: bigint, owner: string | null, until: bigint | null];
type RecordSqlRow = [
  fingerprint: string,
  state: RecordState,
  owner: string,
  lockedUntil: bigint | null,
  entity: string | null,
  fence: bigint | null,
  status: bigint | null,
  headers: string | null,
  body: Buffer | null,
  createdAt: bigint,
  expiresAt: bigint,
  attemptUntil: bigint | null,
  requestId: string | null,
];

/** The columns `apply` may update, in bit order (bit i: column i). */
const ENTITY_COLUMNS = ['fence', 'accepted_at', 'inflight_owner', 'inflight_until'] as const;
const RECORD_COLUMNS = [
  'fingerprint',
  'entity',
  'fence',
  'state',
  'owner_token',
  'locked_until',
  'status',
  'headers',
  'body',
  'created_at',
  'expires_at',
  'attempt_until',
  'request_id',
] as const;

const num = (v: bigint | null): number | null => (v === null ? null : Number(v));

export function admissionRows(db: SqliteDatabase): AdmissionRows {
  const safe = (sql: string): Statement => db.prepare(sql).safeIntegers(true).raw(true);
  const entityRow = safe('SELECT fence, accepted_at, inflight_owner, inflight_until FROM fence_entities WHERE entity = ?');
  const recordRow = safe(`SELECT fingerprint, state, owner_token, locked_until, entity, fence, status, headers, body, created_at, expires_at,
      attempt_until, request_id
    FROM idempotency_records WHERE scope = ? AND key = ?`);
  const insertEntity = db.prepare('INSERT INTO fence_entities (entity, fence, accepted_at, inflight_owner, inflight_until) VALUES (?, ?, ?, ?, ?)');
  const insertRecord = db.prepare(`INSERT INTO idempotency_records
    (scope, key, fingerprint, entity, fence, state, owner_token, locked_until, status, headers, body, created_at, expires_at, attempt_until, request_id)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`);
  const deleteRecord = db.prepare('DELETE FROM idempotency_records WHERE scope = ? AND key = ? AND owner_token = ? AND state = ?');
  // One UPDATE per set of changed columns, prepared on first use (a handful in
  // all), found by the set's bit mask; its parameters: the new values in
  // column order, then the WHERE clause's.
  const updates = new Map<string, Statement>();
  const update = (table: string, columns: readonly string[], mask: number, where: string): Statement => {
    const id = `${table}:${mask}`;
    let st = updates.get(id);
    if (st === undefined) {
      const set = columns.filter((_c, i) => mask & (1 << i)).map((c) => `${c} = ?`);
      updates.set(id, (st = db.prepare(`UPDATE ${table} SET ${set.join(', ')} WHERE ${where}`)));
    }
    return st;
  };

  function read(scope: string, key: string | null, entity: string | null): AdmissionState {
    const e = entity === null ? undefined : (entityRow.get(entity) as EntitySqlRow | undefined);
    const r = key === null ? undefined : (recordRow.get(scope, key) as RecordSqlRow | undefined);
    return {
      entity: e === undefined ? null : { fence: e[0], acceptedAt: Number(e[1]), slot: e[2] === null ? null : { owner: e[2], until: num(e[3]) } },
      record:
        r === undefined
          ? null
          : {
              fingerprint: r[0],
              state: r[1],
              owner: r[2],
              lockedUntil: num(r[3]),
              attemptUntil: num(r[11]),
              requestId: r[12],
              entity: r[4],
              fence: r[5],
              createdAt: Number(r[9]),
              expiresAt: Number(r[10]),
              // A completed record's answer, or an outcome_unknown one's interim answer (DESIGN §3.7).
              response: r[1] === 'completed' || (r[1] === 'outcome_unknown' && r[6] !== null) ? toResponse(r) : null,
            },
    };
  }

  function applyEntity(entity: string, was: EntityRow | null, next: EntityRow): number {
    const owner = next.slot?.owner ?? null;
    const until = next.slot?.until ?? null;
    if (was === null) return insertEntity.run(entity, next.fence, next.acceptedAt, owner, until).changes;
    const wasOwner = was.slot?.owner ?? null;
    const wasUntil = was.slot?.until ?? null;
    let mask = 0;
    const values: unknown[] = [];
    const put = (bit: number, value: unknown) => ((mask |= bit), values.push(value));
    if (next.fence !== was.fence) put(1, next.fence);
    if (next.acceptedAt !== was.acceptedAt) put(2, next.acceptedAt);
    if (owner !== wasOwner) put(4, owner);
    if (until !== wasUntil) put(8, until);
    if (mask === 0) return 1;
    values.push(entity, was.fence, wasOwner, wasUntil);
    return update('fence_entities', ENTITY_COLUMNS, mask, 'entity = ? AND fence IS ? AND inflight_owner IS ? AND inflight_until IS ?').run(values).changes;
  }

  function applyRecord(scope: string, key: string, was: IdempotencyRecord | null, next: IdempotencyRecord | null): number {
    if (next === null) return deleteRecord.run(scope, key, was!.owner, was!.state).changes;
    const res = next.response;
    const status = res?.status ?? null;
    const headers = res === null ? null : JSON.stringify(res.headers);
    const body = res === null ? null : Buffer.from(res.body.buffer, res.body.byteOffset, res.body.byteLength);
    if (was === null) {
      return insertRecord.run(
        scope,
        key,
        next.fingerprint,
        next.entity,
        next.fence,
        next.state,
        next.owner,
        next.lockedUntil,
        status,
        headers,
        body,
        next.createdAt,
        next.expiresAt,
        next.attemptUntil,
        next.requestId,
      ).changes;
    }
    let mask = 0;
    const values: unknown[] = [];
    const put = (bit: number, value: unknown) => ((mask |= bit), values.push(value));
    if (next.fingerprint !== was.fingerprint) put(1, next.fingerprint);
    if (next.entity !== was.entity) put(2, next.entity);
    if (next.fence !== was.fence) put(4, next.fence);
    if (next.state !== was.state) put(8, next.state);
    if (next.owner !== was.owner) put(16, next.owner);
    if (next.lockedUntil !== was.lockedUntil) put(32, next.lockedUntil);
    if (res !== was.response) put(64, status), put(128, headers), put(256, body);
    if (next.createdAt !== was.createdAt) put(512, next.createdAt);
    if (next.expiresAt !== was.expiresAt) put(1024, next.expiresAt);
    if (next.attemptUntil !== was.attemptUntil) put(2048, next.attemptUntil);
    if (next.requestId !== was.requestId) put(4096, next.requestId);
    if (mask === 0) return 1;
    values.push(scope, key, was.owner, was.state);
    return update('idempotency_records', RECORD_COLUMNS, mask, 'scope = ? AND key = ? AND owner_token = ? AND state = ?').run(values).changes;
  }

  function apply(scope: string, key: string | null, entity: string | null, was: AdmissionState, next: AdmissionState): void {
    let changes = 1;
    if (entity !== null && next.entity !== was.entity) changes = applyEntity(entity, was.entity, next.entity!);
    if (changes === 1 && key !== null && next.record !== was.record) changes = applyRecord(scope, key, was.record, next.record);
    if (changes !== 1) throw new Error('sqlite store: a row changed between the read and the write of one transaction');
  }

  return { read, apply };
}

function toResponse(r: RecordSqlRow): StoredResponse {
  return {
    status: r[6] === null ? 200 : Number(r[6]),
    headers: JSON.parse(r[7] ?? '[]') as [string, string][],
    body: new Uint8Array(r[8] ?? new Uint8Array(0)),
  };
}
