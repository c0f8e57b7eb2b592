import type { AttemptRef, EntityInfo, RecordInfo, ReconcileNote, StoredResponse } from '../types.js';
import { storedResponse } from './admit.js';
import type { PgContext } from './query.js';
import { createdMs, RECORD_COLUMNS, toRecord, type RecordRow } from './rows.js';
import { decodeText, encodeText } from './text.js';

/** The admin API's point reads: one entity's fence and slot, one key's records (in every scope). */
export function createReads(ctx: PgContext) {
  // $1 entity. `live`: the slot's expiry against the database clock (G6).
  const entityInfo = `SELECT entity, fence, accepted_at, inflight_until, inflight_until > now() AS live
      FROM ${ctx.table('fence_entities')} WHERE entity = $1`;
  // $1 key
  const recordsByKey = `SELECT ${RECORD_COLUMNS} FROM ${ctx.table('idempotency_records')} WHERE key = $1`;
  // $1 scope $2 key $3 created_at in epoch ms — this attempt's interim answer, while its time lasts (DESIGN §3.7).
  const interimOf = `SELECT status, headers, body FROM ${ctx.table('idempotency_records')}
      WHERE scope = $1 AND key = $2 AND ${createdMs('created_at')} = $3::bigint
        AND state = 'outcome_unknown' AND status IS NOT NULL AND expires_at > clock_timestamp()`;
  // $1 scope $2 key $3 created_at in epoch ms $4 result — the reconciler's last answer about this attempt, at the database time.
  const noteReconcile = `UPDATE ${ctx.table('idempotency_records')} SET reconcile_result = $4, reconciled_at = clock_timestamp()
      WHERE scope = $1 AND key = $2 AND ${createdMs('created_at')} = $3::bigint AND state = 'outcome_unknown'`;

  return {
    async getEntity(entity: string): Promise<EntityInfo | null> {
      const { rows } = await ctx.query<{ entity: string; fence: string | null; accepted_at: Date; inflight_until: Date | null; live: boolean | null }>(
        entityInfo,
        [encodeText(entity)],
      );
      const row = rows[0];
      if (row === undefined) return null;
      return {
        entity: decodeText(row.entity),
        fence: row.fence,
        acceptedAt: row.accepted_at,
        inflight: row.live === true && row.inflight_until !== null ? { until: row.inflight_until } : null,
      };
    },

    /**
     * Sorted by the decoded scope in JavaScript, as the SQLite stores' binary
     * `ORDER BY scope`: the database's collation and the escape would order differently.
     */
    async getInterim(input: AttemptRef): Promise<StoredResponse | null> {
      const { rows } = await ctx.query<{ status: number | null; headers: [string, string][] | null; body: Buffer | null }>(interimOf, [
        encodeText(input.scope),
        encodeText(input.key),
        String(input.createdAt.getTime()),
      ]);
      return rows[0] === undefined ? null : storedResponse(rows[0]);
    },

    async noteReconcile(input: AttemptRef & { result: ReconcileNote }): Promise<void> {
      await ctx.query(noteReconcile, [encodeText(input.scope), encodeText(input.key), String(input.createdAt.getTime()), input.result]);
    },

    async getRecords(key: string): Promise<RecordInfo[]> {
      const { rows } = await ctx.query<RecordRow>(recordsByKey, [encodeText(key)]);
      return rows.map(toRecord).sort((x, y) => (x.scope < y.scope ? -1 : x.scope > y.scope ? 1 : 0));
    },
  };
}
