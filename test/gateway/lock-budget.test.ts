import { describe, expect, it } from 'vitest';
import { forwardBudget, lockSafetyMs } from '../../src/http/lock-budget.js';

// The arithmetic of the pause check (DESIGN §3.5–3.6); the behaviour with real
// stores and a held admission is test/faults/paused-replica.test.ts.
describe('forwardBudget', () => {
  const route = { lockMs: 12_000, safetyMs: lockSafetyMs(2_000), routeTimeoutMs: 10_000 };

  it('keeps the route timeout while the lock leaves enough, and never lets the start pass the lock minus the margin', () => {
    expect(lockSafetyMs(2_000)).toBe(250);
    expect(forwardBudget({ ...route, sentAt: 1_000, now: 1_003 })).toEqual({ timeoutMs: 10_000, startBy: 1_000 + 12_000 - 250 });
  });

  it('cuts the deadline to what is left of the lock after a delay', () => {
    expect(forwardBudget({ ...route, sentAt: 0, now: 3_750 })).toEqual({ timeoutMs: 8_000, startBy: 11_750 });
  });

  it('refuses (null) once less than half the route timeout is left: a few ms of deadline would mostly end outcome_unknown', () => {
    expect(forwardBudget({ ...route, sentAt: 0, now: 6_749 })?.timeoutMs).toBe(5_001);
    expect(forwardBudget({ ...route, sentAt: 0, now: 6_751 })).toBeNull();
    expect(forwardBudget({ ...route, sentAt: 0, now: 20_000 })).toBeNull();
  });

  it('keeps at least 25 ms of margin, also for a route with no lockMarginMs', () => {
    expect(lockSafetyMs(0)).toBe(25);
    expect(lockSafetyMs(300)).toBe(150);
  });
});
