import { afterAll, describe, expect, it } from 'vitest';
import { POSTGRES_URL } from '../helpers/postgres.js';
import { checkScenario, problemType, runStaleOwner, type Backend } from './scenario.js';
import { killAll } from '../helpers/child.js';

// The seed's scenario end to end, with real processes and real faults (see
// ./scenario.ts for the story). Each run starts its own gateway, workers,
// proxies and upstream, and tears them down also when it fails.

afterAll(async () => {
  await killAll();
});

const TIMEOUT = 120_000;

function scenarioSuite(backend: Backend) {
  it('W1 is refused everywhere: extend, late requests (409 stale-fence, audited), result; one charge and one payout upstream', {
    timeout: TIMEOUT,
  }, async () => {
    const r = await runStaleOwner({ backend });
    expect(checkScenario(r)).toEqual([]);
    // The same facts, spelled out.
    expect(r.w2Token).toBe(r.w1Token + 1);
    expect(r.late.map((h) => [h.response?.status, problemType(h)])).toEqual([
      [409, 'stale-fence'],
      [409, 'stale-fence'],
    ]);
    expect(r.w1Extend).toMatchObject({ ok: false, reason: 'lease_lost' });
    expect(r.w1Complete).toMatchObject({ ok: false, reason: 'lease_lost' });
    expect(r.w1ResultRejected).toMatchObject({ reason: 'lease_lost' });
    expect(r.rejections).toEqual(
      expect.arrayContaining([
        expect.objectContaining({
          reason: 'stale-fence',
          entity: r.entity,
          presented_fence: String(r.w1Token),
          current_fence: String(r.w2Token),
          path: '/payments/charges',
        }),
        expect.objectContaining({
          reason: 'stale-fence',
          entity: r.entity,
          presented_fence: String(r.w1Token),
          current_fence: String(r.w2Token),
          path: '/payouts/send',
        }),
      ]),
    );
    expect(r.charges.map((c) => c.fence)).toEqual([String(r.w2Token)]);
    expect(r.payouts.map((c) => c.fence)).toEqual([String(r.w2Token)]);
    expect(r.job).toMatchObject({ state: 'succeeded', fencingToken: r.w2Token, result: { worker: 'w2', fence: r.w2Token } });
  });

  it('negative control: the same run with the gateway fence check switched off FAILS, with a second payout', { timeout: TIMEOUT }, async () => {
    const r = await runStaleOwner({ backend, checksOff: 'fence' });
    const failures = checkScenario(r);
    expect(failures).toContain(`exactly one payout upstream (2)`);
    // W1's late payout went through with its stale fence, after W2's.
    expect(r.payouts.map((c) => c.fence)).toEqual([String(r.w2Token), String(r.w1Token)]);
    // Its late charge shares W2's key: the idempotency cache answered it with
    // W2's charge (a replay), so it is not a second charge, but not a refusal either.
    expect(r.charges).toHaveLength(1);
    const lateCharge = r.late.find((h) => h.head.target === '/payments/charges')!;
    expect(lateCharge.response?.status).toBe(201);
    expect(lateCharge.response?.text.toLowerCase()).toContain('idempotent-replayed: true');
    // The database side does not depend on the gateway: W1's extend and result are still refused.
    expect(r.w1Extend).toMatchObject({ ok: false });
    expect(r.w1Complete).toMatchObject({ ok: false });
  });
}

describe('stale owner on SQLite (W1 frozen with SIGSTOP)', () => {
  scenarioSuite('sqlite');
});

describe.skipIf(!POSTGRES_URL)('stale owner on PostgreSQL (W1 cut off from the database through a fault proxy)', () => {
  scenarioSuite('postgres');
});
