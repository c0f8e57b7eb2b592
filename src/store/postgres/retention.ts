import type { SweepOptions, SweepResult } from '../types.js';
import { sweepInBatches, type SweepStep } from '../sweep.js';
import type { PgContext } from './query.js';

type Kind = keyof SweepResult['backlog'];

/** $2 of a sweep statement: the kind's retention in milliseconds, against the database clock. */
const olderThanRetention = (column: string) => `${column} < now() - $2 * interval '1 millisecond'`;

/**
 * One kind's two statements over the rows `where` selects: `run` changes at
 * most $1 of them (deletes, or applies `set`) and answers how many; `count`
 * counts up to $1 cap of them. Both take the same condition, so the backlog
 * counts exactly what later batches would sweep.
 *
 * The rows are taken `FOR UPDATE SKIP LOCKED`: a row an admission or a finish
 * holds is left for the next batch, and two replicas sweeping at once
 * neither wait for nor deadlock with each other.
 */
function kind(table: string, key: string[], where: string, set?: string): { run: string; count: string } {
  const change = set === undefined ? `DELETE FROM ${table} s` : `UPDATE ${table} s SET ${set}`;
  return {
    run: `WITH d AS (
          ${change}
          WHERE (${key.map((c) => `s.${c}`).join(', ')}) IN (
            SELECT ${key.join(', ')} FROM ${table}
            WHERE ${where} LIMIT $1 FOR UPDATE SKIP LOCKED)
          RETURNING 1)
        SELECT count(*) AS n FROM d`,
    count: `SELECT count(*) AS n FROM (SELECT 1 FROM ${table} WHERE ${where} LIMIT $1) x`,
  };
}

/** Every sweep statement of the store, by the backlog kind it sweeps. */
function statements(t: PgContext['table']): Record<Kind, { run: string; count: string }> {
  const records = t('idempotency_records');
  return {
    expiredRecords: kind(records, ['scope', 'key'], `state = 'completed' AND expires_at <= now()`),
    // Never deleted: an expired lock makes the record `outcome_unknown`, the operator's to settle.
    unknownRecords: kind(
      records,
      ['scope', 'key'],
      `state = 'in_progress' AND locked_until <= now()`,
      `state = 'outcome_unknown', attempt_until = coalesce(attempt_until, locked_until), locked_until = NULL`,
    ),
    oldRejections: kind(t('rejections'), ['id'], olderThanRetention('at')),
    // entityRetention, never an entity whose serial slot is live (DESIGN §4.4:
    // the safety condition). Index fence_entities_accepted (0006).
    oldEntities: kind(t('fence_entities'), ['entity'], `${olderThanRetention('accepted_at')} AND (inflight_owner IS NULL OR inflight_until <= now())`),
    oldFenceHistory: kind(t('fence_history'), ['id'], olderThanRetention('at')),
    oldOperatorActions: kind(t('operator_actions'), ['id'], olderThanRetention('at')),
    // The command log (./commands.ts), index commands_at (0011).
    oldCommands: kind(t('commands'), ['id'], olderThanRetention('at')),
  };
}

/**
 * The sweeper's PostgreSQL half: batches (../sweep.ts), each ONE statement
 * (its own transaction) over at most `batch` rows; the retention is applied
 * with the database clock, in SQL. `stopped`: the store is closing.
 */
export function createSweep(ctx: PgContext, stopped: () => boolean): (options: SweepOptions) => Promise<SweepResult> {
  const S = statements(ctx.table);
  const step = (k: Kind, params: unknown[]): SweepStep => ({
    run: async (batch) => Number((await ctx.query<{ n: string }>(S[k].run, [batch, ...params])).rows[0]!.n),
    count: async (cap) => Number((await ctx.query<{ n: string }>(S[k].count, [cap, ...params])).rows[0]!.n),
  });
  const retention = (ms: number) => [Math.max(0, Math.floor(ms))];

  return async (options) => {
    const steps: Partial<Record<Kind, SweepStep>> = {
      expiredRecords: step('expiredRecords', []),
      unknownRecords: step('unknownRecords', []),
      oldRejections: step('oldRejections', retention(options.rejectionRetentionMs)),
    };
    if (options.entityRetentionMs !== undefined) {
      steps.oldEntities = step('oldEntities', retention(options.entityRetentionMs));
      steps.oldFenceHistory = step('oldFenceHistory', retention(options.entityRetentionMs));
    }
    if (options.operatorActionRetentionMs !== undefined) {
      steps.oldOperatorActions = step('oldOperatorActions', retention(options.operatorActionRetentionMs));
    }
    if (options.commandRetentionMs !== undefined) steps.oldCommands = step('oldCommands', retention(options.commandRetentionMs));
    return sweepInBatches(steps, options, { stopped });
  };
}
