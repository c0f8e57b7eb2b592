/**
 * The rule of DESIGN §8.2 for an admission whose answer was lost,
 * `releaseUnsent` (src/core/admission.ts), case by case; the stores are held
 * to it by the admission conformance property (./admission-conformance.ts).
 */
import { describe, expect, it } from 'vitest';
import { decide, finish, releaseUnsent, type AdmissionState, type AdmitCommand } from '../../src/core/admission.js';

const LOCK = 30_000;
const cmd = (owner: string, over: Partial<AdmitCommand> = {}): AdmitCommand => ({
  key: 'k',
  entity: 'e',
  fence: 5n,
  fingerprint: 'fp',
  mode: 'serial',
  ownerToken: owner,
  lockMs: LOCK,
  retentionMs: 86_400_000,
  onUnknown: 'reject',
  ...over,
});
const EMPTY: AdmissionState = { entity: null, record: null };

/** The state one forwarded admission leaves on an empty store, at time 1000. */
function admitted(c: AdmitCommand): AdmissionState {
  const d = decide(EMPTY, c, 1000);
  expect(d.admission).toEqual({ outcome: 'forward', takeover: false });
  return d.next;
}

describe('releaseUnsent (DESIGN §8.2)', () => {
  it('frees the slot and deletes the record held under the owner token; the fence stays', () => {
    const c = cmd('o1');
    const r = releaseUnsent(admitted(c), c);
    expect(r).toEqual({ slot: true, record: true, next: { entity: { fence: 5n, acceptedAt: 1000, slot: null }, record: null } });
  });

  it("another owner's record and slot, or none, are left as they are", () => {
    const held = admitted(cmd('o1'));
    const r = releaseUnsent(held, cmd('o2'));
    expect(r).toEqual({ slot: false, record: false, next: held });
    expect(releaseUnsent(held, cmd('o2')).next).toBe(held);
    expect(releaseUnsent(EMPTY, cmd('o1'))).toEqual({ slot: false, record: false, next: EMPTY });
  });

  it('onUnknown: reject deletes an outcome_unknown record of the owner; a completed one stays', () => {
    const c = cmd('o1');
    const unknown = finish(admitted(c), { ...c, outcome: 'unknown' }, 2000).next;
    expect(unknown.record?.state).toBe('outcome_unknown');
    expect(releaseUnsent(unknown, c)).toMatchObject({ record: true, next: { record: null } });
    const done = finish(admitted(c), { ...c, outcome: 'completed', response: { status: 200, headers: [], body: new Uint8Array() }, retentionMs: 1 }, 2000).next;
    expect(releaseUnsent(done, c)).toMatchObject({ record: false, next: { record: done.record } });
  });

  it('onUnknown: retry: a record the admission created is deleted; a taken-over one goes back to outcome_unknown; an outcome_unknown one stays', () => {
    const first = cmd('o1', { onUnknown: 'retry' });
    expect(releaseUnsent(admitted(first), first)).toMatchObject({ record: true, next: { record: null } });
    // The first attempt's outcome is unknown; the retry takes its record over, later.
    const unknown = finish(admitted(first), { ...first, outcome: 'unknown' }, 2000).next;
    const retry = cmd('o2', { onUnknown: 'retry' });
    const taken = decide(unknown, retry, 3000);
    expect(taken.admission).toEqual({ outcome: 'forward', takeover: true });
    const back = releaseUnsent(taken.next, retry);
    expect(back).toMatchObject({
      slot: true,
      record: true,
      next: { record: { state: 'outcome_unknown', owner: 'o2', lockedUntil: null, createdAt: 1000, fingerprint: 'fp' } },
    });
    // Its fingerprint keeps refusing another payload under the key.
    expect(decide(back.next, cmd('o3', { onUnknown: 'retry', fingerprint: 'other' }), 4000).admission).toEqual({ outcome: 'idempotency-key-reused' });
    // Already outcome_unknown: created or taken over, no one can tell; it stays.
    expect(releaseUnsent(back.next, retry)).toEqual({ slot: false, record: false, next: back.next });
  });

  it('key only and entity only: the absent side is not touched', () => {
    const keyOnly = cmd('o1', { entity: null, fence: null });
    expect(releaseUnsent(admitted(keyOnly), keyOnly)).toEqual({ slot: false, record: true, next: { entity: null, record: null } });
    const entityOnly = cmd('o1', { key: null });
    expect(releaseUnsent(admitted(entityOnly), entityOnly)).toMatchObject({ slot: true, record: false, next: { record: null } });
  });

  it('applying it twice gives what applying it once gives', () => {
    for (const onUnknown of ['reject', 'retry'] as const) {
      const c = cmd('o1', { onUnknown });
      const once = releaseUnsent(admitted(c), c);
      expect(releaseUnsent(once.next, c).next).toEqual(once.next);
    }
  });
});
