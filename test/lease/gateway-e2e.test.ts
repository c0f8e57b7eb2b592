/**
 * The lease module end to end with the real gateway (started as
 * `fencegate serve` starts it, on loopback) in front of a recording upstream
 * that is deliberately not idempotent: every request that reaches it is one
 * more payment. The token a claim hands out is the `X-Execution-Fence` the
 * gateway checks.
 */
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { LeaseLostError } from '../../src/lease/errors.js';
import type { LeaseEvent } from '../../src/lease/events.js';
import type { FencedFetch } from '../../src/lease/fenced-fetch.js';
import { runWorker } from '../../src/lease/runner/run-worker.js';
import type { RunWorkerOptions } from '../../src/lease/runner/options.js';
import type { LeaseWorker } from '../../src/lease/runner/types.js';
import type { JobStore } from '../../src/lease/types.js';
import { paymentsRoute, rejectionRows, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { TS_EXEC_ARGV } from './helpers/node.js';
import { sqliteDatabase, type TestDatabase } from './helpers/stores.js';

function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, opened };
}

describe('fencegate/lease through the real gateway', () => {
  let db: TestDatabase;
  let store: JobStore;
  let upstream: FakeUpstream;
  let gateway: TestGateway;
  const workers: LeaseWorker[] = [];

  beforeAll(async () => {
    db = await sqliteDatabase();
    store = await db.open();
    upstream = await startUpstream();
    gateway = await startTestGateway({ routes: [paymentsRoute(upstream.url)] });
  });
  afterEach(async () => {
    await Promise.all(workers.splice(0).map((w) => w.stop({ release: true })));
  });
  afterAll(async () => {
    await gateway?.close();
    await upstream?.close();
    await db?.dispose();
  });

  async function start(options: Partial<RunWorkerOptions> & Pick<RunWorkerOptions, 'handlers' | 'workerId'>) {
    const worker = await runWorker({
      store,
      // Long enough that a stalled disk or a stolen CPU does not end a lease
      // mid-test (a re-claim would raise the fence the tests check); no test
      // here waits for a lease to run out, they expire it (expireLease).
      leaseMs: 5_000,
      heartbeatMs: 300,
      maxMissedHeartbeats: 3,
      jitterMs: 50,
      pollIntervalMs: 25,
      threadExecArgv: TS_EXEC_ARGV,
      ...options,
    });
    workers.push(worker);
    const events: LeaseEvent[] = [];
    worker.events.onAny((e) => events.push(e));
    return { worker, events };
  }

  const charge = (fencedFetch: FencedFetch, body: object) =>
    fencedFetch(`${gateway.url}/payments/charges`, {
      step: 'charge',
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });

  test('a late request from the owner that lost the job is refused by the fence; the upstream is paid once, by the new owner', async () => {
    const { job } = await store.enqueue({ kind: 'pay-late', idempotencyKey: 'order-1', payload: { amount: 1200 } });
    // W1's request leaves while its lease is fine, then hangs on the wire and
    // lands after W2 paid (nothing can recall a request already sent).
    const onTheWire = gate();
    const land = gate();
    let w1Error: unknown;
    const w1 = await start({
      workerId: 'W1',
      fetch: async (input, init) => {
        onTheWire.open();
        await land.opened;
        return fetch(input, { ...init, signal: null });
      },
      handlers: {
        'pay-late': async ({ fencedFetch }) => {
          try {
            return await (await charge(fencedFetch, { amount: 1200 })).json();
          } catch (err) {
            w1Error = err;
            throw err;
          }
        },
      },
    });
    await onTheWire.opened;
    await db.expireLease(job.id);

    const w2 = await start({
      workerId: 'W2',
      handlers: { 'pay-late': async ({ fencedFetch }) => (await charge(fencedFetch, { amount: 1200 })).json() },
    });
    await w2.worker.events.waitFor('result_committed', (e) => e.jobId === job.id);

    land.open();
    await w1.worker.events.waitFor('result_rejected', (e) => e.jobId === job.id && e.fencingToken === 1);
    expect(w1Error).toBeInstanceOf(LeaseLostError);

    expect(upstream.effects).toBe(1);
    expect(upstream.calls[0]).toMatchObject({ fence: '2', entity: job.jobKey, key: `${job.jobKey}:charge` });
    expect(rejectionRows(gateway.sqlite, 'stale-fence')).toEqual([
      expect.objectContaining({ entity: job.jobKey, presented_fence: 1, current_fence: 2, idempotency_key: `${job.jobKey}:charge` }),
    ]);
    expect(await store.get(job.id)).toMatchObject({ state: 'succeeded', fencingToken: 2, result: { effect: 1, fence: '2' } });
  });

  test('an attempt that paid but crashed before committing: the retry, same key, gets the first answer replayed', async () => {
    const { job } = await store.enqueue({ kind: 'pay-retry', idempotencyKey: 'order-2', payload: { amount: 500 } });
    const before = upstream.effects;
    const { worker } = await start({
      workerId: 'W3',
      retry: { baseMs: 20, maxMs: 20 },
      handlers: {
        'pay-retry': async ({ job: j, fencedFetch }) => {
          const res = await charge(fencedFetch, { amount: 500 });
          if (j.attempt === 1) throw new Error('crashed after the payment, before the commit');
          return { status: res.status, replayed: res.headers.get('idempotent-replayed'), body: await res.json() };
        },
      },
    });
    await worker.events.waitFor('result_committed', (e) => e.jobId === job.id);
    expect(upstream.effects - before).toBe(1);
    expect(await store.get(job.id)).toMatchObject({
      state: 'succeeded',
      attempt: 2,
      fencingToken: 2,
      result: { status: 201, replayed: 'true', body: { fence: '1', key: `${job.jobKey}:charge` } },
    });
  });
});
