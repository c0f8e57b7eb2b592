import { afterAll, describe, expect, it } from 'vitest';
import { killAll } from '../helpers/child.js';
import { POSTGRES_URL } from '../helpers/postgres.js';
import { formatReport, runKillCampaign, VARIANTS, WINDOWS, type CampaignReport, type Variant } from './kill-campaign.js';

// The kill campaign, small (the full one: bench/kill-campaign.mjs, results in
// docs/faults.md): a gateway process SIGKILLed at each of three moments of a
// charge's life (w1 admitted, not at the upstream; w2 performed, not
// answered; w3 answered, the finish not written), restarted, the key retried,
// then counted one reconcile interval later. The upstream is not idempotent:
// a second execution is a second effect. Without `reconcile` every killed
// attempt is an unknown outcome left to an operator; with it (DESIGN §3.12)
// none is, and none is executed twice, also with a status endpoint that lags
// behind its writes. The controls show the count can fail: a settle time
// below the endpoint's lag gives duplicates, and so does an endpoint that
// lies "not found" (the gateway trusts it, DESIGN §3.12).

const TRIALS = 2;
const TIMEOUT = 180_000;

afterAll(async () => {
  await killAll();
});

async function campaign(backend: 'sqlite' | 'postgres', variant: Variant, trials = TRIALS, windows = WINDOWS, replicas = 1): Promise<CampaignReport> {
  const report = await runKillCampaign({ backend, postgresUrl: POSTGRES_URL, variant, trials, windows, replicas });
  console.log(formatReport(report));
  return report;
}

function expectBefore(r: CampaignReport) {
  expect(r.harnessErrors).toEqual([]);
  expect(r.total.trials).toBe(TRIALS * WINDOWS.length);
  expect(r.total.duplicates, JSON.stringify(r.trials)).toBe(0);
  // Every killed attempt, whether or not the upstream acted, waits for an operator (G4).
  expect(r.total.needsOperator, JSON.stringify(r.trials)).toBe(r.total.trials);
  expect(r.total.settled).toBe(0);
}

function expectAfter(r: CampaignReport, trials = TRIALS) {
  expect(r.harnessErrors).toEqual([]);
  expect(r.total.trials).toBe(trials * WINDOWS.length);
  expect(r.total.duplicates, JSON.stringify(r.trials)).toBe(0);
  expect(r.total.needsOperator, JSON.stringify(r.trials)).toBe(0);
  // Every retry got its answer: the upstream's (w1: sent after the release) or the status query's (w2, w3).
  expect(r.total.settled).toBe(r.total.trials);
  for (const t of r.trials) expect(t.effects, t.key).toBe(1);
  expect(r.statusCalls).toBeGreaterThan(0);
}

describe('kill campaign: SQLite', () => {
  it('without reconcile: no duplicate, every killed attempt needs an operator', { timeout: TIMEOUT }, async () => {
    expectBefore(await campaign('sqlite', VARIANTS.before));
  });

  it('with reconcile: no duplicate, no key needs an operator', { timeout: TIMEOUT }, async () => {
    expectAfter(await campaign('sqlite', VARIANTS.after));
  });

  it('with reconcile and a status endpoint lagging 2 s (settle time 3 s): no duplicate, no key needs an operator', { timeout: TIMEOUT }, async () => {
    expectAfter(await campaign('sqlite', VARIANTS.afterLag));
  });

  it('negative control: a settle time (0) below the status endpoint lag: performed charges run twice', { timeout: TIMEOUT }, async () => {
    const r = await campaign('sqlite', VARIANTS.control, 1, ['w2', 'w3']);
    expect(r.harnessErrors).toEqual([]);
    // Both windows had the charge performed; the lagging "not found" was trusted, the retry sent again.
    expect(r.windows.w2!.duplicates).toBe(1);
    expect(r.windows.w3!.duplicates).toBe(1);
  });
});

describe('kill campaign: the status endpoint is trusted', () => {
  it('negative control: an endpoint that lies "not found" for a performed charge: it runs twice', { timeout: TIMEOUT }, async () => {
    const r = await campaign('sqlite', VARIANTS.lies, 1, ['w2']);
    expect(r.harnessErrors).toEqual([]);
    expect(r.windows.w2!.duplicates).toBe(1);
  });
});

describe.skipIf(!POSTGRES_URL)('kill campaign: PostgreSQL', () => {
  it('without reconcile: no duplicate, every killed attempt needs an operator', { timeout: TIMEOUT }, async () => {
    expectBefore(await campaign('postgres', VARIANTS.before));
  });

  it('with reconcile and a lagging status endpoint: no duplicate, no key needs an operator', { timeout: TIMEOUT }, async () => {
    expectAfter(await campaign('postgres', VARIANTS.afterLag));
  });

  it('two replicas, the caller failing over to the other as the killed one restarts, with reconcile: no duplicate, no key needs an operator', {
    timeout: TIMEOUT,
  }, async () => {
    expectAfter(await campaign('postgres', VARIANTS.after, 1, WINDOWS, 2), 1);
  });
});
