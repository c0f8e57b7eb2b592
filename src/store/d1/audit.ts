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
import type { D1DatabaseLike, D1PreparedStatementLike } from './gateway-store.js';
import { NOW_MS, toAction, toRecord } from '../dialect-rows.js';


/** The record columns, fences as text (D1 returns integers as doubles). */
const RECORD = 'scope, key, state, fingerprint, entity, CAST(fence AS TEXT) AS fence, status, locked_until, created_at, expires_at';
const ACTION =
  'CAST(id AS TEXT) AS id, at, action, scope, key, entity, CAST(fence AS TEXT) AS fence, fingerprint, status, operator, note, request_id';

/** Positional statements; each comment names its parameters in order. */
const Q = {
  // entity, cursor (fence text or NULL), limit
  history: `SELECT CAST(fence AS TEXT) AS fence, at, caller, request_id FROM fence_history
    WHERE entity = ?1 AND (?2 IS NULL OR fence < CAST(?2 AS INTEGER)) ORDER BY fence DESC LIMIT CAST(?3 AS INTEGER)`,
  // state, created_at, scope, key (all NULL on the first page), limit — keyset, newest first.
  records: `SELECT ${RECORD} FROM idempotency_records
    WHERE state = ?1 AND (?2 IS NULL OR (created_at, scope, key) < (CAST(?2 AS INTEGER), ?3, ?4))
    ORDER BY created_at DESC, scope DESC, key DESC LIMIT CAST(?5 AS INTEGER)`,
  // scope, key — the state the resolution was decided on (same batch).
  state: 'SELECT state FROM idempotency_records WHERE scope = ?1 AND key = ?2',
  // scope, key, action, status, operator, note, request_id — logged first, from
  // the record as it is, and only if it is outcome_unknown: the operator's to settle.
  logAction: `INSERT INTO operator_actions (at, action, scope, key, entity, fence, fingerprint, status, operator, note, request_id)
    SELECT ${NOW_MS}, ?3, scope, key, entity, fence, fingerprint, CAST(?4 AS INTEGER), ?5, ?6, ?7
    FROM idempotency_records WHERE scope = ?1 AND key = ?2 AND state = 'outcome_unknown'
    RETURNING ${ACTION}`,
  // scope, key, status, headers, body, retention_ms
  complete: `UPDATE idempotency_records SET state = 'completed', status = CAST(?3 AS INTEGER), headers = ?4, body = ?5,
      locked_until = NULL, expires_at = ${NOW_MS} + CAST(?6 AS INTEGER)
    WHERE scope = ?1 AND key = ?2 AND state = 'outcome_unknown'`,
  // scope, key
  release: `DELETE FROM idempotency_records WHERE scope = ?1 AND key = ?2 AND state = 'outcome_unknown'`,
  // cursor (id text or NULL), limit
  actions: `SELECT ${ACTION} FROM operator_actions WHERE (?1 IS NULL OR id < CAST(?1 AS INTEGER)) ORDER BY id DESC LIMIT CAST(?2 AS INTEGER)`,
  stats: `SELECT (SELECT count(*) FROM rejections) AS rejections,
    (SELECT count(*) FROM idempotency_records WHERE state = 'outcome_unknown') AS unknown`,
} as const;

/**
 * The audit half of the D1 store (DESIGN §4.1), the same reads and the same one
 * write as the SQLite store's. `resolveRecord` is one `batch()`: the state
 * read, the operator-action row and the conditional update (or delete) all
 * in one transaction, each conditional on `state = 'outcome_unknown'`, so a
 * record that a late finish completed in between is never overwritten.
 */
export function createD1Audit(db: D1DatabaseLike): AuditStore {
  const st = (sql: string, ...values: unknown[]): D1PreparedStatementLike => db.prepare(sql).bind(...values);
  const all = async (sql: string, ...values: unknown[]) => (await st(sql, ...values).all()).results ?? [];

  return {
    async getFenceHistory(entity, page): Promise<FenceHistoryPage> {
      const rows = await all(Q.history, entity, page.cursor ?? null, page.limit + 1);
      const items = rows.slice(0, page.limit).map((r: Record<string, any>) => ({
        fence: String(r.fence),
        at: new Date(Number(r.at)),
        caller: r.caller ?? null,
        requestId: r.request_id ?? null,
      }));
      return { items, nextCursor: rows.length > page.limit ? items[items.length - 1]!.fence : null };
    },

    async listRecords(query: RecordQuery): Promise<RecordPage> {
      const cur = query.cursor === undefined ? null : decodeRecordCursor(query.cursor);
      const rows = await all(Q.records, query.state, cur?.[0] ?? null, cur?.[1] ?? null, cur?.[2] ?? null, query.limit + 1);
      const page = rows.slice(0, query.limit) as Record<string, any>[];
      const last = page[page.length - 1];
      return {
        items: page.map(toRecord),
        nextCursor: rows.length > query.limit && last ? encodeRecordCursor([String(last.created_at), last.scope, last.key]) : null,
      };
    },

    async resolveRecord(input: ResolveInput): Promise<ResolveResult> {
      const r = input.resolution;
      const { scope, key } = input;
      const action = r.outcome === 'completed' ? 'resolve-completed' : 'resolve-released';
      const status = r.outcome === 'completed' ? r.response.status : null;
      const [seen, logged] = await db.batch([
        st(Q.state, scope, key),
        st(Q.logAction, scope, key, action, status, input.operator, input.note, input.requestId),
        r.outcome === 'completed'
          ? st(Q.complete, scope, key, r.response.status, JSON.stringify(r.response.headers), r.response.body, r.retentionMs)
          : st(Q.release, scope, key),
      ]);
      const state = (seen?.results?.[0] as { state: RecordState } | undefined)?.state;
      if (state === undefined) return { ok: false, reason: 'not-found' };
      if (state !== 'outcome_unknown') return { ok: false, reason: 'not-outcome-unknown', state };
      const row = logged?.results?.[0] as Record<string, unknown> | undefined;
      if (row === undefined) throw new Error('d1 resolveRecord: the operator action was not written');
      return { ok: true, action: toAction(row) };
    },

    async listOperatorActions(page): Promise<OperatorActionPage> {
      const rows = await all(Q.actions, page.cursor ?? null, page.limit + 1);
      const items = rows.slice(0, page.limit).map(toAction);
      return { items, nextCursor: rows.length > page.limit ? items[items.length - 1]!.id : null };
    },

    async auditStats(): Promise<AuditStats> {
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
