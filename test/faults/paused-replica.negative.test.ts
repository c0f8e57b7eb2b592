import { describe, expect, it, vi } from 'vitest';
import { POSTGRES_URL } from '../helpers/postgres.js';
import { runPausedReplica } from './paused-replica.js';

// Negative control for paused-replica.test.ts: the lock-budget check is
// switched off (the route's full timeout, no start deadline), and the same
// run sends the paused fence 6 after fence 7.
vi.mock('../../src/http/lock-budget.js', () => ({
  lockSafetyMs: () => 0,
  forwardBudget: (o: { routeTimeoutMs: number }) => ({ timeoutMs: o.routeTimeoutMs, startBy: Number.POSITIVE_INFINITY }),
}));

const backends = ['sqlite', ...(POSTGRES_URL ? (['postgres'] as const) : [])] as const;

describe.each(backends)('negative control: a paused gateway on %s without the lock-budget check', (backend) => {
  it('forwards the stale fence 6 after fence 7 (G1 broken)', async () => {
    const run = await runPausedReplica(backend);
    expect(run.upstreamFences).toEqual(['7', '6']);
    expect(run.paused.status).toBe(201);
  });
});
