/**
 * Lease arithmetic, pure: no I/O, no clocks of its own.
 *
 * The invariant (DESIGN §6): `leaseMs > maxMissedHeartbeats × heartbeatMs +
 * jitterMs`. A worker may miss that many heartbeats in a row (a slow
 * statement, a failover) plus the timers' jitter and still hold its lease;
 * with less, a healthy worker would lose jobs to its peers.
 */
import { LeaseConfigError } from './errors.js';

export interface LeaseTiming {
  leaseMs: number;
  heartbeatMs: number;
  maxMissedHeartbeats: number;
  jitterMs: number;
}

/** `runWorker`'s heartbeat settings when its options leave them out. */
export const HEARTBEAT_DEFAULTS: Omit<LeaseTiming, 'leaseMs'> = { heartbeatMs: 5_000, maxMissedHeartbeats: 3, jitterMs: 1_000 };

/** Throws a `LeaseConfigError` naming the numbers when the invariant does not hold. */
export function checkLeaseTiming(t: LeaseTiming, where: string): void {
  const needed = t.maxMissedHeartbeats * t.heartbeatMs + t.jitterMs;
  if (!(t.leaseMs > needed)) {
    throw new LeaseConfigError(
      `${where}: leaseMs (${t.leaseMs}) must be greater than maxMissedHeartbeats × heartbeatMs + jitterMs ` +
        `= ${t.maxMissedHeartbeats} × ${t.heartbeatMs} + ${t.jitterMs} = ${needed}; ` +
        'raise leaseMs or heartbeat more often',
    );
  }
}

/**
 * May a new external action start? Only while the lease is confirmed for at
 * least one more heartbeat interval: by then the next heartbeat has either
 * extended it or told us it is gone.
 */
export function canStartAction(confirmedUntilMs: number, nowMs: number, heartbeatMs: number): boolean {
  return confirmedUntilMs - nowMs > heartbeatMs;
}

export interface BackoffPolicy {
  baseMs: number;
  maxMs: number;
}

/** Exponential backoff before retry number `attempt` (1-based): base × 2^(attempt−1), capped. */
export function backoffMs(attempt: number, policy: BackoffPolicy): number {
  return Math.min(policy.maxMs, policy.baseMs * 2 ** Math.max(0, attempt - 1));
}

/**
 * When the next heartbeat fires: every `heartbeatMs`, up to `jitterMs` early
 * (at most a quarter interval) so that many workers do not beat in lockstep.
 * Early, never late: lateness is what the invariant's `jitterMs` pays for.
 */
export function nextHeartbeatDelay(heartbeatMs: number, jitterMs: number, random: number): number {
  return heartbeatMs - Math.min(jitterMs, heartbeatMs / 4) * random;
}

/** A monotonic millisecond clock shared by all threads of the process (CLOCK_MONOTONIC). */
export function monotonicMs(): number {
  return Number(process.hrtime.bigint() / 1_000_000n);
}
