import type { ExtendLockInput } from '../types.js';
import type { PgContext } from './query.js';
import { encodeNullable, encodeText } from './text.js';

/**
 * `extendLock` (DESIGN §3.6): one call of fencegate_extend_lock
 * (./sql/extend_lock.sql), one statement and so one transaction, the clock
 * the database's (G6). Not grouped: a keeper calls it once per interval per
 * long attempt, far from the admission's rate.
 */
export function createExtend(ctx: PgContext): (input: ExtendLockInput) => Promise<boolean> {
  // $1 scope $2 key $3 entity $4 owner $5 ms
  const sql = `SELECT extended FROM ${ctx.table('fencegate_extend_lock')}($1, $2, $3, $4, $5)`;
  return async (input) => {
    const { rows } = await ctx.query<{ extended: boolean }>(sql, [
      encodeText(input.scope),
      encodeNullable(input.key),
      encodeNullable(input.entity ?? null),
      encodeText(input.owner),
      Math.ceil(input.ms),
    ]);
    return rows[0]?.extended === true;
  };
}
