/**
 * What every queue suite sets up around its tests: a counting upstream, a
 * real gateway (in this process) in front of it, and cleanups that run after
 * each test, once the worker children are killed.
 */
import { afterAll, afterEach, beforeAll, expect } from 'vitest';
import { killAll } from '../../helpers/child.js';
import { paymentsRoute, rejectionRows, startTestGateway, type TestGateway } from '../../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../../helpers/upstream.js';

/** The HS256 secret of the suites' signed gateways (`fence.signed`) and of their workers' signers. */
export const FENCE_SECRET = 'queue-fence-secret-0123456789-abcdefghijk';

export interface QueueHarness {
  upstream: FakeUpstream;
  gateway: TestGateway;
  /** Run after each test, last pushed first. */
  cleanups: (() => Promise<unknown>)[];
}

/** Registers the suite's hooks; the fields are set once `beforeAll` ran. `signed`: the gateway wants signed fences. */
export function queueHarness(options: { signed?: boolean } = {}): QueueHarness {
  const h = { cleanups: [] as QueueHarness['cleanups'] } as QueueHarness;
  beforeAll(async () => {
    h.upstream = await startUpstream();
    h.gateway = await startTestGateway({
      routes: [paymentsRoute(h.upstream.url)],
      ...(options.signed ? { config: { fence: { signed: { secret: FENCE_SECRET } } } } : {}),
    });
  });
  afterEach(async () => {
    await killAll();
    for (const c of h.cleanups.splice(0).reverse()) await c();
  });
  afterAll(async () => {
    await h.gateway?.close();
    await h.upstream?.close();
  });
  return h;
}

/**
 * A worker's late call with an expired signed fence: the gateway refused it
 * `fence-expired` (logged for the job's entity, fence 1), the worker took it
 * as a lost lease, and the upstream was not called.
 */
export function expectRefusedExpired(h: QueueHarness, late: { outcome: Record<string, unknown>; effects: number }, entity: string): void {
  expect(late.outcome).toMatchObject({ msg: 'refused', name: 'LeaseLostError', code: 'lease_lost', aborted: true });
  expect(late.effects).toBe(0);
  expect(rejectionRows(h.gateway.sqlite, 'fence-expired')).toContainEqual(expect.objectContaining({ entity, presented_fence: 1 }));
}
