import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/http/logger.js';
import { keepLock } from '../../src/http/pipeline/lock-keeper.js';
import type { GatewayStore } from '../../src/store/types.js';

// The renewal loop of a long call (DESIGN §3.6 "Long calls") against a store
// whose extendLock answers as told; the real stores: test/gateway/long-call*.test.ts.

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** Waits (bounded) until `check` holds: no timing is asserted. */
async function until(check: () => boolean): Promise<void> {
  for (let i = 0; i < 500 && !check(); i++) await sleep(10);
  expect(check()).toBe(true);
}
const LOG = { logger: silentLogger, requestId: 'req', route: 'payments' };

function keeper(answers: (() => Promise<boolean>)[], windowMs = 200, everyMs = 20) {
  const calls: { ms: number; entity: string | null | undefined; owner: string }[] = [];
  const store = {
    extendLock: async (i: { ms: number; entity?: string | null; owner: string }) => {
      calls.push({ ms: i.ms, entity: i.entity, owner: i.owner });
      const next = answers.length > 1 ? answers.shift()! : answers[0]!;
      return next();
    },
  } as unknown as GatewayStore;
  const sentAt = performance.now();
  const k = keepLock(
    store,
    { scope: 'payments', key: 'k', entity: 'e1', ownerToken: 'owner-1', sentAt, lockMs: windowMs },
    { lockWindow: windowMs, renewEvery: everyMs },
    LOG,
  );
  return { k, calls, sentAt };
}

describe('keepLock', () => {
  it('renews with the window, the entity and the owner, and moves the lock end from each renewal', async () => {
    // A window long enough that no pause here can end it.
    const { k, calls, sentAt } = keeper([async () => true], 60_000);
    await until(() => calls.length >= 2);
    expect(calls[0]).toEqual({ ms: 60_000, entity: 'e1', owner: 'owner-1' });
    expect(k.lockEnds()).toBeGreaterThan(sentAt + 60_000);
    expect(k.lost()).toBe(false);
    k.stop();
    const n = calls.length;
    await sleep(60);
    expect(calls.length).toBe(n);
  });

  it('a refused renewal loses the lock for good and stops renewing', async () => {
    const { k, calls } = keeper([async () => false, async () => true], 60_000);
    await until(() => k.lost());
    await sleep(80);
    expect(calls).toHaveLength(1);
    k.stop();
  });

  it('a store error is tried again; the lock is lost once its end passes with none landed', async () => {
    const { k, calls, sentAt } = keeper([
      async () => {
        throw new Error('down');
      },
    ]);
    await until(() => calls.length >= 2);
    expect(k.lockEnds()).toBe(sentAt + 200);
    await until(() => k.lost());
    expect(performance.now()).toBeGreaterThanOrEqual(sentAt + 200);
    k.stop();
  });
});
