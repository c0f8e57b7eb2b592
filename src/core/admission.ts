import type { Admission, AdmitInput, ExtendLockInput, FinishInput, RecordState, StoredResponse } from './admission-types.js';

/**
 * The admission rules (DESIGN §3.5 a–h) and the finish rules (DESIGN §3.7)
 * as pure transitions over plain data: no I/O, no clock (the caller passes
 * the database time `now`, DESIGN §2 G6), no mutation of the input.
 *
 * A store reads the rows one decision touches (the entity's row and the
 * idempotency record), calls `decide` or `finish`, and writes back what
 * changed, in one transaction. The SQLite store does exactly that; the
 * PostgreSQL function and the D1 batch program are translations of these
 * rules into their dialects (one round trip each), held to them by the
 * property-based conformance test (test/store/admission-conformance.ts).
 *
 * Unchanged parts of the state come back as the same object, so the apply
 * step writes only what `next.entity !== state.entity` (resp. `record`) says
 * changed.
 */

/** The serial-mode slot of an entity (DESIGN §3.5 h): who holds it, until when (ms). */
export interface EntitySlot {
  owner: string;
  until: number | null;
}

/** The entity's row: its fence (null for an entity only ever used without fences) and its slot. */
export interface EntityRow {
  fence: bigint | null;
  /**
   * When the fence was last accepted: raised, or presented again by a request
   * that was forwarded (never by a refused one); or when the fence-less row
   * was created (ms). The entity's retention runs from here.
   */
  acceptedAt: number;
  slot: EntitySlot | null;
}

/** An idempotency record (DESIGN §4): one per (scope, key). */
export interface IdempotencyRecord {
  fingerprint: string;
  state: RecordState;
  owner: string;
  /** The owner's lock (ms); null once the record left `in_progress`. */
  lockedUntil: number | null;
  /**
   * The lock end of the attempt last sent (ms): written with every lock
   * (admission, takeover, `extendLock`), kept when the record leaves
   * `in_progress`, so that a reconciler's "not found" is weighed against the
   * attempt's own lock (DESIGN §3.12). Null for a record written before it was kept.
   */
  attemptUntil: number | null;
  /** The gateway's request id of the attempt last sent (`AuditInfo.requestId`); null for a record written before it was kept. */
  requestId: string | null;
  entity: string | null;
  fence: bigint | null;
  createdAt: number;
  /**
   * Retention: a `completed` record is forgotten from here on (ms); an
   * `outcome_unknown` record's interim answer is carried until then.
   */
  expiresAt: number;
  /**
   * The stored answer of a `completed` record, the interim answer of an
   * `outcome_unknown` one (DESIGN §3.7), else null. Never on `in_progress`.
   */
  response: StoredResponse | null;
}

/** What one decision reads and writes. `record` is null when the key is null or unknown. */
export interface AdmissionState {
  entity: EntityRow | null;
  record: IdempotencyRecord | null;
}

/** A row for the rejection log (DESIGN §2 G5); the store adds the entity, the key and the audit fields. */
export interface LoggedRejection {
  reason: 'stale-fence' | 'idempotency-key-reused' | 'outcome-unknown' | 'late-finish';
  presentedFence: bigint | null;
  currentFence: bigint | null;
}

export type AdmitCommand = Pick<AdmitInput, 'key' | 'entity' | 'fence' | 'fingerprint' | 'mode' | 'ownerToken' | 'lockMs' | 'retentionMs' | 'onUnknown'> & {
  /** The request id the record keeps of the attempt it sends (`requestId`); absent: null. */
  audit?: { requestId: string };
};
export type FinishCommand = Pick<FinishInput, 'key' | 'entity' | 'ownerToken'> &
  (
    | { outcome: 'completed'; response: StoredResponse; retentionMs: number }
    | { outcome: 'released' }
    | { outcome: 'unknown'; interim?: StoredResponse; interimRetentionMs?: number }
  );
export type ExtendCommand = Pick<ExtendLockInput, 'key' | 'owner' | 'ms'> & { entity?: string | null };

export interface Decision {
  admission: Admission;
  next: AdmissionState;
  /** A fence accepted for the entity: append it to its history (a no-op when the value is already there). */
  acceptedFence: bigint | null;
  rejection: LoggedRejection | null;
}

export interface Finished {
  recorded: boolean;
  next: AdmissionState;
  rejection: LoggedRejection | null;
}

/** DESIGN §3.5 a–h: one admission, in the order the design gives. */
export function decide(state: AdmissionState, cmd: AdmitCommand, now: number): Decision {
  let { entity, record } = state;
  let acceptedFence: bigint | null = null;
  const answer = (admission: Admission, rejection: LoggedRejection | null = null): Decision => ({
    admission,
    // What was changed before the answer stays changed (a raised fence, an
    // outcome_unknown mark, a forgotten record), whatever the answer.
    next: entity === state.entity && record === state.record ? state : { entity, record },
    acceptedFence,
    rejection,
  });

  // a. The fence check comes first, always: a stale fence is refused even
  //    when its key has a stored response. Otherwise the fence is raised
  //    (equal is fine: one owner may send several commands).
  if (cmd.entity !== null && cmd.fence !== null) {
    if (entity !== null && entity.fence !== null && cmd.fence < entity.fence) {
      return answer({ outcome: 'stale-fence', currentFence: entity.fence }, { reason: 'stale-fence', presentedFence: cmd.fence, currentFence: entity.fence });
    }
    // Raised (or set for the first time): accepted now. An equal fence is
    // accepted again only by a request that is forwarded (below): a refused
    // one leaves `acceptedAt` (DESIGN §4.1) where it was.
    if (entity === null || entity.fence === null || cmd.fence > entity.fence) entity = { fence: cmd.fence, acceptedAt: now, slot: entity?.slot ?? null };
    acceptedFence = cmd.fence;
  }

  // b–g. The idempotency record.
  let takeoverFrom: string | null = null;
  if (cmd.key !== null) {
    // Past retention: forgotten, as if the sweeper had already run.
    if (record !== null && record.state === 'completed' && record.expiresAt <= now) record = null;
    if (record !== null) {
      // d. Another request under this key.
      if (record.fingerprint !== cmd.fingerprint) {
        return answer({ outcome: 'idempotency-key-reused' }, { reason: 'idempotency-key-reused', presentedFence: cmd.fence, currentFence: null });
      }
      // c. The stored answer.
      if (record.state === 'completed') return answer({ outcome: 'replay', response: record.response ?? EMPTY_RESPONSE });
      if (record.state === 'in_progress') {
        // e. Its owner is still at work.
        if (record.lockedUntil !== null && record.lockedUntil > now) {
          return answer({ outcome: 'idempotency-in-progress', retryAfterMs: record.lockedUntil - now });
        }
        // f. The gateway that held the lock died mid-request: the request
        //    may have reached the upstream. This sticks, whatever follows.
        record = withState(record, 'outcome_unknown', null);
      }
      // g. outcome_unknown: never re-sent blindly unless the route says the
      //    upstream is idempotent. An interim answer it keeps goes with the
      //    refusal while its time lasts (DESIGN §3.7).
      if (cmd.onUnknown === 'reject') {
        const interim = liveInterim(record, now);
        return answer(interim === null ? { outcome: 'outcome-unknown' } : { outcome: 'outcome-unknown', interim }, {
          reason: 'outcome-unknown',
          presentedFence: cmd.fence,
          currentFence: null,
        });
      }
      takeoverFrom = record.owner;
    }
  }

  // h. Serial mode: take the entity's one in-flight slot (or the expired
  //    slot of a dead gateway). Checked before the record is written, so a
  //    busy answer leaves no record behind. An entity without fences gets
  //    its row here, for the slot.
  if (cmd.mode === 'serial' && cmd.entity !== null) {
    entity ??= { fence: null, acceptedAt: now, slot: null };
    const slot = entity.slot;
    if (slot !== null && !(slot.until !== null && slot.until <= now)) {
      return answer({ outcome: 'entity-busy', retryAfterMs: Math.max(0, (slot.until ?? now) - now) });
    }
    entity = { fence: entity.fence, acceptedAt: entity.acceptedAt, slot: { owner: cmd.ownerToken, until: now + cmd.lockMs } };
  }

  // b. A new record, or g. with onUnknown: retry, the unknown one taken over
  //    (it keeps its fingerprint, creation and retention; an interim answer
  //    of the attempt before is dropped: this attempt is sent again).
  if (cmd.key !== null) {
    const taken = takeoverFrom !== null ? record! : null;
    record = {
      fingerprint: taken?.fingerprint ?? cmd.fingerprint,
      state: 'in_progress',
      owner: cmd.ownerToken,
      lockedUntil: now + cmd.lockMs,
      attemptUntil: now + cmd.lockMs,
      requestId: cmd.audit?.requestId ?? null,
      entity: cmd.entity,
      fence: cmd.fence,
      createdAt: taken?.createdAt ?? now,
      expiresAt: taken?.expiresAt ?? now + cmd.retentionMs,
      response: null,
    };
  }
  if (cmd.entity !== null && cmd.fence !== null && entity!.acceptedAt !== now) entity = { fence: entity!.fence, acceptedAt: now, slot: entity!.slot };
  return answer({ outcome: 'forward', takeover: takeoverFrom !== null });
}

/**
 * DESIGN §3.7: the owner's outcome, conditional on the owner token. A record
 * only marked `outcome_unknown` (nobody took it over) still belongs to its
 * owner; a record taken over, completed or resolved by an operator does not,
 * and the late finish is logged and discarded. The serial slot is freed only
 * if this owner still holds it.
 */
export function finish(state: AdmissionState, cmd: FinishCommand, now: number): Finished {
  let { entity, record } = state;
  let recorded = true;
  let rejection: LoggedRejection | null = null;
  if (cmd.key !== null) {
    const owned = record !== null && record.owner === cmd.ownerToken && (record.state === 'in_progress' || record.state === 'outcome_unknown');
    if (!owned) {
      recorded = false;
      rejection = { reason: 'late-finish', presentedFence: null, currentFence: null };
    } else if (cmd.outcome === 'completed') {
      record = withState(record!, 'completed', null, cmd.response, now + cmd.retentionMs);
    } else if (cmd.outcome === 'released') {
      // Never reached the upstream (or it said "not processed"): safe to retry.
      record = null;
    } else {
      // The interim answer, if any, replaces the one kept before; its time:
      // interimRetentionMs from now, else the retention the admission set.
      const interim = cmd.interim ?? null;
      const until = interim !== null && cmd.interimRetentionMs !== undefined ? now + cmd.interimRetentionMs : record!.expiresAt;
      record = withState(record!, 'outcome_unknown', null, interim, until);
    }
  }
  if (cmd.entity !== null && entity !== null && entity.slot?.owner === cmd.ownerToken)
    entity = { fence: entity.fence, acceptedAt: entity.acceptedAt, slot: null };
  return { recorded, next: entity === state.entity && record === state.record ? state : { entity, record }, rejection };
}

/**
 * The sweeper's rule for one record (DESIGN §2 G4, §4): a completed record
 * past retention is deleted, an `in_progress` record whose lock expired (its
 * gateway died) becomes `outcome_unknown`. Stores apply it set-based, in
 * batches (../store/sweep.ts); this is the rule they apply.
 */
export function sweepRecord(record: IdempotencyRecord, now: number): IdempotencyRecord | null {
  if (record.state === 'completed' && record.expiresAt <= now) return null;
  if (record.state === 'in_progress' && record.lockedUntil !== null && record.lockedUntil <= now) return withState(record, 'outcome_unknown', null);
  return record;
}

/**
 * DESIGN §3.6, a long attempt's lock kept alive: the record, when it is this
 * owner's `in_progress` record and its lock is still live at `now`, gets
 * its lock (and the attempt's lock end) at greatest(lock, now + ms); the
 * entity's serial slot, when this owner holds it live, too, but only with
 * the record (a keyless request: the slot alone). `extended` is the
 * record's answer (the slot's for a keyless request): false once the record
 * is no longer this owner's live attempt (taken over, finished, resolved,
 * its lock already expired). An expired lock is never revived: a retry
 * may have judged the attempt dead by it, and the gateway stops sending at
 * its end (§3.6).
 */
export function extendLock(state: AdmissionState, cmd: ExtendCommand, now: number): { extended: boolean; next: AdmissionState } {
  let { entity, record } = state;
  const until = (t: number | null): number => Math.max(t ?? 0, now + cmd.ms);
  let extended: boolean;
  if (cmd.key !== null) {
    const live = record !== null && record.owner === cmd.owner && record.state === 'in_progress' && record.lockedUntil !== null && record.lockedUntil > now;
    extended = live;
    if (live) {
      const r = record!;
      const lock = until(r.lockedUntil);
      if (lock !== r.lockedUntil || lock !== r.attemptUntil) record = { ...r, lockedUntil: lock, attemptUntil: lock };
    }
  } else extended = false;
  const slot = cmd.entity != null && entity !== null ? entity.slot : null;
  const slotLive = slot !== null && slot.owner === cmd.owner && (slot.until === null || slot.until > now);
  if (slotLive && (cmd.key === null || extended)) {
    const e = entity!;
    if (slot.until !== null && until(slot.until) !== slot.until)
      entity = { fence: e.fence, acceptedAt: e.acceptedAt, slot: { owner: slot.owner, until: until(slot.until) } };
    if (cmd.key === null) extended = true;
  }
  return { extended, next: entity === state.entity && record === state.record ? state : { entity, record } };
}

/** The interim answer an `outcome_unknown` record carries at `now` (DESIGN §3.7), or null. */
export function liveInterim(record: IdempotencyRecord, now: number): StoredResponse | null {
  return record.state === 'outcome_unknown' && record.response !== null && record.expiresAt > now ? record.response : null;
}

/** What the release of a lost admission is told: the parts of that admission's own input that decide it. */
export type ReleaseCommand = Pick<AdmitInput, 'key' | 'entity' | 'ownerToken' | 'lockMs' | 'onUnknown'>;

export interface Released {
  /** The entity's serial slot was held under the owner token, and is free now. */
  slot: boolean;
  /** The record held under the owner token was deleted, or put back to `outcome_unknown`. */
  record: boolean;
  next: AdmissionState;
}

/**
 * DESIGN §8.2, "An admission whose answer was lost": the admission may have
 * committed, but its caller was answered 503 `store-unavailable` and nothing
 * was forwarded (§3.5), so whatever it holds stands for a request that was
 * never made. The rule, for the rows of the admission's key and entity:
 *
 * - The entity's slot is freed if its owner is the admission's owner token
 *   (live or expired). The fence, its acceptance time and its history stay,
 *   as after an `entity-busy` answer.
 * - The record, if its owner is the owner token:
 *   - `onUnknown: reject`: deleted when `in_progress` or `outcome_unknown`
 *     (its lock ran out and another request marked it), as a finish
 *     `released` deletes it (§3.7);
 *   - `onUnknown: retry`: the admission may have been a takeover of an
 *     earlier attempt whose outcome is unknown. An `in_progress` record the
 *     admission created, whose lock ends exactly `lockMs` after its creation
 *     (`decide` writes both from one clock reading; a takeover keeps the
 *     earlier `createdAt` and locks from its own, later reading), is deleted;
 *     any other `in_progress` one goes back to `outcome_unknown`, lock
 *     cleared, as after `admission-expired` (its fingerprint keeps refusing
 *     another payload under the key); an `outcome_unknown` one, which could
 *     be either, stays.
 *   - A `completed` record stays (a finish recorded it: the request was sent).
 * - A record or slot of another owner, or none (the admission rolled back
 *   or was refused), is left as it is. The owner token is fresh per request,
 *   so nothing else can match. Nothing is logged.
 *
 * No clock: nothing here depends on time, only on the rows as they are. The
 * takeover test needs a takeover's clock reading to differ from the
 * creation it took over, which holds where the clock is finer than the time
 * from an admission to its finish and a retry's takeover (PostgreSQL's
 * `clock_timestamp()`, µs); a same-tick takeover would read as fresh.
 * Applying the rule twice gives what applying it once gives.
 */
export function releaseUnsent(state: AdmissionState, cmd: ReleaseCommand): Released {
  let { entity, record } = state;
  let slot = false;
  let released = false;
  if (cmd.entity !== null && entity !== null && entity.slot?.owner === cmd.ownerToken) {
    entity = { fence: entity.fence, acceptedAt: entity.acceptedAt, slot: null };
    slot = true;
  }
  if (cmd.key !== null && record !== null && record.owner === cmd.ownerToken) {
    if (cmd.onUnknown === 'reject') {
      if (record.state === 'in_progress' || record.state === 'outcome_unknown') {
        record = null;
        released = true;
      }
    } else if (record.state === 'in_progress') {
      record = record.lockedUntil === record.createdAt + cmd.lockMs ? null : withState(record, 'outcome_unknown', null);
      released = true;
    }
  }
  return { slot, record: released, next: entity === state.entity && record === state.record ? state : { entity, record } };
}

/**
 * A record in another state, the rest kept. Written out field by field, not
 * with object spread: on Node 20 a spread copy of such an object took ~2 µs
 * in a micro-benchmark, a literal ~0.03 µs, and this runs in every decision.
 */
function withState(
  r: IdempotencyRecord,
  state: RecordState,
  lockedUntil: number | null,
  response: StoredResponse | null = r.response,
  expiresAt: number = r.expiresAt,
): IdempotencyRecord {
  return {
    fingerprint: r.fingerprint,
    state,
    owner: r.owner,
    lockedUntil,
    // The attempt's lock end outlives its lock; a record written before it was
    // kept takes it from the lock it had when its outcome became unknown.
    attemptUntil: state === 'outcome_unknown' ? (r.attemptUntil ?? r.lockedUntil) : r.attemptUntil,
    requestId: r.requestId,
    entity: r.entity,
    fence: r.fence,
    createdAt: r.createdAt,
    expiresAt,
    response,
  };
}

/** A completed record always carries its answer (the stores write both at once); this keeps `decide` total. */
const EMPTY_RESPONSE: StoredResponse = { status: 200, headers: [], body: new Uint8Array(0) };
