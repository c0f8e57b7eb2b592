/**
 * completeAndClaim by a stale lease, on every store: it completes nothing
 * and claims nothing (the store conformance suite holds each store to it,
 * ./conformance.ts). The control is the composition the operation exists to
 * avoid, a complete followed by a claim whatever the complete said: in the
 * same scenario it claims the waiting job for the stale worker, so the
 * scenario tells the two apart.
 */
import { afterEach, expect, test } from 'vitest';
import type { JobStore, LeaseRef } from '../../src/lease/types.js';
import { BACKENDS, type TestDatabase } from './helpers/stores.js';

const opened: TestDatabase[] = [];
afterEach(async () => {
  for (const db of opened.splice(0)) await db.dispose();
});

type CompleteAndClaim = (store: JobStore, lease: LeaseRef) => ReturnType<NonNullable<JobStore['completeAndClaim']>>;

/** A stale lease (taken over by w2) and a queued job: what the stale worker's complete-and-claim leaves. */
async function staleScenario(factory: () => Promise<TestDatabase>, completeAndClaim: CompleteAndClaim) {
  const db = await factory();
  opened.push(db);
  const store = await db.open();
  const { job } = await store.enqueue({ kind: 'payment', idempotencyKey: `k-${Math.random()}`, payload: {} });
  const w1 = (await store.claim({ workerId: 'w1' })).lease!;
  await db.expireLease(job.id);
  expect((await store.claim({ workerId: 'w2' })).lease?.id).toBe(job.id);
  const waiting = await store.enqueue({ kind: 'payment', idempotencyKey: `k-${Math.random()}`, payload: {} });
  const res = await completeAndClaim(store, w1);
  return { res, waiting: (await store.get(waiting.job.id))! };
}

for (const { name, factory, skip } of BACKENDS) {
  test.skipIf(skip)(`${name}: a stale lease's completeAndClaim claims nothing; control: complete-then-claim claims the waiting job`, async () => {
    const real = await staleScenario(factory, (store, lease) => store.completeAndClaim!(lease, 'late', { workerId: 'w1' }));
    expect(real.res).toEqual({ complete: { ok: false, reason: 'lease_lost' }, claim: { lease: null, failed: [] } });
    expect(real.waiting).toMatchObject({ state: 'queued', ownerId: null });

    const naive = await staleScenario(factory, async (store, lease) => ({
      complete: await store.complete(lease, 'late'),
      claim: await store.claim({ workerId: 'w1' }),
    }));
    expect(naive.res.complete).toEqual({ ok: false, reason: 'lease_lost' });
    expect(naive.res.claim.lease?.id).toBe(naive.waiting.id);
    expect(naive.waiting).toMatchObject({ state: 'running', ownerId: 'w1' });
  });
}
