import { afterEach, describe, expect, it } from 'vitest';
import { overrideStore } from '../../src/store/override.js';
import type { GatewayStore } from '../../src/store/types.js';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startProvider, type Provider } from './provider.js';

// A long call (DESIGN §3.6) keeps its upstream request open for the route's
// whole timeoutMs while its lock is only lockWindow, renewed. When the
// renewals stop landing (store unreachable for a while, or the gateway dies),
// the attempt's lock end (attempt_until) is the last renewal's, and the
// request may still be in flight at the upstream for up to timeoutMs after
// it: a reconcile "not found" is trusted only settleTime plus timeoutMs past
// that end (DESIGN §3.12). Counting from the lock end alone released the
// record while the charge was still running: the retry was sent again.

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const open: { close(): Promise<unknown> }[] = [];
afterEach(async () => {
  for (const o of open.splice(0).reverse()) await o.close();
});

const charge = (url: string, key: string) =>
  fetch(`${url}/charges`, {
    method: 'POST',
    headers: { 'idempotency-key': key, 'x-fence-entity': 'cust-1', 'content-type': 'application/json' },
    body: '{"amount":500}',
  });

async function start(provider: Provider, wrap: (s: GatewayStore) => GatewayStore): Promise<TestGateway> {
  const g = await startTestGateway({
    routes: [
      {
        name: 'charges',
        match: { path: '/charges', methods: ['POST'] },
        upstream: provider.url,
        fence: 'off',
        mode: 'concurrent',
        timeoutMs: 30_000,
        lockMarginMs: 100,
        maxWaitMs: 2_000,
        longCall: { lockWindow: '400ms', renewEvery: '100ms' },
        reconcile: { path: '/charges/by-key/{key}', settleTime: '200ms', interval: '1h' },
      },
    ],
    config: { sweepInterval: '1h' },
    wrapStore: wrap,
  });
  open.push(g);
  return g;
}

describe('long call + reconcile after a lost renewal (DESIGN §3.12: the bound counts the whole timeoutMs)', () => {
  for (const renewalsFail of [true, false]) {
    it(`${renewalsFail ? 'renewals failing' : 'negative control, renewals landing'}: a retry while the first request is still at the upstream`, async () => {
      // The provider writes the charge 2.5 s after it got the POST, and answers at 3 s: a long operation.
      const provider = await startProvider({ writeAfterMs: 2_500, answerAfterMs: 3_000 });
      open.push(provider);
      const g = await start(provider, (s) =>
        renewalsFail
          ? overrideStore(s, {
              extendLock: async () => {
                throw new Error('store unreachable (test)');
              },
            } as never)
          : s,
      );
      const first = charge(g.url, 'k-long');
      while (provider.posts < 1) await sleep(10);
      // Past the window (400 ms) and the settle time (200 ms); the first request is still in flight.
      await sleep(1_000);
      const retry = await charge(g.url, 'k-long');
      await retry.text();
      await first.then((r) => r.text()).catch(() => {});
      await sleep(3_200);
      // The property: one key, one charge. With renewals failing this finds 2.
      expect(provider.chargesFor('k-long')).toBe(1);
    }, 20_000);
  }
});
