import { Worker } from 'node:worker_threads';
import { LeaseError } from '../errors.js';
import type { LeaseRef } from '../types.js';
import { LeaseStatus, type LeaseCell } from './cell.js';
import type { FromThread, ThreadInit, ToThread } from './protocol.js';
import { LeaseSlab } from './slab.js';

export interface HeartbeatThreadOptions {
  /** Node flags for the thread; default: the process's own. */
  execArgv?: string[];
  onMessage(message: FromThread): void;
  /** The thread ended without being asked to. */
  onCrash(error: Error): void;
}

/** How long `stop()` waits for the thread to close its connection before terminating it. */
const STOP_GRACE_MS = 5_000;

/**
 * The runner's handle on its heartbeat thread. The thread's module is the
 * compiled `thread.js` next to this file.
 */
export class HeartbeatThread {
  readonly #worker: Worker;
  /** Where new leases are published, and their owner. */
  #slab: LeaseSlab | undefined;
  #slabOwner = '';
  #stopping: Promise<void> | undefined;
  #exited = false;

  private constructor(worker: Worker) {
    this.#worker = worker;
  }

  /** Starts the thread and waits until it has opened its own store connection. */
  static start(init: ThreadInit, options: HeartbeatThreadOptions): Promise<HeartbeatThread> {
    const worker = new Worker(new URL('./thread.js', import.meta.url), {
      workerData: init,
      ...(options.execArgv ? { execArgv: options.execArgv } : {}),
    });
    const thread = new HeartbeatThread(worker);
    return new Promise((resolve, reject) => {
      let ready = false;
      worker.on('message', (message: FromThread) => {
        if (message.type === 'ready') {
          ready = true;
          resolve(thread);
        } else if (message.type === 'fatal') {
          reject(new LeaseError('heartbeat_thread', `heartbeat thread could not open the store: ${message.error}`));
        } else {
          options.onMessage(message);
        }
      });
      worker.on('error', (err) => {
        const error = new LeaseError('heartbeat_thread', `heartbeat thread failed: ${err.message}`, { cause: err });
        if (ready) options.onCrash(error);
        else reject(error);
      });
      worker.on('exit', (code) => {
        thread.#exited = true;
        if (!ready) reject(new LeaseError('heartbeat_thread', `heartbeat thread exited during start-up (code ${code})`));
        else if (!thread.#stopping) options.onCrash(new LeaseError('heartbeat_thread', `heartbeat thread exited (code ${code})`));
      });
    });
  }

  /**
   * Hands a lease to the thread and returns its cell, its confirmed end set
   * to `confirmedUntil` (monotonic ms). Published in shared memory
   * (./slab.ts) before this returns, without waking the thread: it picks the
   * lease up on its next deadline check, a few ms later, even while this
   * thread is blocked, and schedules the first beat from the claim.
   */
  watch(lease: LeaseRef, maxStallMs: number, confirmedUntil: number): LeaseCell {
    if (this.#slab === undefined || this.#slab.full || this.#slabOwner !== lease.ownerId) {
      this.#slab = new LeaseSlab();
      this.#slabOwner = lease.ownerId;
      this.#post({ type: 'slab', buffer: this.#slab.buffer, ownerId: lease.ownerId });
    }
    return this.#slab.publish(lease, maxStallMs, confirmedUntil);
  }

  /**
   * Stops extending a lease. A cell that has ended (released, lost or
   * stalled: the runner ends it before it unwatches) needs no message: the
   * thread drops an ended cell at its next deadline check or beat, whichever
   * comes first, and never extends it. Only a live cell is unwatched by
   * message, so a finished job costs the thread no wake-up.
   */
  unwatch(key: string, cell: LeaseCell): void {
    const status = cell.status;
    if (status === LeaseStatus.Ok || status === LeaseStatus.Unknown) this.#post({ type: 'unwatch', key });
  }

  /** Asks the thread to close its connection and exit; terminates it if it does not. Idempotent. */
  stop(): Promise<void> {
    this.#stopping ??= new Promise<void>((resolve) => {
      if (this.#exited) return resolve();
      const timer = setTimeout(() => void this.#worker.terminate(), STOP_GRACE_MS);
      this.#worker.once('exit', () => {
        clearTimeout(timer);
        resolve();
      });
      this.#post({ type: 'stop' });
    });
    return this.#stopping;
  }

  #post(message: ToThread): void {
    if (!this.#exited) this.#worker.postMessage(message);
  }
}
