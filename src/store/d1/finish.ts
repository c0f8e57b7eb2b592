import type { FinishInput } from '../types.js';
import type { D1Bind, D1PreparedStatementLike } from './binding.js';
import { completeRecord, D1, MARK_UNKNOWN, NOW_MS, REJECTION_AUDIT_VALUES, REJECTION_COLUMNS, rejectionParams } from '../sqlite-dialect/statements.js';
import { commandParams, insertCommand } from '../sqlite-dialect/commands.js';

/** @scope @key @owner — a record still owned by @owner: the condition of every finish (DESIGN §3.7). */
const OWNED = "scope = @scope AND key = @key AND owner_token = @owner AND state IN ('in_progress', 'outcome_unknown')";

const Q = {
  // @scope @key @owner @log_entity and the audit values of rejectionParams.
  logLateFinish: `INSERT INTO rejections (${REJECTION_COLUMNS})
    SELECT ${NOW_MS}, 'late-finish', @log_entity, NULL, NULL, ${REJECTION_AUDIT_VALUES}
    WHERE NOT EXISTS (SELECT 1 FROM idempotency_records WHERE ${OWNED})`,
  // @scope @key @owner @status @headers @body @retention_ms — a record only
  // marked outcome_unknown (nobody took it over) still belongs to its owner.
  complete: completeRecord(D1, OWNED),
  deleteOwned: `DELETE FROM idempotency_records WHERE ${OWNED}`,
  markUnknownOwned: `UPDATE idempotency_records SET ${MARK_UNKNOWN} WHERE ${OWNED}`,
  // @entity @owner — free the slot only if this owner still holds it.
  // The command log's row (DESIGN §4.1 `commands`), before the owner-conditional
  // write and under its condition: `late-finish` when the write will not match.
  logCommandOwned: insertCommand(D1, `CASE WHEN EXISTS (SELECT 1 FROM idempotency_records WHERE ${OWNED}) THEN @c_outcome ELSE 'late-finish' END`),
  logCommand: insertCommand(D1),
  freeSlot: 'UPDATE fence_entities SET inflight_owner = NULL, inflight_until = NULL WHERE entity = @entity AND inflight_owner = @owner',
} as const;

/**
 * The finish (DESIGN §3.7) as one batch: the `late-finish` rejection is
 * inserted under `NOT EXISTS (the owned record)`, then the owner-conditional
 * write runs with the same condition, so in one transaction exactly one of
 * the two takes effect; the write's row count is the answer (`recordedAt`:
 * its place in the results, null without a key). Then the serial slot is freed.
 */
export function finishBatch(bind: D1Bind, input: FinishInput): { steps: D1PreparedStatementLike[]; recordedAt: number | null } {
  const p = { scope: input.scope, key: input.key, entity: input.entity, owner: input.ownerToken, ...rejectionParams(input) };
  const steps: D1PreparedStatementLike[] = [];
  let recordedAt: number | null = null;
  if (input.key !== null) {
    steps.push(bind(Q.logLateFinish, p));
    if (input.command !== undefined) steps.push(bind(Q.logCommandOwned, { ...p, ...commandParams(input.command) }));
    recordedAt = steps.length;
    switch (input.outcome) {
      case 'completed': {
        const r = input.response;
        steps.push(bind(Q.complete, { ...p, status: r.status, headers: JSON.stringify(r.headers), body: r.body, retention_ms: input.retentionMs }));
        break;
      }
      case 'released':
        steps.push(bind(Q.deleteOwned, p));
        break;
      case 'unknown':
        steps.push(bind(Q.markUnknownOwned, p));
        break;
    }
  } else if (input.command !== undefined) steps.push(bind(Q.logCommand, commandParams(input.command)));
  if (input.entity !== null) steps.push(bind(Q.freeSlot, p));
  return { steps, recordedAt };
}
