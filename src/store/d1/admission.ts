import type { Admission, AdmitInput, StoredResponse } from '../types.js';
import type { D1Bind, D1PreparedStatementLike } from './binding.js';
import { toStoredResponse } from '../sqlite-dialect/rows.js';
import {
  D1,
  expiredRecord,
  insertFenceHistory,
  MARK_UNKNOWN,
  NOW_MS,
  REJECTION_AUDIT_VALUES,
  REJECTION_COLUMNS,
  rejectionParams,
  slotFree,
} from '../sqlite-dialect/statements.js';

/**
 * The admission of DESIGN §3.5 as one D1 `batch()`: why a batch with a
 * scratch row (`admission_scratch`, migration 0003), see docs/design.md §8.3.
 * Each step below is the SQLite store's step (the pure rules of
 * ../../core/admission.ts), with its own condition, in the same order:
 *
 *  a. fence check first: mark `stale-fence` if the entity's fence is higher,
 *     else raise it (equal is fine) and append the rise to `fence_history`;
 *  b–g. forget an expired completed record; load the record into the row;
 *     decide reused (fingerprint) / replay / in-progress (lock alive) /
 *     outcome-unknown (onUnknown: reject) or note the owner to take over;
 *     an in_progress record with an expired lock becomes `outcome_unknown`
 *     whatever follows (its gateway died);
 *  h. serial mode: take the entity's slot (free or expired) BEFORE the
 *     record is written; no slot means `entity-busy` and no record;
 *  then write the record (insert, or take over the `outcome_unknown` one),
 *  and log the refusals of G5 in the same batch.
 *
 * Consistency: nothing runs between the statements of a batch, so the
 * decision is taken on one snapshot and its writes land with it or not at
 * all; no other admission can interleave (G1–G3). A failed batch (an error,
 * the D1 size limits) leaves no trace, the scratch row included, and the
 * gateway answers 503 store-unavailable without forwarding. State is changed
 * exactly as the SQLite store changes it, including on refusals (a raised
 * fence and an `outcome_unknown` mark persist when the answer is
 * entity-busy), so one conformance suite holds for both.
 */

/** Admission decisions that go to the rejection log (DESIGN §2 G5). */
const LOGGED = "('stale-fence', 'idempotency-key-reused', 'outcome-unknown')";

/** This admission's scratch row, and the guard "no decision taken yet". */
const NOW = '(SELECT now FROM admission_scratch WHERE id = @id)';
const UNDECIDED = '(SELECT decision FROM admission_scratch WHERE id = @id) IS NULL';
const FENCE = D1.int('fence');
const LOCK_UNTIL = `${NOW} + ${D1.int('lock_ms')}`;

/** Every statement of the program, one constant each, with its named parameters. */
const Q = {
  // @id — the scratch row, with the database clock read once for the batch.
  begin: `INSERT INTO admission_scratch (id, now) VALUES (@id, ${NOW_MS})`,
  // a. @id @entity @fence — stale iff the entity already holds a higher fence.
  staleFence: `UPDATE admission_scratch SET decision = 'stale-fence',
      current_fence = (SELECT fence FROM fence_entities WHERE entity = @entity)
    WHERE id = @id AND EXISTS (SELECT 1 FROM fence_entities WHERE entity = @entity AND fence > ${FENCE})`,
  // a. @id @entity @fence — raise (or create) the fence; equal is fine, and
  //    written only by acceptAgain once the request is forwarded: a refused
  //    one leaves accepted_at where it was (src/core/admission.ts).
  raiseFence: `INSERT INTO fence_entities (entity, fence, accepted_at)
    SELECT @entity, ${FENCE}, now FROM admission_scratch WHERE id = @id AND decision IS NULL
    ON CONFLICT (entity) DO UPDATE SET fence = excluded.fence, accepted_at = excluded.accepted_at
      WHERE fence_entities.fence IS NULL OR excluded.fence > fence_entities.fence`,
  // a. @id @entity — forwarded (no decision): the fence presented, raised or
  //    equal, was accepted now.
  acceptAgain: `UPDATE fence_entities SET accepted_at = ${NOW}
    WHERE entity = @entity AND ${UNDECIDED}`,
  // a. @id @entity @fence @caller @request_id — the entity's fence history, only when not stale.
  fenceHistory: insertFenceHistory(`SELECT @entity, ${FENCE}, now, @caller, @request_id FROM admission_scratch WHERE id = @id AND decision IS NULL`),
  // @id @scope @key — past retention: forgotten, as if the sweeper had already run.
  forgetExpired: `DELETE FROM idempotency_records
    WHERE scope = @scope AND key = @key AND ${expiredRecord(NOW)} AND ${UNDECIDED}`,
  // @id @scope @key — the record as seen now (all NULL when there is none).
  loadRecord: `UPDATE admission_scratch SET (rec_state, rec_fingerprint, rec_owner, rec_locked_until) =
      (SELECT state, fingerprint, owner_token, locked_until FROM idempotency_records WHERE scope = @scope AND key = @key)
    WHERE id = @id AND decision IS NULL`,
  // b–g. @id @fingerprint @on_unknown — all SET expressions read the row as
  // it was before this statement, so the flags below see the loaded record.
  decideRecord: `UPDATE admission_scratch SET
      decision = CASE
        WHEN rec_fingerprint <> @fingerprint THEN 'idempotency-key-reused'
        WHEN rec_state = 'completed' THEN 'replay'
        WHEN rec_state = 'in_progress' AND rec_locked_until > now THEN 'idempotency-in-progress'
        WHEN @on_unknown = 'reject' THEN 'outcome-unknown'
      END,
      busy_until = CASE WHEN rec_fingerprint = @fingerprint AND rec_state = 'in_progress' AND rec_locked_until > now THEN rec_locked_until END,
      mark_unknown = (rec_fingerprint = @fingerprint AND rec_state = 'in_progress' AND (rec_locked_until IS NULL OR rec_locked_until <= now)),
      takeover_from = CASE WHEN @on_unknown = 'retry' AND rec_fingerprint = @fingerprint
        AND (rec_state = 'outcome_unknown' OR (rec_state = 'in_progress' AND (rec_locked_until IS NULL OR rec_locked_until <= now)))
        THEN rec_owner END
    WHERE id = @id AND decision IS NULL AND rec_state IS NOT NULL`,
  // f. @id @scope @key — the gateway holding the lock died mid-request: the
  //    request may have reached the upstream. Persists whatever the decision.
  markUnknown: `UPDATE idempotency_records SET ${MARK_UNKNOWN}
    WHERE scope = @scope AND key = @key AND state = 'in_progress'
      AND owner_token = (SELECT rec_owner FROM admission_scratch WHERE id = @id AND mark_unknown = 1)`,
  // h. @id @entity — the row that holds the serial slot of an entity without fences.
  ensureEntity: `INSERT INTO fence_entities (entity, fence, accepted_at)
    SELECT @entity, NULL, now FROM admission_scratch WHERE id = @id AND decision IS NULL
    ON CONFLICT (entity) DO NOTHING`,
  // h. @id @entity @owner @lock_ms — take the slot if free or expired (a dead gateway's).
  takeSlot: `UPDATE fence_entities SET inflight_owner = @owner, inflight_until = ${LOCK_UNTIL}
    WHERE entity = @entity AND ${slotFree(NOW)} AND ${UNDECIDED}`,
  // h. @id @entity @owner — no slot: busy, before any record is written.
  entityBusy: `UPDATE admission_scratch SET decision = 'entity-busy',
      busy_until = (SELECT inflight_until FROM fence_entities WHERE entity = @entity)
    WHERE id = @id AND decision IS NULL
      AND NOT EXISTS (SELECT 1 FROM fence_entities WHERE entity = @entity AND inflight_owner = @owner)`,
  // g. @id @scope @key @owner @lock_ms @entity @fence — onUnknown: retry takes the record over.
  //    @request_id — the attempt it sends; an interim answer of the attempt before is dropped.
  takeOver: `UPDATE idempotency_records SET owner_token = @owner, state = 'in_progress', locked_until = ${LOCK_UNTIL},
      attempt_until = ${LOCK_UNTIL}, request_id = @request_id, status = NULL, headers = NULL, body = NULL,
      entity = @entity, fence = ${FENCE}
    WHERE scope = @scope AND key = @key AND state = 'outcome_unknown' AND ${UNDECIDED}
      AND owner_token = (SELECT takeover_from FROM admission_scratch WHERE id = @id)`,
  // b. @id @scope @key @fingerprint @entity @fence @owner @lock_ms @retention_ms @request_id
  insertRecord: `INSERT INTO idempotency_records
      (scope, key, fingerprint, entity, fence, state, owner_token, locked_until, created_at, expires_at, attempt_until, request_id)
    SELECT @scope, @key, @fingerprint, @entity, ${FENCE}, 'in_progress', @owner, ${LOCK_UNTIL}, now,
      now + CAST(@retention_ms AS INTEGER), ${LOCK_UNTIL}, @request_id
    FROM admission_scratch WHERE id = @id AND decision IS NULL AND takeover_from IS NULL`,
  // G5. @id @log_entity @fence and the audit values of rejectionParams — in
  // the decision's transaction.
  logRefusal: `INSERT INTO rejections (${REJECTION_COLUMNS})
    SELECT now, decision, @log_entity, ${FENCE}, current_fence, ${REJECTION_AUDIT_VALUES}
    FROM admission_scratch WHERE id = @id AND decision IN ${LOGGED}`,
  // @id @scope @key — the answer; the stored response only for a replay, and
  // for outcome-unknown the interim answer the record keeps while its time
  // lasts (DESIGN §3.7; none on a record this batch just marked).
  decision: `SELECT s.decision, CAST(s.current_fence AS TEXT) AS current_fence, s.busy_until - s.now AS wait_ms,
      s.takeover_from IS NOT NULL AS takeover, r.status, r.headers, r.body
    FROM admission_scratch s
    LEFT JOIN idempotency_records r ON r.scope = @scope AND r.key = @key AND (s.decision = 'replay'
      OR (s.decision = 'outcome-unknown' AND s.rec_state = 'outcome_unknown' AND r.status IS NOT NULL AND r.expires_at > s.now))
    WHERE s.id = @id`,
  end: 'DELETE FROM admission_scratch WHERE id = @id',
} as const;

/** The admission's batch, and where in its results the decision row comes back. */
export function admissionBatch(bind: D1Bind, input: AdmitInput, id: string): { steps: D1PreparedStatementLike[]; decisionAt: number } {
  const { scope, key, entity, fence, ownerToken: owner } = input;
  const p = {
    id,
    scope,
    key,
    entity,
    fence,
    owner,
    fingerprint: input.fingerprint,
    lock_ms: input.lockMs,
    retention_ms: input.retentionMs,
    on_unknown: input.onUnknown,
    ...rejectionParams(input),
  };
  const st = (sql: string) => bind(sql, p);
  const steps: D1PreparedStatementLike[] = [st(Q.begin)];
  if (entity !== null && fence !== null) steps.push(st(Q.staleFence), st(Q.raiseFence), st(Q.fenceHistory));
  if (key !== null) steps.push(st(Q.forgetExpired), st(Q.loadRecord), st(Q.decideRecord), st(Q.markUnknown));
  if (input.mode === 'serial' && entity !== null) {
    if (fence === null) steps.push(st(Q.ensureEntity));
    steps.push(st(Q.takeSlot), st(Q.entityBusy));
  }
  if (key !== null) steps.push(st(Q.takeOver), st(Q.insertRecord));
  if (entity !== null && fence !== null) steps.push(st(Q.acceptAgain));
  steps.push(st(Q.logRefusal));
  const decisionAt = steps.length;
  steps.push(st(Q.decision), st(Q.end));
  return { steps, decisionAt };
}

/** The `decision` statement's row. */
export interface DecisionRow {
  decision: string | null;
  current_fence: string | null;
  wait_ms: number | null;
  takeover: number;
  status: number | null;
  headers: string | null;
  body: unknown;
}

export function toAdmission(row: DecisionRow): Admission {
  switch (row.decision) {
    case null:
      return { outcome: 'forward', takeover: row.takeover === 1 };
    case 'stale-fence':
      return { outcome: 'stale-fence', currentFence: BigInt(row.current_fence ?? '0') };
    case 'replay':
      return { outcome: 'replay', response: toResponse(row) };
    case 'idempotency-key-reused':
      return { outcome: 'idempotency-key-reused' };
    case 'idempotency-in-progress':
      return { outcome: 'idempotency-in-progress', retryAfterMs: Math.max(0, row.wait_ms ?? 0) };
    case 'outcome-unknown':
      return row.status === null ? { outcome: 'outcome-unknown' } : { outcome: 'outcome-unknown', interim: toResponse(row) };
    case 'entity-busy':
      return { outcome: 'entity-busy', retryAfterMs: Math.max(0, row.wait_ms ?? 0) };
    default:
      throw new Error(`d1 admission: unexpected decision ${row.decision}`);
  }
}

function toResponse(row: DecisionRow): StoredResponse {
  return toStoredResponse(row as unknown as Record<string, unknown>);
}
