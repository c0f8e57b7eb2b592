import { afterEach, describe, expect, it } from 'vitest';
import { createFencedFetch, createFenceSigner, LeaseLostError, type FenceContext, type FenceSigner } from '../../src/lease/index.js';
import { expectProblem, paymentsRoute, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// The lease module's `fenceSigner` seam wired to `createFenceSigner`: what a
// worker sends through a gateway with `fence.signed`.

const SECRET = 'fence-secret-0123456789-abcdefghijklmnopq';
const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function context(leaseUntil: Date, lost: string[]): FenceContext {
  return {
    workerId: 'worker-a',
    jobId: 42,
    kind: 'pay',
    fencingToken: 7,
    jobKey: 'tool-job:42',
    fenceKey: 'tool-job:42',
    signal: new AbortController().signal,
    leaseUntil: () => leaseUntil,
    assertCanStart() {},
    markLost: (cause) => lost.push(cause),
    emit() {},
  };
}

describe('fencedFetch with createFenceSigner', () => {
  it('sends a signed fence the gateway accepts; past the lease (and grace) the gateway refuses it and the worker learns it lost the lease', async () => {
    const up: FakeUpstream = await startUpstream();
    cleanups.push(() => up.close());
    const gw: TestGateway = await startTestGateway({ routes: [paymentsRoute(up.url)], config: { fence: { signed: { secret: SECRET } } } });
    cleanups.unshift(() => gw.close());
    const signer: FenceSigner = createFenceSigner({ secret: SECRET }, { graceSeconds: 2 });

    const lost: string[] = [];
    const live = createFencedFetch(context(new Date(Date.now() + 30_000), lost), { fenceSigner: signer });
    const res = await live(`${gw.url}/payments/charges`, {
      step: 'charge',
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"amount":1200}',
    });
    expect(res.status).toBe(201);
    expect(up.calls[0]!).toMatchObject({ fence: '7', entity: 'tool-job:42', key: 'tool-job:42:charge' });

    // A lease that ended 10 s ago: beyond the 2 s grace.
    const late = createFencedFetch(context(new Date(Date.now() - 10_000), lost), { fenceSigner: signer });
    await expect(
      late(`${gw.url}/payments/charges`, { step: 'refund', method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' }),
    ).rejects.toBeInstanceOf(LeaseLostError);
    expect(lost).toEqual(['stale_fence']);
    expect(up.effects).toBe(1);
    const log = gw.sqlite.db.prepare('SELECT reason, entity, presented_fence FROM rejections').all();
    expect(log).toEqual([{ reason: 'fence-expired', entity: 'tool-job:42', presented_fence: 7 }]);

    // Within the grace the fence still passes.
    const graced = createFencedFetch(context(new Date(Date.now() - 500), lost), { fenceSigner: signer });
    expect(
      (await graced(`${gw.url}/payments/charges`, { step: 'receipt', method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' })).status,
    ).toBe(201);
  });

  it('a worker without the signer sends a bare token, which a signed gateway refuses', async () => {
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const gw = await startTestGateway({ routes: [paymentsRoute(up.url)], config: { fence: { signed: { secret: SECRET } } } });
    cleanups.unshift(() => gw.close());
    const f = createFencedFetch(context(new Date(Date.now() + 30_000), []));
    const res = await f(`${gw.url}/payments/charges`, { step: 'charge', method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    await expectProblem(res, 401, 'invalid-fence-signature');
    expect(up.effects).toBe(0);
  });
});
