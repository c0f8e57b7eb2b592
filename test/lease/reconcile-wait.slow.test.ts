/**
 * DESIGN §3.12 and §6.4 end to end: a worker's step whose first answer was
 * lost (the provider charges, but answers after the gateway's timeout), the
 * job retried in a new attempt, and a provider status endpoint that lags
 * ("not found" for a while). On a route with `reconcile` the gateway's 409
 * outcome-unknown says when to ask again, and `fencedFetch` waits within the
 * lease until the charge comes back. A real gateway, a real runner with its
 * heartbeat thread, a real SQLite job store, the loopback provider.
 */
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import type { LeaseEvent } from '../../src/lease/events.js';
import { runWorker } from '../../src/lease/runner/run-worker.js';
import type { RunWorkerOptions } from '../../src/lease/runner/options.js';
import type { LeaseWorker } from '../../src/lease/runner/types.js';
import type { JobStore } from '../../src/lease/types.js';
import { startTestGateway, type RouteInput, type TestGateway } from '../helpers/gateway.js';
import { startProvider, type Provider } from '../reconcile/provider.js';
import { TS_EXEC_ARGV } from './helpers/node.js';
import { sqliteDatabase, type TestDatabase } from './helpers/stores.js';

/** The gateway gives up on the provider after this; the provider answers after ANSWER_MS. */
const TIMEOUT_MS = 200;
const ANSWER_MS = 600;
/** The status endpoint shows a charge this long after it was written. */
const LAG_MS = 2_500;

/** The charges route, with `reconcile` (the hint) or without (the negative control). */
function chargesRoute(upstream: string, reconcile: boolean): RouteInput {
  return {
    name: 'charges',
    match: { path: '/charges', methods: ['POST'] },
    upstream,
    entity: { header: 'X-Fence-Entity' },
    fence: 'required',
    idempotency: 'required',
    mode: 'concurrent',
    timeoutMs: TIMEOUT_MS,
    lockMarginMs: 100,
    maxWaitMs: 1_000,
    onUnknown: 'reject',
    // A settle time far past the test: "not found" is never trusted here, so only "found" can end the wait.
    ...(reconcile ? { reconcile: { path: '/charges/by-key/{key}', settleTime: '60s', interval: '1s' } } : {}),
  };
}

describe('fencedFetch waits for reconciliation within its lease (real gateway, real runner)', () => {
  let db: TestDatabase;
  let store: JobStore;
  let provider: Provider;
  /** The same route in front of the same provider, with `reconcile` and without. */
  const gateways: Record<'reconciled' | 'plain', TestGateway> = {} as never;
  const workers: LeaseWorker[] = [];

  beforeAll(async () => {
    db = await sqliteDatabase();
    store = await db.open();
    provider = await startProvider({ writeAfterMs: 0, answerAfterMs: ANSWER_MS, lagMs: LAG_MS });
    gateways.reconciled = await startTestGateway({ routes: [chargesRoute(provider.url, true)] });
    gateways.plain = await startTestGateway({ routes: [chargesRoute(provider.url, false)] });
  });
  afterEach(async () => {
    await Promise.all(workers.splice(0).map((w) => w.stop({ release: true })));
  });
  afterAll(async () => {
    await gateways.reconciled?.close();
    await gateways.plain?.close();
    await provider?.close();
    await db?.dispose();
  });

  async function start(route: 'reconciled' | 'plain', timing: Partial<RunWorkerOptions> = {}) {
    const answers: { attempt: number; status: number; reconciled: string | null; type?: string; reconciling?: unknown }[] = [];
    const worker = await runWorker({
      store,
      workerId: `W-${route}`,
      leaseMs: 5_000,
      heartbeatMs: 300,
      maxMissedHeartbeats: 3,
      jitterMs: 50,
      pollIntervalMs: 25,
      retry: { baseMs: 20, maxMs: 20 },
      threadExecArgv: TS_EXEC_ARGV,
      ...timing,
      handlers: {
        pay: async ({ job, fencedFetch }) => {
          // The provider's charge: the provider itself does not deduplicate (the gateway does).
          const res = await fencedFetch(`${gateways[route].url}/charges`, {
            step: 'charge',
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: '{"amount":500}',
          });
          const body = (await res.json()) as { type?: string; id?: string; reconciling?: unknown };
          answers.push({
            attempt: job.attempt,
            status: res.status,
            reconciled: res.headers.get('fencegate-reconciled'),
            type: body.type,
            reconciling: body.reconciling,
          });
          if (!res.ok) throw new Error(`charge answered ${res.status} ${body.type ?? ''}`);
          return { status: res.status, id: body.id };
        },
      },
    });
    workers.push(worker);
    const events: LeaseEvent[] = [];
    worker.events.onAny((e) => events.push(e));
    return { worker, events, answers };
  }

  /** Waits for the job to end, committed or terminally failed. */
  const ended = (worker: LeaseWorker, jobId: number) =>
    Promise.race([
      worker.events.waitFor('result_committed', (e) => e.jobId === jobId),
      worker.events.waitFor('job_failed', (e) => e.jobId === jobId && e.terminal),
    ]);

  test('a lost answer, retried in a new attempt: fencedFetch waits out the lagging status endpoint and gets the charge back; one charge, the job completes', async () => {
    const { job } = await store.enqueue({ kind: 'pay', idempotencyKey: 'order-reconciled', payload: {}, maxAttempts: 2 });
    const key = `${job.jobKey}:charge`;
    const { worker, events, answers } = await start('reconciled');
    const end = await ended(worker, job.id);
    expect(end.type).toBe('result_committed');

    // Attempt 1: the gateway's timeout (504). Attempt 2: the 409s were waited out inside fencedFetch,
    // so the handler saw only the reconciled charge.
    expect(answers.map((a) => [a.attempt, a.status, a.reconciled])).toEqual([
      [1, 504, null],
      [2, 200, 'true'],
    ]);
    expect(provider.chargesFor(key)).toBe(1);
    expect(provider.statusCalls).toBeGreaterThanOrEqual(2);
    expect(await store.get(job.id)).toMatchObject({
      state: 'succeeded',
      attempt: 2,
      result: { status: 200, id: provider.charges.find((c) => c.key === key)!.id },
    });

    const started = events.filter((e) => e.type === 'tool_request_started' && e.jobId === job.id);
    const reconciled = events.filter((e) => e.type === 'outcome_reconciled');
    expect(started).toHaveLength(2);
    expect(reconciled).toEqual([
      expect.objectContaining({
        jobId: job.id,
        step: 'charge',
        idempotencyKey: key,
        requestId: (started[1] as { requestId: string }).requestId,
        fencingToken: 2,
      }),
    ]);
    expect((reconciled[0] as { waits: number }).waits).toBeGreaterThanOrEqual(1);
  });

  // Negative control: the same handler and provider on a route without `reconcile`: the 409 carries
  // no hint, fencedFetch hands it on, and the job fails as it did before the hint (an operator's).
  test('without the gateway hint (no reconcile on the route) the handler gets the 409 and the job fails', async () => {
    const { job } = await store.enqueue({ kind: 'pay', idempotencyKey: 'order-plain', payload: {}, maxAttempts: 2 });
    const key = `${job.jobKey}:charge`;
    const { worker, events, answers } = await start('plain');
    const end = await ended(worker, job.id);
    expect(end).toMatchObject({ type: 'job_failed', terminal: true });
    expect(answers.map((a) => [a.attempt, a.status])).toEqual([
      [1, 504],
      [2, 409],
    ]);
    expect(answers[1]!.type).toMatch(/\/outcome-unknown$/);
    expect(provider.chargesFor(key)).toBe(1);
    expect(answers[1]!.reconciling).toBeUndefined();
    expect(events.filter((e) => e.type === 'outcome_reconciled')).toEqual([]);
  });

  // A lease confirmed for less than one Retry-After plus a heartbeat: fencedFetch does not wait
  // (the wait could end past what the lease covers) and hands the 409 on, long before the charge shows.
  test('a lease too short to wait: fencedFetch hands the 409 on at once, and the job fails', async () => {
    const { job } = await store.enqueue({ kind: 'pay', idempotencyKey: 'order-short-lease', payload: {}, maxAttempts: 2 });
    const key = `${job.jobKey}:charge`;
    const { worker, events, answers } = await start('reconciled', { leaseMs: 1_100, heartbeatMs: 250, maxMissedHeartbeats: 3, jitterMs: 50 });
    const end = await ended(worker, job.id);
    expect(end).toMatchObject({ type: 'job_failed', terminal: true });
    expect(answers.map((a) => [a.attempt, a.status])).toEqual([
      [1, 504],
      [2, 409],
    ]);
    // Handed on without a wait: attempt 2's send and its failure are well under one Retry-After (1 s) apart.
    const second = events.find((e) => e.type === 'tool_request_started' && e.jobId === job.id && e.fencingToken === 2)!;
    expect(end.at.getTime() - second.at.getTime()).toBeLessThan(1_000);
    expect(provider.chargesFor(key)).toBe(1);
    expect(events.filter((e) => e.type === 'outcome_reconciled')).toEqual([]);
  });
});
