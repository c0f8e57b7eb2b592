import type { AuditStore, RecordState } from '../types.js';
import type { PgContext } from './query.js';
import { createdMs, RECORD_COLUMNS, toAction, toRecord, type ActionRow, type RecordRow } from './rows.js';
import { decodeNullable, encodeNullable, encodeText } from './text.js';

/** The largest bigint (2^63 - 1): no fence or id is above it. */
const MAX_BIGINT = (1n << 63n) - 1n;

/**
 * The audit half of the PostgreSQL store (DESIGN §4.1), the same contract as
 * src/store/sqlite/audit.ts and src/store/d1/audit.ts: fence history,
 * records waiting for an operator, the operator's resolution and its log,
 * gauges. Reads are keyset pages. The one write, `resolveRecord`, is ONE
 * statement: the conditional update (or delete) of an `outcome_unknown`
 * record and the operator-action row written from what it returned, so the
 * resolution and its log commit together or not at all, and a record that a
 * late finish (or a takeover) changed in between is never overwritten: the
 * row lock and READ COMMITTED's re-check of `state = 'outcome_unknown'` (and,
 * given, of the operator's created_at: the attempt the operator saw, not a
 * later one with the same key) on the newest row version decide, not a read
 * in TypeScript.
 *
 * Text columns hold the escaped form of ./text.ts (scopes carry U+0000 once
 * caller auth is on); everything is encoded on the way in and decoded on the
 * way out, and the record cursor carries the raw (escaped) column values so
 * that the keyset compares exactly what the index orders.
 */
export function createPostgresAudit(ctx: PgContext): AuditStore {
  const t = ctx.table;
  const records = t('idempotency_records');
  // $1 scope $2 key — the record's state and attempt (created_at in epoch ms, as text).
  const seen = `SELECT state, ${createdMs('created_at')}::text AS ms FROM ${records} WHERE scope = $1 AND key = $2`;
  const Q = {
    // $1 entity $2 cursor (fence, exclusive, or NULL) $3 limit
    history: `SELECT fence::text AS fence, at, caller, request_id FROM ${t('fence_history')}
      WHERE entity = $1 AND ($2::bigint IS NULL OR fence < $2::bigint) ORDER BY fence DESC LIMIT $3`,
    // $1 state $2 created_at in epoch microseconds (NULL on the first page) $3 scope $4 key $5 limit.
    // Keyset on (created_at, scope, key), newest first; microseconds so the cursor is exact.
    records: `SELECT ${RECORD_COLUMNS},
        ((extract(epoch FROM created_at) * 1000000)::bigint)::text AS created_us
      FROM ${records}
      WHERE state = $1 AND ($2::bigint IS NULL
        OR (created_at, scope, key) < (timestamptz 'epoch' + $2::bigint::double precision * interval '1 microsecond', $3::text, $4::text))
      ORDER BY created_at DESC, scope DESC, key DESC LIMIT $5`,
    // $1 scope $2 key $3 status $4 headers $5 body $6 retention_ms $7 operator $8 note $9 request_id
    // $10 created_at in epoch ms (or NULL). `seen`, `seen_ms`: the record in the statement's
    // snapshot, to say why nothing matched.
    complete: `WITH done AS (
        UPDATE ${records} r SET state = 'completed', status = $3, headers = $4::jsonb, body = $5, locked_until = NULL,
          expires_at = now() + $6::double precision * interval '1 millisecond'
        WHERE r.scope = $1 AND r.key = $2 AND r.state = 'outcome_unknown' AND ($10::bigint IS NULL OR ${createdMs('r.created_at')} = $10::bigint)
        RETURNING r.scope, r.key, r.entity, r.fence, r.fingerprint, r.status
      ), logged AS (
        INSERT INTO ${t('operator_actions')} (at, action, scope, key, entity, fence, fingerprint, status, operator, note, request_id)
        SELECT now(), 'resolve-completed', scope, key, entity, fence, fingerprint, status, $7, $8, $9 FROM done
        RETURNING *
      )
      SELECT ${ACTION_COLUMNS}, s.state AS seen, s.ms AS seen_ms
      FROM (VALUES (1)) AS one LEFT JOIN logged l ON true LEFT JOIN (${seen}) s ON true`,
    // $1 scope $2 key $3 operator $4 note $5 request_id $6 created_at in epoch ms (or NULL)
    // $7 settle_ms $8 legacy_ms (or both NULL): only once the database clock is settle_ms past the
    // attempt's own lock end, or, for a record written before attempt_until was kept, legacy_ms past
    // its admission (DESIGN §3.12), decided here on the row version the delete locked, never in
    // TypeScript (G6); and never a record that keeps (or kept) an interim answer (status set:
    // the command was accepted upstream), as the SQLite dialect's quietEnough.
    release: `WITH done AS (
        DELETE FROM ${records} r
        WHERE r.scope = $1 AND r.key = $2 AND r.state = 'outcome_unknown' AND ($6::bigint IS NULL OR ${createdMs('r.created_at')} = $6::bigint)
          AND ($7::bigint IS NULL OR (r.status IS NULL AND coalesce(r.attempt_until + $7::bigint * interval '1 millisecond',
            r.created_at + $8::bigint * interval '1 millisecond') <= clock_timestamp()))
        RETURNING r.scope, r.key, r.entity, r.fence, r.fingerprint
      ), logged AS (
        INSERT INTO ${t('operator_actions')} (at, action, scope, key, entity, fence, fingerprint, status, operator, note, request_id)
        SELECT now(), 'resolve-released', scope, key, entity, fence, fingerprint, NULL::integer, $3, $4, $5 FROM done
        RETURNING *
      )
      SELECT ${ACTION_COLUMNS}, s.state AS seen, s.ms AS seen_ms
      FROM (VALUES (1)) AS one LEFT JOIN logged l ON true LEFT JOIN (${seen}) s ON true`,
    // $1 scope $2 key — only to explain a refusal whose snapshot still said outcome_unknown.
    state: seen,
    // $1 cursor (id, exclusive, or NULL) $2 limit
    actions: `SELECT ${ACTION_COLUMNS} FROM ${t('operator_actions')} l
      WHERE ($1::bigint IS NULL OR l.id < $1::bigint) ORDER BY l.id DESC LIMIT $2`,
    stats: `SELECT (SELECT count(*) FROM ${t('rejections')})::text AS rejections,
      (SELECT count(*) FROM ${records} WHERE state = 'outcome_unknown')::text AS unknown`,
  };

  return {
    async getFenceHistory(entity, page) {
      const { rows } = await ctx.query<{ fence: string; at: Date; caller: string | null; request_id: string | null }>(Q.history, [
        encodeText(entity),
        bigintCursor(page.cursor, 'not a fence-history cursor'),
        page.limit + 1,
      ]);
      const items = rows.slice(0, page.limit).map((r) => ({
        fence: r.fence,
        at: r.at,
        caller: decodeNullable(r.caller),
        requestId: decodeNullable(r.request_id),
      }));
      return { items, nextCursor: rows.length > page.limit ? items[items.length - 1]!.fence : null };
    },

    async listRecords(query) {
      const cur = query.cursor === undefined ? null : decodeRecordCursor(query.cursor);
      const { rows } = await ctx.query<RecordRow & { created_us: string }>(Q.records, [
        query.state,
        cur?.[0] ?? null,
        cur?.[1] ?? null,
        cur?.[2] ?? null,
        query.limit + 1,
      ]);
      const page = rows.slice(0, query.limit);
      const last = page[page.length - 1];
      return {
        items: page.map(toRecord),
        nextCursor: rows.length > query.limit && last !== undefined ? encodeRecordCursor([last.created_us, last.scope, last.key]) : null,
      };
    },

    async resolveRecord(input) {
      const r = input.resolution;
      const scope = encodeText(input.scope);
      const key = encodeText(input.key);
      const who = [encodeNullable(input.operator), encodeNullable(input.note), encodeText(input.requestId)];
      const values =
        r.outcome === 'completed'
          ? [
              scope,
              key,
              r.response.status,
              JSON.stringify(r.response.headers.map(([n, v]) => [encodeText(n), encodeText(v)])),
              Buffer.from(r.response.body.buffer, r.response.body.byteOffset, r.response.body.byteLength),
              Math.ceil(r.retentionMs),
              ...who,
            ]
          : [scope, key, ...who];
      const createdMsValue = input.createdAt === undefined ? null : String(input.createdAt.getTime());
      const nb = r.outcome === 'released' ? r.notBefore : undefined;
      const notBefore = nb === undefined ? null : String(Math.ceil(nb.settleMs));
      const legacy = nb === undefined ? null : String(Math.ceil(nb.legacyBoundMs));
      const { rows } = await ctx.query<ActionRow & { seen: RecordState | null; seen_ms: string | null }>(
        r.outcome === 'completed' ? Q.complete : Q.release,
        r.outcome === 'completed' ? [...values, createdMsValue] : [...values, createdMsValue, notBefore, legacy],
      );
      const row = rows[0]!;
      if (row.id !== null) return { ok: true, action: toAction(row) };
      let rec = row.seen === null ? undefined : { state: row.seen, ms: row.seen_ms! };
      if (rec?.state === 'outcome_unknown' && (createdMsValue === null || rec.ms === createdMsValue)) {
        // The snapshot still saw it unknown, but a concurrent finish or
        // takeover committed first and the conditional statement refused: the
        // decision is made; this read only names the state for the answer.
        rec = (await ctx.query<{ state: RecordState; ms: string }>(Q.state, [scope, key])).rows[0];
      }
      if (rec === undefined) return { ok: false, reason: 'not-found' };
      if (rec.state === 'outcome_unknown' && createdMsValue !== null && rec.ms !== createdMsValue) {
        return { ok: false, reason: 'changed', createdAt: new Date(Number(rec.ms)) };
      }
      // Its own and still unknown, yet the delete refused: the time condition held it back.
      if (rec.state === 'outcome_unknown' && notBefore !== null) return { ok: false, reason: 'too-early' };
      return { ok: false, reason: 'not-outcome-unknown', state: rec.state };
    },

    async listOperatorActions(page) {
      const { rows } = await ctx.query<ActionRow>(Q.actions, [bigintCursor(page.cursor, 'not an operator-action cursor'), page.limit + 1]);
      const items = rows.slice(0, page.limit).map(toAction);
      return { items, nextCursor: rows.length > page.limit ? items[items.length - 1]!.id : null };
    },

    async auditStats() {
      const { rows } = await ctx.query<{ rejections: string; unknown: string }>(Q.stats, []);
      return { rejections: Number(rows[0]?.rejections ?? 0), outcomeUnknown: Number(rows[0]?.unknown ?? 0) };
    },
  };
}

/** The operator_actions columns as the store returns them (bigints as text), from the alias `l`. */
const ACTION_COLUMNS = `l.id::text AS id, l.at, l.action, l.scope, l.key, l.entity, l.fence::text AS fence, l.fingerprint, l.status,
  l.operator, l.note, l.request_id`;

/**
 * A keyset cursor over a bigint column: the lowest value of the previous
 * page (a fence, or an operator action's id). Above the largest bigint there
 * is nothing to exclude (NULL: from the top).
 */
function bigintCursor(cursor: string | undefined, notOne: string): string | null {
  if (cursor === undefined) return null;
  if (!/^\d{1,19}$/.test(cursor)) throw new RangeError(notOne);
  return BigInt(cursor) > MAX_BIGINT ? null : cursor;
}

/** The record keyset cursor: base64url of `[created_at µs, scope, key]`, scope and key as stored. */
function encodeRecordCursor(c: [string, string, string]): string {
  return Buffer.from(JSON.stringify(c)).toString('base64url');
}

function decodeRecordCursor(cursor: string): [string, string, string] {
  const v = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as unknown;
  if (!Array.isArray(v) || v.length !== 3 || typeof v[0] !== 'string' || !/^\d{1,18}$/.test(v[0]) || typeof v[1] !== 'string' || typeof v[2] !== 'string') {
    throw new RangeError('not a record cursor');
  }
  return [v[0], v[1], v[2]];
}
