import { closeSync, fdatasync, openSync } from 'node:fs';
import type { SqliteDatabase } from './open.js';

interface Pending {
  fn: () => unknown;
  resolve: (value: any) => void;
  reject: (err: unknown) => void;
}

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

export interface GroupCommitOptions {
  /** Called first inside every transaction (e.g. to read the database clock once). */
  onBegin?: () => void;
  /** Upper bound on decisions per transaction, so one group never holds the write lock long. Default 512. */
  maxGroup?: number;
  /**
   * Durability off the event loop: the group's transaction commits without
   * SQLite's own sync (`synchronous=NORMAL` for that transaction only), and
   * its callers are answered once `sync` reports the commit on disk. Without
   * it, COMMIT itself syncs as the connection's `synchronous` says.
   */
  sync?: DurableSync;
}

/**
 * Group commit for SQLite. With `synchronous=FULL` every COMMIT waits for
 * its own fsync of the WAL (measured here: ~390 µs, against ~29 µs at
 * NORMAL), and that fsync, not the SQL, is what limits a
 * one-transaction-per-decision store.
 *
 * Decisions that arrive in the same event-loop turn run in ONE
 * `BEGIN IMMEDIATE` transaction and are answered only after its COMMIT has
 * returned, so one fsync makes the whole group durable and no caller hears
 * an answer that could still be lost.
 *
 * Why the guarantees are unchanged:
 * - Each decision runs whole, in arrival order, and sees the writes of the
 *   ones before it: the group's effect is that of the same decisions run one
 *   after another (serial equivalence), which is all the
 *   one-transaction-per-decision design promised.
 * - A decision that throws (a fault, not an outcome) rolls the whole group
 *   back; the group's decisions are then re-run one transaction each, so the
 *   fault fails only its own caller. Nothing of the group was answered before,
 *   and decisions read only the database, so running them again is safe.
 *   (No savepoint per decision: SAVEPOINT/RELEASE were a quarter of the
 *   store's CPU per request in the profile of `npm run bench`.)
 * - A failed COMMIT (disk error, another process holding the lock past
 *   busy_timeout) fails every decision of the group, none of which was
 *   answered yet.
 *
 * Added latency is one turn of the event loop (`setImmediate`): microseconds
 * when idle. Under load, the decisions that queued while the previous group
 * ran form the next group, so the group size follows the load.
 *
 * With `sync` (the SQLite store's default at `synchronous=FULL`), the fsync
 * leaves the event loop: the group commits without syncing and its callers
 * are answered when `sync` reports the WAL on disk. A group's writes are
 * visible to the next group (and to other processes on the file) before they
 * are durable, so every group, even one that wrote nothing, waits for a sync
 * that started after its own COMMIT: anything it read is then on disk too,
 * before any caller hears of it or any request goes upstream. A sync that
 * fails stops the store (every later call fails, as PostgreSQL stops on a
 * failed fsync): after a failed fsync the kernel may have dropped the dirty
 * pages, and what the database holds is no longer known to be durable.
 */
export class GroupCommit {
  private queue: Pending[] = [];
  private scheduled = false;
  /** Groups committed whose sync has not reported yet. */
  private unsynced = 0;
  private failed: Error | null = null;
  private idleWaiters: (() => void)[] = [];
  /** Transactions committed (or failed), decisions run, syncs waited for: for tests and metrics. */
  readonly stats = { groups: 0, decisions: 0, fallbacks: 0, syncs: 0 };
  private readonly runGroup: (items: Pending[]) => unknown[];
  private readonly runOne: (item: Pending) => unknown;
  private readonly maxGroup: number;
  private readonly sync: DurableSync | undefined;

  constructor(db: SqliteDatabase, options: GroupCommitOptions = {}) {
    const onBegin = options.onBegin ?? (() => {});
    this.maxGroup = options.maxGroup ?? 512;
    this.sync = options.sync;
    const group = db.transaction((items: Pending[]) => {
      onBegin();
      return items.map((item) => item.fn());
    });
    const one = db.transaction((item: Pending) => {
      onBegin();
      return item.fn();
    });
    if (this.sync === undefined) {
      this.runGroup = (items) => group.immediate(items);
      this.runOne = (item) => one.immediate(item);
    } else {
      // Only these transactions skip SQLite's sync; everything else on the
      // connection (sweeps, operator actions) keeps the configured level.
      const level = String(db.pragma('synchronous', { simple: true }));
      const relaxed = db.prepare('PRAGMA synchronous = NORMAL');
      const restore = db.prepare(`PRAGMA synchronous = ${level}`);
      const unsyncedTx = <I, O>(tx: (input: I) => O) => (input: I): O => {
        relaxed.run();
        try {
          return tx(input);
        } finally {
          restore.run();
        }
      };
      this.runGroup = unsyncedTx((items: Pending[]) => group.immediate(items));
      this.runOne = unsyncedTx((item: Pending) => one.immediate(item));
    }
  }

  /** Runs `fn` inside the next group's transaction; resolves after that group is durable. */
  run<T>(fn: () => T): Promise<T> {
    if (this.failed !== null) return Promise.reject(this.failed);
    return new Promise<T>((resolve, reject) => {
      this.queue.push({ fn, resolve, reject });
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => this.flush());
      }
    });
  }

  /** Resolves once every decision queued so far has been committed (and synced) or failed. */
  idle(): Promise<void> {
    if (this.isIdle()) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private isIdle(): boolean {
    return !this.scheduled && this.queue.length === 0 && this.unsynced === 0;
  }

  private flush(): void {
    this.scheduled = false;
    const items = this.queue.splice(0, this.maxGroup);
    if (this.queue.length > 0) {
      this.scheduled = true;
      setImmediate(() => this.flush());
    }
    if (this.failed !== null) {
      for (const item of items) item.reject(this.failed);
      return this.wakeIdle();
    }
    this.stats.groups++;
    this.stats.decisions += items.length;
    // Each decision's settlement, run once the group is durable.
    const settle: (() => void)[] = [];
    let results: unknown[] | null = null;
    let groupError: unknown;
    try {
      results = this.runGroup(items);
    } catch (err) {
      groupError = err;
    }
    if (results !== null) {
      items.forEach((item, i) => settle.push(() => item.resolve(results![i])));
    } else if (items.length === 1) {
      settle.push(() => items[0]!.reject(groupError));
    } else {
      // Rolled back as a whole: each decision again, alone, so that one
      // fault (or a COMMIT that fails again) fails only its own caller.
      this.stats.fallbacks++;
      for (const item of items) {
        try {
          const result = this.runOne(item);
          settle.push(() => item.resolve(result));
        } catch (err) {
          settle.push(() => item.reject(err));
        }
      }
    }
    if (this.sync === undefined) {
      for (const s of settle) s();
      return this.wakeIdle();
    }
    this.unsynced++;
    this.stats.syncs++;
    this.sync((err) => {
      this.unsynced--;
      if (err !== null && this.failed === null) {
        this.failed = new Error(`the SQLite store stopped: syncing its WAL failed (${err.message}); restart the gateway once the disk is healthy`);
      }
      if (this.failed !== null) for (const item of items) item.reject(this.failed);
      else for (const s of settle) s();
      this.wakeIdle();
    });
  }

  private wakeIdle(): void {
    if (this.isIdle()) for (const wake of this.idleWaiters.splice(0)) wake();
  }
}
