import { Worker } from 'node:worker_threads';
import { LeaseError } from '../errors.js';
import type { LeaseRef } from '../types.js';
import { LeaseStatus, type LeaseCell } from './cell.js';
import type { FromThread, ThreadInit, ToThread, WatchEntry } from './protocol.js';

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
  /** Watches not posted yet: they go out together at the end of this microtask wave. */
  #pending: WatchEntry[] = [];
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
   * Hands a lease to the thread. The watches of one turn go out as one
   * message, in a microtask queued by the first of them: every microtask
   * queued after this call (the attempt starts its handler in one) runs after
   * the message is posted. A message per lease cost more client CPU than
   * anything else the runner did per job: each one wakes the idle thread
   * (docs/bench-lease.md); a claim statement hands out several leases at once.
   */
  watch(key: string, lease: LeaseRef, cell: LeaseCell, maxStallMs: number): void {
    // Only the fields the extend statement needs cross the thread boundary.
    const ref: LeaseRef = { id: lease.id, ownerId: lease.ownerId, fencingToken: lease.fencingToken, leaseMs: lease.leaseMs };
    if (this.#pending.push({ key, lease: ref, cell: cell.buffer, maxStallMs }) === 1) queueMicrotask(() => this.#flush());
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
      // A watch still pending goes first, so the thread sees it before it stops.
      if (this.#pending.length > 0) this.#flush();
      this.#post({ type: 'stop' });
    });
    return this.#stopping;
  }

  #flush(): void {
    const leases = this.#pending;
    this.#pending = [];
    this.#post({ type: 'watch', leases });
  }

  #post(message: ToThread): void {
    if (!this.#exited) this.#worker.postMessage(message);
  }
}
