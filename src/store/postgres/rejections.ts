import type { RejectionInput, RejectionPage, RejectionQuery, RejectionRow } from '../types.js';
import { boundRejectionText, type RejectionText } from '../bounds.js';
import type { PgContext } from './query.js';
import { decodeNullable, encodeNullable, encodeText } from './text.js';

/**
 * The rejection row's text, bounded (../bounds.ts) BEFORE it is escaped and
 * passed in: the functions (./sql) write these values as they are
 * (`p_log_entity` and `p_log_key` beside the whole `p_entity` and `p_key`
 * the decision uses), so the bound is the same in every store.
 */
export function logText(r: Parameters<typeof boundRejectionText>[0]): RejectionText {
  const t = boundRejectionText(r);
  return {
    entity: encodeNullable(t.entity),
    idempotencyKey: encodeNullable(t.idempotencyKey),
    caller: encodeNullable(t.caller),
    method: encodeText(t.method),
    path: encodeText(t.path),
    payloadSha256: encodeNullable(t.payloadSha256),
    requestId: encodeText(t.requestId),
    clientRequestId: encodeNullable(t.clientRequestId),
    tool: encodeNullable(t.tool),
    detail: encodeNullable(t.detail),
  };
}

/**
 * The rejection log (G5, DESIGN §2): the row written for a refusal decided
 * before any admission, and the log's filtered pages. The admission's own
 * refusals are written by fencegate_admit, in its transaction.
 */
export function createRejectionLog(ctx: PgContext) {
  const table = ctx.table('rejections');
  // $1 reason $2 entity $3 presented $4 current $5 key $6 caller $7 method $8 path $9 payload_sha256 $10 request_id
  // $11 detail $12 client_request_id $13 tool
  const insert = `INSERT INTO ${table}
      (at, reason, entity, presented_fence, current_fence, idempotency_key, caller, method, path, payload_sha256, request_id, detail, client_request_id, tool)
      VALUES (now(), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`;

  return {
    async record(r: RejectionInput): Promise<void> {
      const a = logText(r);
      await ctx.query(insert, [
        r.reason,
        a.entity,
        r.presentedFence?.toString() ?? null,
        r.currentFence?.toString() ?? null,
        a.idempotencyKey,
        a.caller,
        a.method,
        a.path,
        a.payloadSha256,
        a.requestId,
        a.detail,
        a.clientRequestId,
        a.tool,
      ]);
    },

    /** Newest first, keyset on id. The filter's shape varies, so the statement is not a named one. */
    async list(query: RejectionQuery): Promise<RejectionPage> {
      const where: string[] = [];
      const values: unknown[] = [];
      const add = (cond: (n: string) => string, value: unknown) => {
        values.push(value);
        where.push(cond(`$${values.length}`));
      };
      if (query.entity !== undefined) add((n) => `entity = ${n}`, encodeText(query.entity));
      if (query.reason !== undefined) add((n) => `reason = ${n}`, query.reason);
      if (query.caller !== undefined) add((n) => `caller = ${n}`, encodeText(query.caller));
      if (query.tool !== undefined) add((n) => `tool = ${n}`, encodeText(query.tool));
      if (query.since !== undefined) add((n) => `at >= ${n}`, query.since);
      if (query.until !== undefined) add((n) => `at < ${n}`, query.until);
      if (query.cursor !== undefined) {
        if (!/^\d{1,19}$/.test(query.cursor)) throw new Error(`invalid rejection cursor: ${JSON.stringify(query.cursor)}`);
        add((n) => `id < ${n}`, query.cursor);
      }
      values.push(query.limit + 1);
      const text = `SELECT * FROM ${table} ${where.length > 0 ? `WHERE ${where.join(' AND ')}` : ''}
      ORDER BY id DESC LIMIT $${values.length}`;
      const { rows } = await ctx.query<Record<string, unknown>>(text, values, false);
      const items = rows.slice(0, query.limit).map(toRejection);
      const more = rows.length > query.limit;
      return { items, nextCursor: more ? items[items.length - 1]!.id : null };
    },
  };
}

function toRejection(r: Record<string, unknown>): RejectionRow {
  const str = (v: unknown) => (v === null || v === undefined ? null : String(v));
  return {
    id: String(r.id),
    at: r.at as Date,
    reason: String(r.reason),
    entity: decodeNullable(r.entity as string | null),
    presentedFence: str(r.presented_fence),
    currentFence: str(r.current_fence),
    idempotencyKey: decodeNullable(r.idempotency_key as string | null),
    caller: decodeNullable(r.caller as string | null),
    method: decodeNullable(r.method as string | null),
    path: decodeNullable(r.path as string | null),
    payloadSha256: decodeNullable(r.payload_sha256 as string | null),
    requestId: decodeNullable(r.request_id as string | null),
    clientRequestId: decodeNullable(r.client_request_id as string | null),
    tool: decodeNullable(r.tool as string | null),
    detail: decodeNullable(r.detail as string | null),
  };
}
