// The shape of one claimed attempt and of what it needs from its worker,
// apart from ./attempt.ts that drives it: ./job-context.ts builds a handler's
// context from an attempt, and ./attempt.ts calls it, so with the types in
// ./attempt.ts the two modules would import each other.
import type { InFlightRequest, LeaseEvent } from '../events.js';
import type { HeartbeatThread } from '../heartbeat/client.js';
import type { LeaseCell } from '../heartbeat/cell.js';
import type { AttemptSpan } from '../tracing.js';
import type { JobStore, Lease } from '../types.js';
import type { NextClaim } from './claim-lanes.js';
import type { WorkerConfig } from './options.js';

/** One claimed attempt. */
export interface Attempt {
  key: string;
  lease: Lease;
  cell: LeaseCell;
  /** Made on first use of the signal (./abort.ts); read `aborted` and `abortReason`, abort with `abortAttempt`. */
  controller: AbortController | undefined;
  /** The attempt was aborted (lease lost, stage timeout, stop); `abortReason` says why. */
  aborted: boolean;
  abortReason: unknown;
  /** The latest lease end the database confirmed. */
  leaseUntil: Date;
  /** Monotonic time of the last successful heartbeat (or the claim). */
  lastOkAt: number;
  stageTimer: NodeJS.Timeout | undefined;
  /** Set once the attempt's outcome is decided; a later handler outcome is ignored. */
  ended: boolean;
  /** heartbeat_lost was emitted (once per attempt, whoever notices first). */
  lossReported: boolean;
  /** External actions started and not yet settled, for ownership_unknown. */
  inFlight: Set<InFlightRequest>;
  /** Its trace span (../tracing.ts; a no-op without OpenTelemetry). */
  span: AttemptSpan;
}

/** What an attempt needs from its worker, and nothing more. */
export interface AttemptContext {
  readonly workerId: string;
  readonly config: Pick<WorkerConfig, 'kinds' | 'handlers' | 'heartbeatMs' | 'retry' | 'fetch' | 'fenceHeaders' | 'fenceSigner'>;
  /** The ownership-conditional statements: their answer is final. */
  readonly store: Pick<JobStore, 'complete' | 'fail' | 'release'>;
  /** Who extends the lease while the attempt runs. */
  readonly heartbeats: Pick<HeartbeatThread, 'watch' | 'unwatch'>;
  /** The attempts holding a slot, by lease key: an attempt is in it from its claim until it is freed. */
  readonly active: Map<string, Attempt>;
  emit(event: LeaseEvent): void;
  /** Called each time an attempt has left `active` and nothing took its slot: it is free. */
  freed(): void;
  /** The claim of the next job for a slot whose job succeeded, to send with its complete (./claim-lanes.ts `next`). */
  nextClaim(): NextClaim | undefined;
}
