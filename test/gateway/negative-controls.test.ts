import { afterEach, describe, expect, it } from 'vitest';
import type { GatewayStore } from '../../src/store/types.js';
import { command, paymentsRoute, rejectionRows, startTestGateway } from '../helpers/gateway.js';
import { withoutFenceCheck, withoutIdempotency } from '../helpers/store-wrappers.js';
import { startUpstream } from '../helpers/upstream.js';

// STYLE habit 7: a test that would pass with the feature removed is not a
// test. Each scenario runs twice on the same real components: once as
// shipped (the safety property holds), once with the check switched off by
// wrapping the store the gateway is given (the violation shows at the
// upstream). The gateway itself has no switch for this.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0)) await c();
});

async function run(wrapStore: ((s: GatewayStore) => GatewayStore) | undefined, scenario: (url: string) => Promise<void>) {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const gw = await startTestGateway({ routes: [paymentsRoute(up.url)], wrapStore });
  cleanups.push(() => gw.close());
  await scenario(gw.url);
  return { up, gw };
}

describe('G1 stale fence', () => {
  // W1 (fence 41) freezes; W2 (fence 42) takes the job over and pays; W1 wakes up and pays too.
  const scenario = async (url: string) => {
    await command(url, '/payments/charges', { fence: 42, entity: 'tool-job:1', key: 'w2-pay' });
    await command(url, '/payments/charges', { fence: 41, entity: 'tool-job:1', key: 'w1-pay' });
  };

  it('as shipped: the late request of the old owner never reaches the upstream', async () => {
    const { up, gw } = await run(undefined, scenario);
    expect(up.calls.map((c) => c.fence)).toEqual(['42']);
    expect(rejectionRows(gw.sqlite, 'stale-fence')).toHaveLength(1);
  });

  it('control, fence check off: the stale request reaches the upstream (a second payment)', async () => {
    const { up, gw } = await run(withoutFenceCheck, scenario);
    expect(up.calls.map((c) => c.fence)).toEqual(['42', '41']);
    expect(rejectionRows(gw.sqlite, 'stale-fence')).toHaveLength(0);
  });
});

describe('G2 idempotency', () => {
  // An SDK retries after a lost response, with the same key.
  const scenario = async (url: string) => {
    for (let i = 0; i < 3; i++) await command(url, '/payments/charges', { fence: 1, entity: 'tool-job:2', key: 'tool-job:2:pay' });
  };

  it('as shipped: one effect, the retries are replays', async () => {
    const { up } = await run(undefined, scenario);
    expect(up.effects).toBe(1);
  });

  it('control, idempotency off: every retry is another effect', async () => {
    const { up } = await run(withoutIdempotency, scenario);
    expect(up.effects).toBe(3);
    expect(up.calls.every((c) => c.key === 'tool-job:2:pay')).toBe(true);
  });
});
