/**
 * The lease store's claim group (src/lease/postgres/claim.ts) with a fake
 * statement: once a statement has committed, its answers reach their
 * callers even when the follow-up claim (for callers left without a lease
 * because some picked jobs were dead) fails. Controls: a first statement
 * that fails (nothing committed) rejects its callers.
 */
import { expect, test } from 'vitest';
import { claimers } from '../../src/lease/postgres/claim.js';
import type { Prepared } from '../../src/lease/postgres/prepared.js';
import * as q from '../../src/lease/postgres/queries.js';
import type { JobStoreOptions, LeaseRef } from '../../src/lease/types.js';

const row = (id: number, state: 'running' | 'failed') => ({
  id: String(id),
  kind: 'k',
  state,
  owner_id: 'w',
  lease_until: new Date(Date.now() + 60_000),
  fencing_token: '1',
  heartbeat_at: null,
  attempt: 1,
  max_attempts: 3,
  idempotency_key: `k${id}`,
  job_key: `tool-job:${id}`,
  fence_key: `tool-job:${id}`,
  payload: {},
  payload_sha256: '-',
  result: null,
  error: null,
  reason: state === 'failed' ? 'deadline' : null,
  previous_owner_id: null,
  created_at: new Date(),
  first_claimed_at: new Date(),
  deadline_at: null,
  run_after: new Date(),
  finished_at: null,
});

const name = (text: string) =>
  text === q.COMPLETE_CLAIM_MANY ? 'COMPLETE_CLAIM_MANY' : text === q.CLAIM ? 'CLAIM' : text === q.CLAIM_MANY ? 'CLAIM_MANY' : 'other';

/**
 * A statement that answers `answer(name, nth)` for every statement after a
 * first lone claim, which waits until released so the next calls share one
 * statement.
 */
function fake(answer: (statement: string, nth: number) => unknown[]) {
  const sent: string[] = [];
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const prepared = async (text: string) => {
    sent.push(name(text));
    if (sent.length === 1) {
      await gate;
      return { rows: [] };
    }
    return { rows: answer(name(text), sent.length) };
  };
  return { sent, release, c: claimers(prepared as unknown as Prepared, {} as JobStoreOptions) };
}

const lease1 = { id: 1, ownerId: 'w', fencingToken: 1 } as LeaseRef;

async function completeClaimThenFollowUp(firstFails: boolean) {
  const { sent, release, c } = fake((statement) => {
    if (statement === 'COMPLETE_CLAIM_MANY' && !firstFails)
      return [
        { ...row(10, 'running'), done: ['1'] },
        { ...row(11, 'failed'), done: ['1'] },
      ];
    throw new Error('connection reset');
  });
  const first = c.claim({ workerId: 'w' });
  const both = c.completeAndClaim(lease1, 'ok', { workerId: 'w' });
  const plain = c.claim({ workerId: 'w' });
  release();
  await first;
  return { sent, settled: await Promise.allSettled([both, plain]) };
}

test('a failing follow-up claim leaves committed completes, leases and dead jobs with their callers', async () => {
  const { sent, settled } = await completeClaimThenFollowUp(false);
  // Job 10 claimed, job 11 found dead: the second claimer's follow-up failed.
  expect(sent).toEqual(['CLAIM', 'COMPLETE_CLAIM_MANY', 'CLAIM']);
  const [both, plain] = settled;
  expect(both).toMatchObject({ status: 'fulfilled', value: { complete: { ok: true } } });
  expect(plain.status).toBe('fulfilled');
  const leases = [(both as PromiseFulfilledResult<any>).value.claim, (plain as PromiseFulfilledResult<any>).value].map((r) => r.lease?.id ?? null);
  expect(leases.sort()).toEqual([10, null]);
  const failed = [(both as PromiseFulfilledResult<any>).value.claim, (plain as PromiseFulfilledResult<any>).value].flatMap((r) =>
    r.failed.map((f: { id: number }) => f.id),
  );
  expect(failed).toEqual([11]);
});

test('control: a first statement that fails (nothing committed) rejects every call of its group', async () => {
  const { sent, settled } = await completeClaimThenFollowUp(true);
  expect(sent).toEqual(['CLAIM', 'COMPLETE_CLAIM_MANY']);
  expect(settled.map((s) => s.status)).toEqual(['rejected', 'rejected']);
});

async function plainClaimsThenFollowUp(firstFails: boolean) {
  const { sent, release, c } = fake((_statement, nth) => {
    if (nth === 2 && !firstFails) return [row(20, 'failed'), row(21, 'running')];
    throw new Error('connection reset');
  });
  const first = c.claim({ workerId: 'w' });
  const a = c.claim({ workerId: 'w' });
  const b = c.claim({ workerId: 'w' });
  release();
  await first;
  return { sent, settled: await Promise.allSettled([a, b]) };
}

test('claims alone: a later dead-job round that fails leaves the leases of the first with their callers', async () => {
  const { sent, settled } = await plainClaimsThenFollowUp(false);
  expect(sent).toEqual(['CLAIM', 'CLAIM_MANY', 'CLAIM']);
  expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled']);
  const results = settled.map((s) => (s as PromiseFulfilledResult<any>).value);
  expect(results.map((r) => r.lease?.id ?? null)).toEqual([21, null]);
  expect(results.flatMap((r) => r.failed.map((f: { id: number }) => f.id))).toEqual([20]);
});

test('control: claims alone whose first round fails reject', async () => {
  const { sent, settled } = await plainClaimsThenFollowUp(true);
  expect(sent).toEqual(['CLAIM', 'CLAIM_MANY']);
  expect(settled.map((s) => s.status)).toEqual(['rejected', 'rejected']);
});

test('a group with a complete claims again for its dead picks once, not round after round (its completes wait on it)', async () => {
  // Every claim statement after the combined one finds only dead jobs, as many as it asks for.
  const { sent, release, c } = fake((statement, nth) => {
    if (statement === 'COMPLETE_CLAIM_MANY')
      return [
        { ...row(11, 'failed'), done: ['1'] },
        { ...row(12, 'failed'), done: ['1'] },
      ];
    return statement === 'CLAIM_MANY' ? [row(100 + nth, 'failed'), row(200 + nth, 'failed')] : [row(100 + nth, 'failed')];
  });
  const first = c.claim({ workerId: 'w' });
  const both = c.completeAndClaim(lease1, 'ok', { workerId: 'w' });
  const plain = c.claim({ workerId: 'w' });
  release();
  await first;
  const [b, p] = await Promise.all([both, plain]);
  expect(b.complete).toEqual({ ok: true });
  expect(b.claim.lease).toBeNull();
  expect(p.lease).toBeNull();
  expect(sent).toEqual(['CLAIM', 'COMPLETE_CLAIM_MANY', 'CLAIM_MANY']);
  // Control: a plain claim group takes its dead-job rounds until a live job or the cap.
  const plainOnly = fake((statement, nth) => (statement === 'CLAIM_MANY' ? [row(100 + nth, 'failed'), row(200 + nth, 'failed')] : [row(100 + nth, 'failed')]));
  const lone = plainOnly.c.claim({ workerId: 'w' });
  const later = plainOnly.c.claim({ workerId: 'w' });
  plainOnly.release();
  await Promise.all([lone, later]);
  expect(plainOnly.sent.length).toBeGreaterThan(3);
});
