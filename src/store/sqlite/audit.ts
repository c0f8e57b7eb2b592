import type { AuditStore, RecordState, ResolveInput, ResolveResult } from '../types.js';
import type { SqliteDatabase } from '../../db/sqlite-open.js';
import { WriteLock } from './write-lock.js';
import { toAction, toFenceHistoryPage, toPage, toRecordPage } from '../sqlite-dialect/rows.js';
import { NOW_MS, SQLITE } from '../sqlite-dialect/statements.js';
import { ACTION_COLUMNS, auditStatements, INSERT_ACTION } from '../sqlite-dialect/audit.js';

/**
 * The audit half of the SQLite store (DESIGN §4.1): fence history, records
 * waiting for an operator, the operator's resolution and its log, gauges.
 * Reads are plain keyset pages; the one write (`resolveRecord`) is one
 * `BEGIN IMMEDIATE` transaction.
 */
export function createSqliteAudit(db: SqliteDatabase, lock: WriteLock = new WriteLock(db)): AuditStore {
  const s = (sql: string) => db.prepare(sql).safeIntegers(true);
  const text = auditStatements(SQLITE);
  const q = {
    history: s(text.history),
    records: s(text.records),
    record: s('SELECT state, entity, fence, fingerprint, created_at FROM idempotency_records WHERE scope = ? AND key = ?'),
    complete: s(text.complete),
    release: s(text.release),
    // The values of the record as read in the same transaction.
    logAction: s(`${INSERT_ACTION}
      VALUES (${NOW_MS}, @action, @scope, @key, @entity, @fence, @fingerprint, @status, @operator, @note, @request_id) RETURNING ${ACTION_COLUMNS}`),
    actions: s(text.actions),
    stats: s(text.stats),
  };

  const resolveTx = db.transaction((input: ResolveInput): ResolveResult => {
    const rec = q.record.get(input.scope, input.key) as
      | { state: RecordState; entity: string | null; fence: bigint | null; fingerprint: string; created_at: bigint }
      | undefined;
    if (rec === undefined) return { ok: false, reason: 'not-found' };
    if (rec.state !== 'outcome_unknown') return { ok: false, reason: 'not-outcome-unknown', state: rec.state };
    // The same condition is in the write (../sqlite-dialect/audit.ts); this read, in the same
    // transaction, only tells `changed` from success.
    const createdAt = input.createdAt === undefined ? null : BigInt(input.createdAt.getTime());
    if (createdAt !== null && rec.created_at !== createdAt) return { ok: false, reason: 'changed', createdAt: new Date(Number(rec.created_at)) };
    const r = input.resolution;
    const which = { scope: input.scope, key: input.key, created_at: createdAt };
    if (r.outcome === 'completed') {
      const body = Buffer.from(r.response.body.buffer, r.response.body.byteOffset, r.response.body.byteLength);
      q.complete.run({ ...which, status: r.response.status, headers: JSON.stringify(r.response.headers), body, retention_ms: r.retentionMs });
    } else {
      // The release's own condition decides (DESIGN §3.12); nothing deleted means not yet.
      const nb = r.notBefore;
      const bounds = {
        settle_ms: nb === undefined ? null : BigInt(Math.ceil(nb.settleMs)),
        legacy_ms: nb === undefined ? null : BigInt(Math.ceil(nb.legacyBoundMs)),
      };
      if (q.release.run({ ...which, ...bounds }).changes === 0) return { ok: false, reason: 'too-early' };
    }
    const row = q.logAction.get({
      action: r.outcome === 'completed' ? 'resolve-completed' : 'resolve-released',
      scope: input.scope,
      key: input.key,
      entity: rec.entity,
      fence: rec.fence,
      fingerprint: rec.fingerprint,
      status: r.outcome === 'completed' ? r.response.status : null,
      operator: input.operator,
      note: input.note,
      request_id: input.requestId,
    }) as Record<string, unknown>;
    return { ok: true, action: toAction(row) };
  });

  return {
    async getFenceHistory(entity, page) {
      const rows = q.history.all({ entity, cursor: page.cursor === undefined ? null : BigInt(page.cursor), limit: page.limit + 1 }) as Record<
        string,
        unknown
      >[];
      return toFenceHistoryPage(rows, page.limit);
    },

    async listRecords(query) {
      const cur = query.cursor === undefined ? null : decodeRecordCursor(query.cursor);
      const rows = q.records.all({
        state: query.state,
        after_at: cur?.[0] ?? null,
        after_scope: cur?.[1] ?? null,
        after_key: cur?.[2] ?? null,
        limit: query.limit + 1,
      }) as Record<string, unknown>[];
      return toRecordPage(rows, query.limit, encodeRecordCursor);
    },

    async resolveRecord(input) {
      // Waits for another process's lock with the event loop free (./write-lock.ts).
      return lock.transaction(() => resolveTx(input));
    },

    async listOperatorActions(page) {
      const rows = q.actions.all({ cursor: page.cursor === undefined ? null : BigInt(page.cursor), limit: page.limit + 1 }) as Record<string, unknown>[];
      return toPage(rows, page.limit, toAction);
    },

    async auditStats() {
      const r = q.stats.get() as { rejections: bigint; unknown: bigint };
      return { rejections: Number(r.rejections), outcomeUnknown: Number(r.unknown) };
    },
  };
}

/** The record keyset cursor: base64url of `[created_at, scope, key]` (scope may hold a NUL). */
export function encodeRecordCursor(c: [string, string, string]): string {
  return Buffer.from(JSON.stringify(c)).toString('base64url');
}

function decodeRecordCursor(cursor: string): [bigint, string, string] {
  const v = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as unknown;
  if (!Array.isArray(v) || v.length !== 3 || typeof v[0] !== 'string' || !/^\d{1,19}$/.test(v[0]) || typeof v[1] !== 'string' || typeof v[2] !== 'string') {
    throw new RangeError('not a record cursor');
  }
  return [BigInt(v[0]), v[1], v[2]];
}
