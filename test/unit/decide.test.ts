import { describe, expect, it } from 'vitest';
import { type AdmissionState, type AdmitCommand, type Decision, decide, type EntityRow, type IdempotencyRecord } from '../../src/core/admission.js';
import type { StoredResponse } from '../../src/core/admission-types.js';

// DESIGN §3.5 a–h as one table: each row is a plain state (the entity's row
// and the idempotency record a store would read), one command and the clock,
// and the whole decision `decide` must return. No store, no gateway: the
// stores are held to this same function by the conformance tests, so a rule
// pinned here is pinned for SQLite, PostgreSQL and D1.

const NOW = 1_000_000;
const LOCK = 30_000;
const RETENTION = 86_400_000;
const EARLIER = NOW - 10_000;

const STORED: StoredResponse = { status: 201, headers: [['content-type', 'application/json']], body: new TextEncoder().encode('{"id":"ch_1"}') };
const EMPTY: StoredResponse = { status: 200, headers: [], body: new Uint8Array(0) };

function cmd(over: Partial<AdmitCommand> = {}): AdmitCommand {
  return {
    key: 'pay-1',
    entity: 'job:1',
    fence: 5n,
    fingerprint: 'fp-A',
    mode: 'concurrent',
    ownerToken: 'owner-new',
    lockMs: LOCK,
    retentionMs: RETENTION,
    onUnknown: 'reject',
    ...over,
  };
}

function row(fence: bigint | null, slot: EntityRow['slot'] = null, acceptedAt = EARLIER): EntityRow {
  return { fence, acceptedAt, slot };
}

/** A record of an earlier request under the same key, by another owner. */
function rec(over: Partial<IdempotencyRecord> = {}): IdempotencyRecord {
  return {
    fingerprint: 'fp-A',
    state: 'in_progress',
    owner: 'owner-old',
    lockedUntil: NOW + 5_000,
    attemptUntil: NOW + 5_000,
    requestId: 'req-old',
    entity: 'job:1',
    fence: 5n,
    createdAt: EARLIER,
    expiresAt: EARLIER + RETENTION,
    response: null,
    ...over,
  };
}

/** The record `decide` writes for an admitted new key (step b). */
function fresh(over: Partial<IdempotencyRecord> = {}): IdempotencyRecord {
  return {
    fingerprint: 'fp-A',
    state: 'in_progress',
    owner: 'owner-new',
    lockedUntil: NOW + LOCK,
    // The attempt's lock end is the lock it is sent under.
    attemptUntil: over.lockedUntil ?? NOW + LOCK,
    requestId: null,
    entity: 'job:1',
    fence: 5n,
    createdAt: NOW,
    expiresAt: NOW + RETENTION,
    response: null,
    ...over,
  };
}

const forward = (takeover = false) => ({ outcome: 'forward', takeover }) as const;

// Shared by reference where a row expects the input object back unchanged.
const E5 = row(5n);
const E5_BUSY = row(5n, { owner: 'owner-old', until: NOW + 2_000 });
const E_NULL_FENCE_BUSY_FOREVER = row(null, { owner: 'owner-old', until: null });
const COMPLETED = rec({ state: 'completed', lockedUntil: null, response: STORED });
const COMPLETED_OTHER = rec({ state: 'completed', lockedUntil: null, response: STORED, fingerprint: 'fp-B' });
const COMPLETED_NO_BODY = rec({ state: 'completed', lockedUntil: null, response: null });
const RUNNING = rec();
const RUNNING_OTHER = rec({ fingerprint: 'fp-B' });
const UNKNOWN = rec({ state: 'outcome_unknown', lockedUntil: null });

interface Row {
  step: string;
  name: string;
  state: AdmissionState;
  cmd: AdmitCommand;
  now?: number;
  expected: Decision;
}

const rows: Row[] = [
  // a. The fence, first.
  {
    step: 'a',
    name: 'a lower fence is refused and logged; nothing changes',
    state: { entity: E5, record: null },
    cmd: cmd({ fence: 3n }),
    expected: {
      admission: { outcome: 'stale-fence', currentFence: 5n },
      next: { entity: E5, record: null },
      acceptedFence: null,
      rejection: { reason: 'stale-fence', presentedFence: 3n, currentFence: 5n },
    },
  },
  {
    step: 'a',
    name: 'a lower fence is refused even when its key has a stored answer (no replay)',
    state: { entity: E5, record: COMPLETED },
    cmd: cmd({ fence: 4n }),
    expected: {
      admission: { outcome: 'stale-fence', currentFence: 5n },
      next: { entity: E5, record: COMPLETED },
      acceptedFence: null,
      rejection: { reason: 'stale-fence', presentedFence: 4n, currentFence: 5n },
    },
  },
  {
    step: 'a',
    name: 'an equal fence is accepted (one owner, several commands) and its time refreshed',
    state: { entity: E5, record: null },
    cmd: cmd({ fence: 5n }),
    expected: { admission: forward(), next: { entity: row(5n, null, NOW), record: fresh() }, acceptedFence: 5n, rejection: null },
  },
  {
    step: 'a',
    name: "a higher fence raises the entity's fence",
    state: { entity: E5, record: null },
    cmd: cmd({ fence: 9n }),
    expected: { admission: forward(), next: { entity: row(9n, null, NOW), record: fresh({ fence: 9n }) }, acceptedFence: 9n, rejection: null },
  },
  {
    step: 'a',
    name: 'the first fence of an unknown entity creates its row',
    state: { entity: null, record: null },
    cmd: cmd({ fence: 1n }),
    expected: { admission: forward(), next: { entity: row(1n, null, NOW), record: fresh({ fence: 1n }) }, acceptedFence: 1n, rejection: null },
  },
  {
    step: 'a',
    name: 'a fence on an entity used so far without fences is accepted',
    state: { entity: row(null), record: null },
    cmd: cmd({ fence: 2n }),
    expected: { admission: forward(), next: { entity: row(2n, null, NOW), record: fresh({ fence: 2n }) }, acceptedFence: 2n, rejection: null },
  },
  {
    step: 'a',
    name: "a request without a fence leaves the entity's row alone",
    state: { entity: E5, record: null },
    cmd: cmd({ fence: null }),
    expected: { admission: forward(), next: { entity: E5, record: fresh({ fence: null }) }, acceptedFence: null, rejection: null },
  },
  {
    step: 'a',
    name: 'a fence without an entity checks nothing and raises nothing',
    state: { entity: null, record: null },
    cmd: cmd({ entity: null, fence: 1n }),
    expected: { admission: forward(), next: { entity: null, record: fresh({ entity: null, fence: 1n }) }, acceptedFence: null, rejection: null },
  },

  // b. A new key.
  {
    step: 'b',
    name: 'a new key is forwarded and its in-progress record written, locked and retained from now',
    state: { entity: E5, record: null },
    cmd: cmd(),
    expected: { admission: forward(), next: { entity: row(5n, null, NOW), record: fresh() }, acceptedFence: 5n, rejection: null },
  },
  {
    step: 'b',
    name: 'without a key no record is written',
    state: { entity: E5, record: null },
    cmd: cmd({ key: null }),
    expected: { admission: forward(), next: { entity: row(5n, null, NOW), record: null }, acceptedFence: 5n, rejection: null },
  },
  {
    step: 'b',
    name: 'a completed record past its retention is forgotten: the key is new again, whatever its fingerprint',
    state: { entity: E5, record: COMPLETED_OTHER },
    cmd: cmd(),
    now: COMPLETED_OTHER.expiresAt,
    expected: {
      admission: forward(),
      next: {
        entity: row(5n, null, COMPLETED_OTHER.expiresAt),
        record: fresh({
          lockedUntil: COMPLETED_OTHER.expiresAt + LOCK,
          createdAt: COMPLETED_OTHER.expiresAt,
          expiresAt: COMPLETED_OTHER.expiresAt + RETENTION,
        }),
      },
      acceptedFence: 5n,
      rejection: null,
    },
  },

  // c. Replay.
  {
    step: 'c',
    name: 'the same request under a completed key is the stored answer; an equal fence not forwarded leaves accepted_at',
    state: { entity: E5, record: COMPLETED },
    cmd: cmd(),
    expected: {
      admission: { outcome: 'replay', response: STORED },
      next: { entity: row(5n), record: COMPLETED },
      acceptedFence: 5n,
      rejection: null,
    },
  },
  {
    step: 'c',
    name: 'a replay still raises a higher fence (what step a changed stays changed)',
    state: { entity: E5, record: COMPLETED },
    cmd: cmd({ fence: 8n }),
    expected: {
      admission: { outcome: 'replay', response: STORED },
      next: { entity: row(8n, null, NOW), record: COMPLETED },
      acceptedFence: 8n,
      rejection: null,
    },
  },
  {
    step: 'c',
    name: 'a completed record one millisecond before its retention ends is still replayed',
    state: { entity: null, record: COMPLETED },
    cmd: cmd({ entity: null, fence: null }),
    now: COMPLETED.expiresAt - 1,
    expected: { admission: { outcome: 'replay', response: STORED }, next: { entity: null, record: COMPLETED }, acceptedFence: null, rejection: null },
  },
  {
    step: 'c',
    name: 'a completed record without a stored answer replays an empty 200 (decide stays total)',
    state: { entity: null, record: COMPLETED_NO_BODY },
    cmd: cmd({ entity: null, fence: null }),
    expected: { admission: { outcome: 'replay', response: EMPTY }, next: { entity: null, record: COMPLETED_NO_BODY }, acceptedFence: null, rejection: null },
  },

  // d. Key reused for another request.
  {
    step: 'd',
    name: 'another fingerprint under a completed key is refused and logged',
    state: { entity: E5, record: COMPLETED },
    cmd: cmd({ fingerprint: 'fp-B' }),
    expected: {
      admission: { outcome: 'idempotency-key-reused' },
      next: { entity: row(5n), record: COMPLETED },
      acceptedFence: 5n,
      rejection: { reason: 'idempotency-key-reused', presentedFence: 5n, currentFence: null },
    },
  },
  {
    step: 'd',
    name: 'another fingerprint is refused before the in-progress check',
    state: { entity: null, record: RUNNING_OTHER },
    cmd: cmd({ entity: null, fence: null }),
    expected: {
      admission: { outcome: 'idempotency-key-reused' },
      next: { entity: null, record: RUNNING_OTHER },
      acceptedFence: null,
      rejection: { reason: 'idempotency-key-reused', presentedFence: null, currentFence: null },
    },
  },

  // e. In progress.
  {
    step: 'e',
    name: "a key whose owner still holds the lock answers in-progress with the lock's remaining time",
    state: { entity: null, record: RUNNING },
    cmd: cmd({ entity: null, fence: null }),
    expected: {
      admission: { outcome: 'idempotency-in-progress', retryAfterMs: 5_000 },
      next: { entity: null, record: RUNNING },
      acceptedFence: null,
      rejection: null,
    },
  },
  {
    step: 'e',
    name: 'in progress one millisecond before the lock ends, even with onUnknown retry',
    state: { entity: null, record: RUNNING },
    cmd: cmd({ entity: null, fence: null, onUnknown: 'retry' }),
    now: NOW + 4_999,
    expected: {
      admission: { outcome: 'idempotency-in-progress', retryAfterMs: 1 },
      next: { entity: null, record: RUNNING },
      acceptedFence: null,
      rejection: null,
    },
  },

  // f. An expired lock: the owner died mid-request.
  {
    step: 'f',
    name: 'an expired lock marks the record outcome_unknown, and onUnknown reject refuses it',
    state: { entity: null, record: RUNNING },
    cmd: cmd({ entity: null, fence: null }),
    now: RUNNING.lockedUntil!,
    expected: {
      admission: { outcome: 'outcome-unknown' },
      next: { entity: null, record: rec({ state: 'outcome_unknown', lockedUntil: null }) },
      acceptedFence: null,
      rejection: { reason: 'outcome-unknown', presentedFence: null, currentFence: null },
    },
  },
  {
    step: 'f',
    name: 'an expired lock with onUnknown retry is taken over: new owner and lock, fingerprint, creation and retention kept',
    state: { entity: E5, record: RUNNING },
    cmd: cmd({ onUnknown: 'retry', fence: 6n }),
    now: NOW + 10_000,
    expected: {
      admission: forward(true),
      next: {
        entity: row(6n, null, NOW + 10_000),
        record: { ...RUNNING, owner: 'owner-new', lockedUntil: NOW + 10_000 + LOCK, attemptUntil: NOW + 10_000 + LOCK, requestId: null, fence: 6n },
      },
      acceptedFence: 6n,
      rejection: null,
    },
  },

  // g. outcome_unknown.
  {
    step: 'g',
    name: 'an outcome_unknown record is refused with onUnknown reject, and logged with the presented fence',
    state: { entity: E5, record: UNKNOWN },
    cmd: cmd(),
    expected: {
      admission: { outcome: 'outcome-unknown' },
      next: { entity: row(5n), record: UNKNOWN },
      acceptedFence: 5n,
      rejection: { reason: 'outcome-unknown', presentedFence: 5n, currentFence: null },
    },
  },
  {
    step: 'g',
    name: 'an outcome_unknown record is taken over with onUnknown retry',
    state: { entity: null, record: UNKNOWN },
    cmd: cmd({ entity: null, fence: null, onUnknown: 'retry' }),
    expected: {
      admission: forward(true),
      next: {
        entity: null,
        record: {
          ...UNKNOWN,
          state: 'in_progress',
          owner: 'owner-new',
          lockedUntil: NOW + LOCK,
          attemptUntil: NOW + LOCK,
          requestId: null,
          entity: null,
          fence: null,
        },
      },
      acceptedFence: null,
      rejection: null,
    },
  },

  // h. Serial mode: the entity's one slot.
  {
    step: 'h',
    name: "serial: a free slot is taken for the lock's time",
    state: { entity: E5, record: null },
    cmd: cmd({ mode: 'serial' }),
    expected: {
      admission: forward(),
      next: { entity: row(5n, { owner: 'owner-new', until: NOW + LOCK }, NOW), record: fresh() },
      acceptedFence: 5n,
      rejection: null,
    },
  },
  {
    step: 'h',
    name: 'serial: a busy slot answers entity-busy, writes no record, and keeps the raised fence',
    state: { entity: E5_BUSY, record: null },
    cmd: cmd({ mode: 'serial', fence: 7n }),
    expected: {
      admission: { outcome: 'entity-busy', retryAfterMs: 2_000 },
      next: { entity: row(7n, E5_BUSY.slot, NOW), record: null },
      acceptedFence: 7n,
      rejection: null,
    },
  },
  {
    step: 'h',
    name: 'serial: the expired slot of a dead gateway is taken over',
    state: { entity: E5_BUSY, record: null },
    cmd: cmd({ mode: 'serial', fence: null }),
    now: NOW + 2_000,
    expected: {
      admission: forward(),
      next: {
        entity: row(5n, { owner: 'owner-new', until: NOW + 2_000 + LOCK }),
        record: fresh({ fence: null, lockedUntil: NOW + 2_000 + LOCK, createdAt: NOW + 2_000, expiresAt: NOW + 2_000 + RETENTION }),
      },
      acceptedFence: null,
      rejection: null,
    },
  },
  {
    step: 'h',
    name: 'serial: a slot without an end is busy, retry after 0',
    state: { entity: E_NULL_FENCE_BUSY_FOREVER, record: null },
    cmd: cmd({ mode: 'serial', fence: null }),
    expected: {
      admission: { outcome: 'entity-busy', retryAfterMs: 0 },
      next: { entity: E_NULL_FENCE_BUSY_FOREVER, record: null },
      acceptedFence: null,
      rejection: null,
    },
  },
  {
    step: 'h',
    name: 'serial: an entity without fences gets its row for the slot',
    state: { entity: null, record: null },
    cmd: cmd({ mode: 'serial', fence: null }),
    expected: {
      admission: forward(),
      next: { entity: row(null, { owner: 'owner-new', until: NOW + LOCK }, NOW), record: fresh({ fence: null }) },
      acceptedFence: null,
      rejection: null,
    },
  },
  {
    step: 'h',
    name: 'serial without an entity takes no slot',
    state: { entity: null, record: null },
    cmd: cmd({ mode: 'serial', entity: null, fence: null }),
    expected: { admission: forward(), next: { entity: null, record: fresh({ entity: null, fence: null }) }, acceptedFence: null, rejection: null },
  },
  {
    step: 'h',
    name: 'serial busy after an expired lock: the outcome_unknown mark sticks, the takeover waits',
    state: { entity: E_NULL_FENCE_BUSY_FOREVER, record: RUNNING },
    cmd: cmd({ mode: 'serial', fence: null, onUnknown: 'retry' }),
    now: RUNNING.lockedUntil!,
    expected: {
      admission: { outcome: 'entity-busy', retryAfterMs: 0 },
      next: { entity: E_NULL_FENCE_BUSY_FOREVER, record: rec({ state: 'outcome_unknown', lockedUntil: null }) },
      acceptedFence: null,
      rejection: null,
    },
  },
];

describe('decide (DESIGN §3.5 a–h)', () => {
  // The title as a plain string: `$name` would be quoted and cut at 40 characters.
  it.each(rows.map((row) => [`(${row.step}) ${row.name}`, row] as const))('%s', (_title, { state, cmd: command, now = NOW, expected }) => {
    const before = structuredClone(state);
    const decision = decide(state, command, now);

    expect(decision).toStrictEqual(expected);
    // Unchanged parts come back as the same objects (the store writes only
    // what changed), and the input is never mutated.
    if (expected.next.entity === state.entity) expect(decision.next.entity).toBe(state.entity);
    if (expected.next.record === state.record) expect(decision.next.record).toBe(state.record);
    if (expected.next.entity === state.entity && expected.next.record === state.record) expect(decision.next).toBe(state);
    expect(state).toStrictEqual(before);
  });

  it('every step a–h has a row', () => {
    expect(new Set(rows.map((r) => r.step))).toEqual(new Set(['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']));
  });
});
