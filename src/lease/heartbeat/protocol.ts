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

/** One lease for the thread to extend, with its shared cell. */
export interface WatchEntry {
  key: string;
  lease: LeaseRef;
  cell: SharedArrayBuffer;
  maxStallMs: number;
}

export type ToThread =
  /** The leases claimed in one turn of the handler's thread, in one message (see client.ts). */
  | { type: 'watch'; leases: WatchEntry[] }
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
