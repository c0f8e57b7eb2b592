import { Worker } from 'node:worker_threads';
import { LeaseError } from '../errors.js';
import type { LeaseRef } from '../types.js';
import type { LeaseCell } from './cell.js';
import type { FromThread, ThreadInit, ToThread } from './protocol.js';

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

  watch(key: string, lease: LeaseRef, cell: LeaseCell, maxStallMs: number): void {
    // Only the fields the extend statement needs cross the thread boundary.
    const ref: LeaseRef = { id: lease.id, ownerId: lease.ownerId, fencingToken: lease.fencingToken, leaseMs: lease.leaseMs };
    this.#post({ type: 'watch', key, lease: ref, cell: cell.buffer, maxStallMs });
  }

  unwatch(key: string): void {
    this.#post({ type: 'unwatch', key });
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
