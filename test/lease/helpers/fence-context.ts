import type { LeaseEvent } from '../../../src/lease/events.js';
import type { FenceContext } from '../../../src/lease/fenced-fetch.js';

/**
 * A plain FenceContext (no database, no runner) for the tests of
 * fencedFetch, step and fencedMcp: a confirmed lease until 2030, fence 7,
 * the events and lease-loss causes it was told, and the controller of its
 * signal. `overrides` sets the job, the kind or any member.
 */
export function fenceContext(overrides: Partial<FenceContext> = {}) {
  const events: LeaseEvent[] = [];
  const lost: string[] = [];
  const controller = new AbortController();
  const ctx: FenceContext = {
    workerId: 'w1',
    jobId: 1,
    kind: 'job',
    fencingToken: 7,
    jobKey: 'tool-job:test:1',
    fenceKey: 'tool-job:test:1',
    signal: controller.signal,
    leaseUntil: () => new Date('2030-01-01T00:00:30Z'),
    assertCanStart: () => {},
    markLost: (cause) => lost.push(cause),
    emit: (e) => events.push(e),
    ...overrides,
  };
  return { ctx, events, lost, controller };
}
