/**
 * Counters and gauges per job kind. Counters are derived from the runner's
 * own events, so they can never disagree with what was emitted.
 */
import type { LeaseEvent, LeaseEventOf, LeaseEvents } from './events.js';

export type LossCause = LeaseEventOf<'heartbeat_lost'>['cause'];
export const LOSS_CAUSES: readonly LossCause[] = ['zero_rows', 'unconfirmed', 'stalled', 'stale_fence', 'thread_exit'];

export interface KindCounters {
  claimed: number;
  /** Claims that took over a lease which had expired in another owner's hands. */
  reclaimed: number;
  heartbeatsOk: number;
  /** Extends that failed with an error (not zero rows). */
  extendsFailed: number;
  /** Leases this worker lost (zero rows, unconfirmed, stalled, stale fence). */
  leasesLost: number;
  /** `leasesLost` by cause: `zero_rows` and `unconfirmed` are the lease running out (or a newer owner), `stale_fence` the gateway's word. */
  lostByCause: Record<LossCause, number>;
  ownershipUnknown: number;
  toolRequests: number;
  committed: number;
  rejected: number;
  /** Failed attempts, retried or terminal. */
  failed: number;
  stageTimeouts: number;
}

export interface KindGauges {
  running: number;
  /** The oldest last successful heartbeat among running jobs, in ms (0 if none). */
  maxHeartbeatAgeMs: number;
  /** The shortest confirmed lease time left among running jobs, in ms (null if none). */
  minLeaseLeftMs: number | null;
}

export interface LeaseMetrics {
  counters: Record<string, KindCounters>;
  gauges: Record<string, KindGauges>;
}

const zero = (): KindCounters => ({
  claimed: 0,
  reclaimed: 0,
  heartbeatsOk: 0,
  extendsFailed: 0,
  leasesLost: 0,
  lostByCause: { zero_rows: 0, unconfirmed: 0, stalled: 0, stale_fence: 0, thread_exit: 0 },
  ownershipUnknown: 0,
  toolRequests: 0,
  committed: 0,
  rejected: 0,
  failed: 0,
  stageTimeouts: 0,
});

function count(c: KindCounters, e: LeaseEvent): void {
  switch (e.type) {
    case 'job_claimed':
      c.claimed++;
      if (e.previousOwnerId !== null) c.reclaimed++;
      break;
    case 'heartbeat_ok':
      c.heartbeatsOk++;
      break;
    case 'heartbeat_failed':
      c.extendsFailed++;
      break;
    case 'heartbeat_lost':
      c.leasesLost++;
      c.lostByCause[e.cause]++;
      break;
    case 'ownership_unknown':
      c.ownershipUnknown++;
      break;
    case 'tool_request_started':
      c.toolRequests++;
      break;
    case 'result_committed':
      c.committed++;
      break;
    case 'result_rejected':
      c.rejected++;
      break;
    case 'job_failed':
      c.failed++;
      if (e.errorCode === 'stage_timeout') c.stageTimeouts++;
      break;
  }
}

/** Keeps counters for `events`; returns a snapshot function. */
export function countEvents(events: LeaseEvents): () => Record<string, KindCounters> {
  const byKind: Record<string, KindCounters> = {};
  events.onAny((e) => count((byKind[e.kind] ??= zero()), e));
  return () => structuredClone(byKind);
}
