import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';
import { checkpointWorkerMain, type CheckpointMessage, type CheckpointWorkerData } from './checkpoint-worker.js';
import type { SqliteDatabase } from '../../db/sqlite-open.js';

export interface CheckpointOptions {
  /** How often the worker runs a PASSIVE checkpoint. Default 100 ms. */
  intervalMs?: number;
  /** WAL frames (pages) past which the WAL is restarted from its beginning. Default 4000 (~16 MiB at 4 KiB pages). */
  restartFrames?: number;
  /** Longest the writer holds its new transactions for a restart. Default 50 ms. */
  maxPauseMs?: number;
  /** The worker thread's nice value on Linux (0–19; higher yields more). Default 10. */
  nice?: number;
  /** Every message of the worker, for tests and metrics. */
  onMessage?: (m: CheckpointMessage) => void;
}

/**
 * WAL checkpoints off the event loop (DESIGN §8.1).
 *
 * SQLite's automatic checkpoint runs inside the COMMIT that crosses
 * `wal_autocheckpoint` pages: it copies the WAL into the database file and
 * fsyncs it, on the event loop, a stall of milliseconds for every request
 * in flight. So the writer's autocheckpoint is off, and a worker thread with
 * a connection of its own checkpoints instead. The protocol:
 *
 * 1. Every `intervalMs` the worker runs a PASSIVE checkpoint: it never takes
 *    the write lock, copies the frames no reader still needs, and fsyncs the
 *    database file, all on its own thread while the writer goes on.
 * 2. PASSIVE alone cannot bound the WAL under sustained writes: SQLite
 *    starts writing the WAL from its beginning again only when a new write
 *    transaction finds every frame copied, and a writer that never stops
 *    keeps a few frames uncopied. When the WAL holds `restartFrames` frames
 *    the worker sends `pause`; the writer holds new write transactions
 *    (`hold`, between two groups: a group runs synchronously, so none is
 *    half done when the message is handled) and answers `paused`; the worker
 *    runs a RESTART checkpoint (the few frames since its last PASSIVE, then
 *    waits for readers to leave the WAL) and sends `done`; the writer goes
 *    on, and its next transaction writes the WAL from its start. The event
 *    loop runs all along: only new write transactions wait, at most
 *    `maxPauseMs` (then the writer goes on anyway and the restart waits for
 *    the next round).
 * 3. If the worker cannot start or dies, the writer's autocheckpoint is
 *    turned back on: stalls, but never a WAL that grows without bound.
 *
 * A checkpoint interrupted by a crash loses nothing (SQLite keeps the WAL
 * frames until the database file holding them is synced); test/store/
 * checkpoint.test.ts kills a process during checkpoints to hold it to that.
 */
export class Checkpointer {
  private readonly worker: Worker;
  private release: (() => void) | null = null;
  private pauseTimer: NodeJS.Timeout | null = null;
  private stopped = false;
  private readonly exited: Promise<void>;
  readonly stats = { passive: 0, restarts: 0, pauses: 0, pauseTimeouts: 0 };

  constructor(
    private readonly db: SqliteDatabase,
    path: string,
    synchronous: 'FULL' | 'NORMAL',
    /** Holds new write transactions until the returned function is called; null without a group committer (the RESTART then waits for the lock as another process would). */
    hold: (() => () => void) | null,
    options: CheckpointOptions = {},
  ) {
    const data: CheckpointWorkerData = {
      driver: createRequire(import.meta.url).resolve('better-sqlite3'),
      path,
      synchronous,
      intervalMs: options.intervalMs ?? 100,
      restartFrames: options.restartFrames ?? 4000,
      busyTimeoutMs: 20,
      nice: options.nice ?? 10,
    };
    const maxPauseMs = options.maxPauseMs ?? 50;
    db.pragma('wal_autocheckpoint = 0');
    this.worker = new Worker(`(${checkpointWorkerMain.toString()})(require)`, { eval: true, workerData: data });
    // The store's close() stops it; a process that never closes the store still exits.
    this.worker.unref();
    this.worker.on('message', (m: CheckpointMessage) => {
      options.onMessage?.(m);
      if (m.type === 'ran') {
        if (m.mode === 'PASSIVE') this.stats.passive++;
        else this.stats.restarts++;
      } else if (m.type === 'pause') {
        this.stats.pauses++;
        this.release = hold?.() ?? null;
        this.pauseTimer = setTimeout(() => {
          this.stats.pauseTimeouts++;
          this.resume();
        }, maxPauseMs);
        this.worker.postMessage({ type: 'paused' });
      } else if (m.type === 'done') {
        this.resume();
      }
    });
    this.worker.on('error', () => this.fallBack());
    this.exited = new Promise((resolve) =>
      this.worker.once('exit', () => {
        this.fallBack();
        resolve();
      }),
    );
  }

  /** Stops the worker (after the checkpoint it may be running) and waits for it. Idempotent. */
  async close(): Promise<void> {
    if (!this.stopped) {
      this.stopped = true;
      this.resume();
      // Referenced again while it stops: an unreferenced worker does not keep
      // the process alive, so a close() awaited with nothing else pending
      // would end the process before the worker's exit settles it.
      this.worker.ref();
      this.worker.postMessage({ type: 'stop' });
    }
    await this.exited;
  }

  private resume(): void {
    if (this.pauseTimer !== null) clearTimeout(this.pauseTimer);
    this.pauseTimer = null;
    const release = this.release;
    this.release = null;
    release?.();
  }

  /** The worker is gone: the writer checkpoints for itself again (unless the store is closing). */
  private fallBack(): void {
    this.resume();
    if (this.stopped || !this.db.open) return;
    this.stopped = true;
    this.db.pragma('wal_autocheckpoint = 1000');
  }
}
