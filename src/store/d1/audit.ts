import type { AuditStore, RecordState } from '../types.js';
import { d1Binder, type D1DatabaseLike } from './binding.js';
import { toAction, toFenceHistoryPage, toPage, toRecordPage } from '../sqlite-dialect/rows.js';
import { D1, NOW_MS } from '../sqlite-dialect/statements.js';
import { ACTION_COLUMNS, auditStatements, INSERT_ACTION, quietEnough, unknownRecord } from '../sqlite-dialect/audit.js';

const Q = {
  ...auditStatements(D1),
  // @scope @key — the state (and attempt) the resolution was decided on (same batch).
  state: 'SELECT state, created_at FROM idempotency_records WHERE scope = @scope AND key = @key',
  // @scope @key @created_at @settle_ms @legacy_ms @action @status @operator @note @request_id — logged
  // first, from the record as it is, and only if it is the operator's to settle (and, for a
  // release with notBefore, only once the database clock allows it: the release's own condition).
  logAction: `${INSERT_ACTION}
    SELECT ${NOW_MS}, @action, scope, key, entity, fence, fingerprint, ${D1.int('status')}, @operator, @note, @request_id
    FROM idempotency_records WHERE ${unknownRecord(D1)} AND ${quietEnough(D1)}
    RETURNING ${ACTION_COLUMNS}`,
  // @scope @key @created_at @request_id — a release with notBefore: each statement of a batch
  // reads the clock anew, so the delete follows the time condition the log row was written
  // under (the batch's last operator action, ours) instead of reading the clock a second time.
  releaseLogged: `DELETE FROM idempotency_records WHERE ${unknownRecord(D1)}
    AND EXISTS (SELECT 1 FROM operator_actions WHERE id = (SELECT max(id) FROM operator_actions) AND request_id = @request_id AND action = 'resolve-released')`,
} as const;

/**
 * The audit half of the D1 store (DESIGN §4.1), the same reads and the same one
 * write as the SQLite store's. `resolveRecord` is one `batch()`: the state
 * read, the operator-action row and the conditional update (or delete) all
 * in one transaction, each conditional on `state = 'outcome_unknown'` (and,
 * given, on the operator's `created_at`), so a record that a late finish
 * completed in between, or a later attempt's record, is never overwritten.
 */
export function createD1Audit(db: D1DatabaseLike): AuditStore {
  const st = d1Binder(db);
  const all = async (sql: string, params: Record<string, unknown> = {}) => (await st(sql, params).all()).results ?? [];

  return {
    async getFenceHistory(entity, page) {
      return toFenceHistoryPage(await all(Q.history, { entity, cursor: page.cursor ?? null, limit: page.limit + 1 }), page.limit);
    },

    async listRecords(query) {
      const cur = query.cursor === undefined ? null : decodeRecordCursor(query.cursor);
      const rows = await all(Q.records, {
        state: query.state,
        after_at: cur?.[0] ?? null,
        after_scope: cur?.[1] ?? null,
        after_key: cur?.[2] ?? null,
        limit: query.limit + 1,
      });
      return toRecordPage(rows, query.limit, encodeRecordCursor);
    },

    async resolveRecord(input) {
      const r = input.resolution;
      const { scope, key } = input;
      const created_at = input.createdAt === undefined ? null : input.createdAt.getTime();
      const action = r.outcome === 'completed' ? 'resolve-completed' : 'resolve-released';
      const nb = r.outcome === 'released' ? r.notBefore : undefined;
      const settle_ms = nb === undefined ? null : Math.ceil(nb.settleMs);
      const legacy_ms = nb === undefined ? null : Math.ceil(nb.legacyBoundMs);
      const status = r.outcome === 'completed' ? r.response.status : null;
      const [seen, logged] = await db.batch([
        st(Q.state, { scope, key }),
        st(Q.logAction, {
          scope,
          key,
          created_at,
          settle_ms,
          legacy_ms,
          action,
          status,
          operator: input.operator,
          note: input.note,
          request_id: input.requestId,
        }),
        r.outcome === 'completed'
          ? st(Q.complete, {
              scope,
              key,
              created_at,
              status: r.response.status,
              headers: JSON.stringify(r.response.headers),
              body: r.response.body,
              retention_ms: r.retentionMs,
            })
          : settle_ms === null
            ? st(Q.release, { scope, key, created_at, settle_ms, legacy_ms })
            : st(Q.releaseLogged, { scope, key, created_at, request_id: input.requestId }),
      ]);
      const rec = seen?.results?.[0] as { state: RecordState; created_at: number } | undefined;
      if (rec === undefined) return { ok: false, reason: 'not-found' };
      if (rec.state !== 'outcome_unknown') return { ok: false, reason: 'not-outcome-unknown', state: rec.state };
      if (created_at !== null && Number(rec.created_at) !== created_at) return { ok: false, reason: 'changed', createdAt: new Date(Number(rec.created_at)) };
      const row = logged?.results?.[0] as Record<string, unknown> | undefined;
      // Its own and unchanged, yet not logged: the release's time condition held it back.
      if (row === undefined && settle_ms !== null) return { ok: false, reason: 'too-early' };
      if (row === undefined) throw new Error('d1 resolveRecord: the operator action was not written');
      return { ok: true, action: toAction(row) };
    },

    async listOperatorActions(page) {
      return toPage(await all(Q.actions, { cursor: page.cursor ?? null, limit: page.limit + 1 }), page.limit, toAction);
    },

    async auditStats() {
      const [r] = (await all(Q.stats)) as { rejections: number; unknown: number }[];
      return { rejections: Number(r?.rejections ?? 0), outcomeUnknown: Number(r?.unknown ?? 0) };
    },
  };
}

/**
 * The record keyset cursor: base64url of the JSON `[created_at, scope, key]`
 * (the SQLite store's format; scope may hold a NUL). No Buffer: Workers.
 */
function encodeRecordCursor(c: [string, string, string]): string {
  let bin = '';
  for (const b of new TextEncoder().encode(JSON.stringify(c))) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

function decodeRecordCursor(cursor: string): [string, string, string] {
  let v: unknown;
  try {
    const bin = atob(cursor.replace(/-/g, '+').replace(/_/g, '/'));
    v = JSON.parse(new TextDecoder().decode(Uint8Array.from(bin, (ch) => ch.charCodeAt(0))));
  } catch {
    v = null;
  }
  if (!Array.isArray(v) || v.length !== 3 || typeof v[0] !== 'string' || !/^\d{1,19}$/.test(v[0]) || typeof v[1] !== 'string' || typeof v[2] !== 'string') {
    throw new RangeError('not a record cursor');
  }
  return [v[0], v[1], v[2]];
}
