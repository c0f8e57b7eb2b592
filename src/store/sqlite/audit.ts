import type {
  AuditStats,
  AuditStore,
  FenceHistoryPage,
  OperatorActionPage,
  RecordPage,
  RecordQuery,
  RecordState,
  ResolveInput,
  ResolveResult,
} from '../types.js';
import type { SqliteDatabase } from './open.js';
import { WriteLock } from './write-lock.js';
import { NOW_MS, toAction, toRecord } from '../dialect-rows.js';


/**
 * The audit half of the SQLite store (DESIGN §4.1): fence history, records
 * waiting for an operator, the operator's resolution and its log, gauges.
 * Reads are plain keyset pages; the one write (`resolveRecord`) is one
 * `BEGIN IMMEDIATE` transaction.
 */
export function createSqliteAudit(db: SqliteDatabase, lock: WriteLock = new WriteLock(db)): AuditStore {
  const s = (sql: string) => db.prepare(sql).safeIntegers(true);
  const q = {
    // @entity @cursor @limit
    history: s(`SELECT fence, at, caller, request_id FROM fence_history
      WHERE entity = @entity AND (@cursor IS NULL OR fence < @cursor) ORDER BY fence DESC LIMIT @limit`),
    // @state @c @s @k @limit — keyset on (created_at, scope, key), newest first.
    records: s(`SELECT scope, key, state, fingerprint, entity, fence, status, locked_until, created_at, expires_at
      FROM idempotency_records WHERE state = @state AND (@c IS NULL OR (created_at, scope, key) < (@c, @s, @k))
      ORDER BY created_at DESC, scope DESC, key DESC LIMIT @limit`),
    record: s('SELECT state, entity, fence, fingerprint FROM idempotency_records WHERE scope = ? AND key = ?'),
    // @scope @key @status @headers @body @retention — only an outcome_unknown record is the operator's to settle.
    complete: s(`UPDATE idempotency_records SET state = 'completed', status = @status, headers = @headers, body = @body,
      locked_until = NULL, expires_at = ${NOW_MS} + @retention
      WHERE scope = @scope AND key = @key AND state = 'outcome_unknown'`),
    release: s(`DELETE FROM idempotency_records WHERE scope = @scope AND key = @key AND state = 'outcome_unknown'`),
    logAction: s(`INSERT INTO operator_actions (at, action, scope, key, entity, fence, fingerprint, status, operator, note, request_id)
      VALUES (${NOW_MS}, @action, @scope, @key, @entity, @fence, @fingerprint, @status, @operator, @note, @requestId) RETURNING *`),
    // @cursor @limit
    actions: s('SELECT * FROM operator_actions WHERE (@cursor IS NULL OR id < @cursor) ORDER BY id DESC LIMIT @limit'),
    stats: s(`SELECT (SELECT count(*) FROM rejections) AS rejections,
      (SELECT count(*) FROM idempotency_records WHERE state = 'outcome_unknown') AS unknown`),
  };

  const resolveTx = db.transaction((input: ResolveInput): ResolveResult => {
    const rec = q.record.get(input.scope, input.key) as { state: RecordState; entity: string | null; fence: bigint | null; fingerprint: string } | undefined;
    if (rec === undefined) return { ok: false, reason: 'not-found' };
    if (rec.state !== 'outcome_unknown') return { ok: false, reason: 'not-outcome-unknown', state: rec.state };
    const r = input.resolution;
    if (r.outcome === 'completed') {
      const body = Buffer.from(r.response.body.buffer, r.response.body.byteOffset, r.response.body.byteLength);
      q.complete.run({ scope: input.scope, key: input.key, status: r.response.status, headers: JSON.stringify(r.response.headers), body, retention: r.retentionMs });
    } else {
      q.release.run({ scope: input.scope, key: input.key });
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
      requestId: input.requestId,
    }) as Record<string, unknown>;
    return { ok: true, action: toAction(row) };
  });

  return {
    async getFenceHistory(entity, page): Promise<FenceHistoryPage> {
      const rows = q.history.all({ entity, cursor: page.cursor === undefined ? null : BigInt(page.cursor), limit: page.limit + 1 }) as Record<string, bigint | string | null>[];
      const items = rows.slice(0, page.limit).map((r) => ({
        fence: String(r.fence),
        at: new Date(Number(r.at)),
        caller: r.caller === null ? null : String(r.caller),
        requestId: r.request_id === null ? null : String(r.request_id),
      }));
      return { items, nextCursor: rows.length > page.limit ? items[items.length - 1]!.fence : null };
    },

    async listRecords(query: RecordQuery): Promise<RecordPage> {
      const cur = query.cursor === undefined ? null : decodeRecordCursor(query.cursor);
      const rows = q.records.all({ state: query.state, c: cur?.[0] ?? null, s: cur?.[1] ?? null, k: cur?.[2] ?? null, limit: query.limit + 1 }) as Record<string, any>[];
      const page = rows.slice(0, query.limit);
      const last = page[page.length - 1];
      return {
        items: page.map(toRecord),
        nextCursor: rows.length > query.limit && last ? encodeRecordCursor([BigInt(last.created_at), last.scope, last.key]) : null,
      };
    },

    async resolveRecord(input) {
      // Waits for another process's lock with the event loop free (./write-lock.ts).
      return lock.transaction(() => resolveTx(input));
    },

    async listOperatorActions(page): Promise<OperatorActionPage> {
      const rows = q.actions.all({ cursor: page.cursor === undefined ? null : BigInt(page.cursor), limit: page.limit + 1 }) as Record<string, unknown>[];
      const items = rows.slice(0, page.limit).map(toAction);
      return { items, nextCursor: rows.length > page.limit ? items[items.length - 1]!.id : null };
    },

    async auditStats(): Promise<AuditStats> {
      const r = q.stats.get() as { rejections: bigint; unknown: bigint };
      return { rejections: Number(r.rejections), outcomeUnknown: Number(r.unknown) };
    },
  };
}



/** The record keyset cursor: base64url of `[created_at, scope, key]` (scope may hold a NUL). */
export function encodeRecordCursor(c: [bigint, string, string]): string {
  return Buffer.from(JSON.stringify([c[0].toString(), c[1], c[2]])).toString('base64url');
}

function decodeRecordCursor(cursor: string): [bigint, string, string] {
  const v = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as unknown;
  if (!Array.isArray(v) || v.length !== 3 || typeof v[0] !== 'string' || !/^\d{1,19}$/.test(v[0]) || typeof v[1] !== 'string' || typeof v[2] !== 'string') {
    throw new RangeError('not a record cursor');
  }
  return [BigInt(v[0]), v[1], v[2]];
}
