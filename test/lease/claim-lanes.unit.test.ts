/**
 * The claim lanes (src/lease/runner/claim-lanes.ts) with a fake store: a
 * slot's complete-and-claim that finds nothing tells the lanes the queue is
 * drained, as a lane's empty claim does, so the slots freed then do not
 * each send an empty claim of their own: lane 0 polls alone.
 */
import { expect, test } from 'vitest';
import { startClaimLanes } from '../../src/lease/runner/claim-lanes.js';
import type { ClaimResult, CompleteAndClaimResult, Lease } from '../../src/lease/types.js';

const flush = async () => {
  for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
};

/**
 * Two slots take the only two jobs; both finish at once and send their
 * complete with the claim of their next job, which answers `answer`. Returns
 * how many claims the lanes sent after that.
 */
async function claimsAfterDrain(answer: CompleteAndClaimResult) {
  let jobs = [1, 2];
  let claims = 0;
  let active = 0;
  const lanes = startClaimLanes({
    workerId: 'w',
    config: { concurrency: 2, pollIntervalMs: 3_600_000, leaseMs: 60_000, kinds: { k: { leaseMs: 60_000 } }, handlers: { k: { run: () => 0 } } } as never,
    store: {
      claim: async (): Promise<ClaimResult> => {
        claims++;
        const id = jobs.shift();
        return { lease: id === undefined ? null : ({ id, kind: 'k' } as Lease), failed: [] };
      },
      release: async () => ({ ok: true }) as never,
      completeAndClaim: async () => answer,
    },
    activeCount: () => active,
    start: () => void active++,
    emit: () => {},
  });
  await flush();
  expect({ claims, active }).toEqual({ claims: 2, active: 2 });
  jobs = [];
  const slots = [lanes.next()!, lanes.next()!];
  const answers = await Promise.all(slots.map((s, i) => s.send({ id: i + 1, ownerId: 'w', fencingToken: 1, leaseMs: 60_000 }, 'ok')));
  slots.forEach((s, i) => s.take(answers[i]!.complete.ok ? answers[i]!.claim : undefined));
  const before = claims;
  for (const _ of slots) {
    active--;
    lanes.wake();
  }
  await flush();
  const after = claims - before;
  await lanes.stop();
  return after;
}

test('complete-and-claims that find nothing: the freed slots wake lane 0 alone, one empty claim instead of one per slot', async () => {
  expect(await claimsAfterDrain({ complete: { ok: true }, claim: { lease: null, failed: [] } })).toBe(1);
});

test('control: complete-and-claims that claimed nothing because their completes were refused say nothing of the queue: each freed slot claims', async () => {
  expect(await claimsAfterDrain({ complete: { ok: false, reason: 'lease_lost' }, claim: { lease: null, failed: [] } })).toBe(2);
});
