import type { ExtendLockInput, FinishInput } from '../types.js';
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
  // @scope @key @owner @status @headers @body (NULL: no interim answer) @interim_ms (NULL: the
  // retention the admission set) — outcome_unknown, with the interim answer if any (DESIGN §3.7).
  markUnknownOwned: `UPDATE idempotency_records SET ${MARK_UNKNOWN}, status = ${D1.int('status')}, headers = @headers, body = @body,
      expires_at = CASE WHEN @interim_ms IS NULL THEN expires_at ELSE ${NOW_MS} + ${D1.int('interim_ms')} END
    WHERE ${OWNED}`,
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
      case 'unknown': {
        const r = input.interim ?? null;
        steps.push(
          bind(Q.markUnknownOwned, {
            ...p,
            status: r?.status ?? null,
            headers: r === null ? null : JSON.stringify(r.headers),
            body: r?.body ?? null,
            interim_ms: r !== null && input.interimRetentionMs !== undefined ? Math.ceil(input.interimRetentionMs) : null,
          }),
        );
        break;
      }
    }
  } else if (input.command !== undefined) steps.push(bind(Q.logCommand, commandParams(input.command)));
  if (input.entity !== null) steps.push(bind(Q.freeSlot, p));
  return { steps, recordedAt };
}

/** @scope @key @owner — this owner's attempt, in progress with a live lock (by the statement's clock). */
const LIVE_OWNED = `scope = @scope AND key = @key AND owner_token = @owner AND state = 'in_progress' AND locked_until > ${NOW_MS}`;

const X = {
  // @scope @key @owner @ms — greatest(lock, now + ms); the attempt's lock end with it (SET reads the old row).
  record: `UPDATE idempotency_records SET locked_until = max(locked_until, ${NOW_MS} + ${D1.int('ms')}),
      attempt_until = max(locked_until, ${NOW_MS} + ${D1.int('ms')})
    WHERE ${LIVE_OWNED}`,
  // @entity @owner @ms @scope @key — the slot this owner holds live, only with its record (or keyless).
  slot: `UPDATE fence_entities SET inflight_until = max(inflight_until, ${NOW_MS} + ${D1.int('ms')})
    WHERE entity = @entity AND inflight_owner = @owner AND inflight_until > ${NOW_MS}
      AND (@key IS NULL OR EXISTS (SELECT 1 FROM idempotency_records WHERE ${LIVE_OWNED}))`,
} as const;

/**
 * `extendLock` (the rule of ../../core/admission.ts) as one batch: the
 * record, then the slot conditional on the record being this owner's live
 * attempt; `answerAt` is the statement whose row count answers (the
 * record's; the slot's for a keyless request), null when there is nothing to extend.
 */
export function extendBatch(bind: D1Bind, input: ExtendLockInput): { steps: D1PreparedStatementLike[]; answerAt: number | null } {
  const p = { scope: input.scope, key: input.key, entity: input.entity ?? null, owner: input.owner, ms: Math.ceil(input.ms) };
  const steps: D1PreparedStatementLike[] = [];
  let answerAt: number | null = null;
  if (input.key !== null) {
    answerAt = steps.push(bind(X.record, p)) - 1;
  }
  if (p.entity !== null) {
    const at = steps.push(bind(X.slot, p)) - 1;
    if (input.key === null) answerAt = at;
  }
  return { steps, answerAt };
}
