import { closeSync, fdatasync, openSync } from 'node:fs';

/**
 * Makes the commits made so far durable and calls back: `err` null once they
 * are on disk. Called after each group's COMMIT; the default syncs the WAL
 * file (`walSyncer`).
 */
export type DurableSync = (done: (err: Error | null) => void) => void;

/**
 * fdatasync(2) of the WAL file on libuv's thread pool, one at a time: the
 * event loop goes on (parsing, forwarding, committing the next group) while
 * the disk works, and every group committed while a sync runs waits for the
 * next one, which covers them all. This is SQLite's own `synchronous=FULL`
 * WAL sync (fdatasync of the WAL after the commit's frames are written),
 * moved off the event loop.
 */
export function walSyncer(walPath: string): DurableSync & { close(): void; readonly fsyncs: number } {
  let fd: number | null = null;
  let fsyncs = 0;
  let running = false;
  let waiting: ((err: Error | null) => void)[] = [];
  const start = () => {
    running = true;
    // Callbacks that arrive from now on belong to commits this sync may miss.
    const batch = waiting;
    waiting = [];
    try {
      fd ??= openSync(walPath, 'r');
    } catch (err) {
      running = false;
      for (const done of batch) done(err as Error);
      return;
    }
    fsyncs++;
    fdatasync(fd, (err) => {
      running = false;
      for (const done of batch) done(err);
      if (waiting.length > 0) start();
    });
  };
  const sync = (done: (err: Error | null) => void) => {
    waiting.push(done);
    if (!running) start();
  };
  const close = () => {
    if (fd !== null) closeSync(fd);
    fd = null;
  };
  // Object.assign would copy the counter's value once; a getter keeps it live.
  return Object.defineProperties(sync, {
    /** fdatasync calls made: fewer than the groups that waited for them under load. */
    fsyncs: { get: () => fsyncs },
    close: { value: close },
  }) as DurableSync & { close(): void; readonly fsyncs: number };
}
