/** Start-up validation and the lease arithmetic: pure, no database. */
import { describe, expect, test } from 'vitest';
import { LeaseConfigError } from '../../src/lease/errors.js';
import { runWorker } from '../../src/lease/runner/run-worker.js';
import { parseWorkerOptions, type RunWorkerOptions } from '../../src/lease/runner/options.js';
import { backoffMs, canStartAction, checkLeaseTiming, nextHeartbeatDelay } from '../../src/lease/timing.js';
import type { JobStore } from '../../src/lease/types.js';

/** Enough of a store for option parsing; no method is ever called. */
const store = { claim: () => Promise.reject(new Error('not here')), descriptor: { sqlite: '/nonexistent/jobs.db' } } as unknown as JobStore;
const base: RunWorkerOptions = { store, workerId: 'w1', handlers: { pay: () => 'ok' } };

describe('lease arithmetic', () => {
  test('leaseMs must exceed maxMissedHeartbeats × heartbeatMs + jitterMs, and the error shows the numbers', () => {
    expect(() => checkLeaseTiming({ leaseMs: 16_001, heartbeatMs: 5_000, maxMissedHeartbeats: 3, jitterMs: 1_000 }, 'x')).not.toThrow();
    expect(() => checkLeaseTiming({ leaseMs: 16_000, heartbeatMs: 5_000, maxMissedHeartbeats: 3, jitterMs: 1_000 }, 'x')).toThrow(
      /leaseMs \(16000\) must be greater than maxMissedHeartbeats × heartbeatMs \+ jitterMs = 3 × 5000 \+ 1000 = 16000/,
    );
  });

  test('a new action may start only with more than one heartbeat of confirmed lease left', () => {
    expect(canStartAction(1_000 + 5_001, 1_000, 5_000)).toBe(true);
    expect(canStartAction(1_000 + 5_000, 1_000, 5_000)).toBe(false);
    expect(canStartAction(900, 1_000, 5_000)).toBe(false);
  });

  test('backoff doubles per attempt and is capped', () => {
    const policy = { baseMs: 1_000, maxMs: 10_000 };
    expect([1, 2, 3, 4, 5].map((a) => backoffMs(a, policy))).toEqual([1_000, 2_000, 4_000, 8_000, 10_000]);
  });

  test('heartbeats are spread early, never late', () => {
    expect(nextHeartbeatDelay(1_000, 100, 0)).toBe(1_000);
    expect(nextHeartbeatDelay(1_000, 100, 1)).toBe(900);
    expect(nextHeartbeatDelay(100, 1_000, 1)).toBe(75); // at most a quarter interval
  });
});

describe('runWorker options', () => {
  test('defaults: 30 s lease, 5 s heartbeat, 3 missed, 1 s jitter; the lease of each kind comes from the kinds table', () => {
    const config = parseWorkerOptions({ ...base, handlers: { pay: () => 1, mail: () => 2 }, kinds: { mail: { leaseMs: 60_000, maxRunMs: 5_000 } } });
    expect(config).toMatchObject({ heartbeatMs: 5_000, maxMissedHeartbeats: 3, jitterMs: 1_000, concurrency: 1 });
    expect(config.kinds).toEqual({
      pay: { leaseMs: 30_000, maxRunMs: 600_000, maxStallMs: 30_000 },
      mail: { leaseMs: 60_000, maxRunMs: 5_000, maxStallMs: 60_000 },
    });
  });

  test('a kind whose lease is too short for the heartbeat is refused at start, naming the kind', async () => {
    await expect(runWorker({ ...base, kinds: { pay: { leaseMs: 10_000 } } })).rejects.toThrow(
      /runWorker kinds\.pay: leaseMs \(10000\) must be greater than .* = 16000/,
    );
    await expect(runWorker({ ...base, leaseMs: 1_000, heartbeatMs: 500, maxMissedHeartbeats: 2, jitterMs: 0 })).rejects.toBeInstanceOf(LeaseConfigError);
  });

  test('invalid values are refused with the field named', () => {
    expect(() => parseWorkerOptions({ ...base, heartbeatMs: -1 })).toThrow(/heartbeatMs: /);
    expect(() => parseWorkerOptions({ ...base, handlers: {} })).toThrow(/handlers: needs at least one kind/);
    expect(() => parseWorkerOptions({ ...base, handlers: { pay: 42 as never } })).toThrow(/handlers\.pay/);
    expect(() => parseWorkerOptions({ ...base, kinds: { other: { leaseMs: 60_000 } } })).toThrow(/kinds\.other has no handler/);
    expect(() => parseWorkerOptions({ ...base, leaseMS: 1 } as never)).toThrow(/Unrecognized key: "leaseMS"/);
    expect(() => parseWorkerOptions({ ...base, kinds: { pay: { maxStallMs: 10 } } })).toThrow(/maxStallMs \(10\) must be at least/);
  });

  test('a store without a descriptor needs threadStore for the heartbeat thread', () => {
    const pooled = { ...store, descriptor: undefined } as unknown as JobStore;
    expect(() => parseWorkerOptions({ ...base, store: pooled })).toThrow(/threadStore is required/);
    expect(parseWorkerOptions({ ...base, store: pooled, threadStore: { postgres: 'postgres://db/jobs' } }).threadStore).toEqual({
      postgres: 'postgres://db/jobs',
    });
  });
});
