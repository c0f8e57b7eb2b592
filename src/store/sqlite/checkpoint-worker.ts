/**
 * The body of the checkpoint worker (./checkpoint.ts), run in a
 * `worker_threads` Worker from its source text (`eval`), so that the same
 * code runs from src/ under the tests and from dist/: it must not close
 * over anything of this module. Its messages: see `CheckpointMessage`.
 */
export interface CheckpointWorkerData {
  /** Absolute path of better-sqlite3's entry, resolved by the store. */
  driver: string;
  path: string;
  synchronous: 'FULL' | 'NORMAL';
  intervalMs: number;
  restartFrames: number;
  /** How long the worker's own connection waits for a lock (its thread sleeps, not the event loop). */
  busyTimeoutMs: number;
  /** The worker thread's nice value (Linux; ignored elsewhere), so that its copying yields the core to the event loop. */
  nice: number;
}

/** worker → store: `pause` (please hold new write transactions), `done` (after a restart attempt), `ran` (each checkpoint). */
export type CheckpointMessage =
  | { type: 'pause' }
  | { type: 'ran'; mode: 'PASSIVE' | 'RESTART'; busy: number; log: number; checkpointed: number; ms: number }
  | { type: 'done' };

export function checkpointWorkerMain(require: (id: string) => any): void {
  const { parentPort, workerData } = require('node:worker_threads');
  const data = workerData as CheckpointWorkerData;
  const Database = require(data.driver);
  // A checkpoint is background work: on a core shared with the event loop
  // (a pinned process, a small box) the scheduler should run the loop
  // first. Linux's setpriority(2) on a thread id renices that thread alone;
  // where /proc/thread-self is missing the worker keeps the process's value.
  try {
    const tid = Number(String(require('node:fs').readlinkSync('/proc/thread-self')).split('/').pop());
    if (Number.isInteger(tid) && tid > 0) require('node:os').setPriority(tid, data.nice);
  } catch {
    // Not Linux, or not permitted: same priority as the event loop.
  }
  const db = new Database(data.path, { fileMustExist: true });
  db.pragma(`busy_timeout = ${data.busyTimeoutMs}`);
  db.pragma(`synchronous = ${data.synchronous}`);
  db.pragma('wal_autocheckpoint = 0');
  let asked = false;
  const run = (mode: 'PASSIVE' | 'RESTART') => {
    const t0 = performance.now();
    const [r] = db.pragma(`wal_checkpoint(${mode})`) as { busy: number; log: number; checkpointed: number }[];
    parentPort.postMessage({ type: 'ran', mode, ...r, ms: performance.now() - t0 });
    return r!;
  };
  const timer = setInterval(() => {
    if (asked) return;
    const r = run('PASSIVE');
    if (r.log >= data.restartFrames) {
      asked = true;
      parentPort.postMessage({ type: 'pause' });
    }
  }, data.intervalMs);
  parentPort.on('message', (m: { type: string }) => {
    if (m.type === 'paused') {
      try {
        run('RESTART');
      } finally {
        asked = false;
        parentPort.postMessage({ type: 'done' });
      }
    } else if (m.type === 'stop') {
      clearInterval(timer);
      db.close();
      parentPort.close();
    }
  });
}
