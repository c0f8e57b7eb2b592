/** Messages between the runner and its heartbeat thread. Everything here is structured-clonable. */
import type { LeaseRef, StoreDescriptor } from '../types.js';

export interface ThreadInit {
  /** The thread opens its own connection from this: a live one cannot cross threads. */
  store: StoreDescriptor;
  /** The handler thread's `Pulse`. */
  pulse: SharedArrayBuffer;
  heartbeatMs: number;
  jitterMs: number;
  maxMissedHeartbeats: number;
  /** How long one extend may take before it counts as a missed beat. */
  timeoutMs: number;
}

export type ToThread =
  /** A new lease slab (./slab.ts): the leases published in it are this owner's. Every earlier slab is complete. */
  | { type: 'slab'; buffer: SharedArrayBuffer; ownerId: string }
  /** Stop extending a lease whose cell is still live (an ended cell needs no message). */
  | { type: 'unwatch'; key: string }
  | { type: 'stop' };

export type FromThread =
  | { type: 'ready' }
  | { type: 'fatal'; error: string }
  | { type: 'ok'; key: string; leaseUntil: Date; latencyMs: number }
  | { type: 'failed'; key: string; error: string; consecutive: number }
  | { type: 'unknown'; key: string; confirmedForMs: number; consecutive: number }
  | { type: 'lost'; key: string; cause: 'zero_rows' | 'unconfirmed' }
  | { type: 'stalled'; key: string; stalledForMs: number }
  | { type: 'stopped' };

/** One lease's key: a job may come back to the same worker with a new token. */
export const leaseKey = (lease: Pick<LeaseRef, 'id' | 'fencingToken'>) => `${lease.id}:${lease.fencingToken}`;
