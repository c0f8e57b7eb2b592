import type { SqliteDatabase } from '../../db/sqlite-open.js';
import { WriteLock, WriteLockTimeout } from './write-lock.js';
import type { DurableSync } from './wal-sync.js';

// The WAL's sync after each group's COMMIT lives in ./wal-sync.ts.
export { walSyncer, type DurableSync } from './wal-sync.js';

interface Pending {
  fn: () => unknown;
  resolve: (value: any) => void;
  reject: (err: unknown) => void;
  /** performance.now() when queued: its wait for the write lock counts from here. */
  since: number;
  /** Re-run in a transaction of its own, after its group failed as a whole. */
  alone: boolean;
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
  /**
   * The connection's write lock (./write-lock.ts): how long a decision waits
   * for another process's lock, waited on the event loop. Default: one with
   * a 5 s wait that leaves the connection's busy_timeout as it is.
   */
  lock?: WriteLock;
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
 * - A failed COMMIT (a disk error) fails every decision of the group, none
 *   of which was answered yet.
 *
 * Added latency is one turn of the event loop (`setImmediate`): microseconds
 * when idle. Under load, the decisions that queued while the previous group
 * ran form the next group, so the group size follows the load.
 *
 * When another process holds the write lock, the group is not formed yet:
 * BEGIN IMMEDIATE is tried again from a timer (./write-lock.ts), the event
 * loop runs meanwhile, and the decisions that arrive join the queue. Each
 * decision waits at most the lock's `timeoutMs` from when it was queued,
 * then fails alone with SQLITE_BUSY (503 store-unavailable), nothing of it
 * run; the others keep waiting. The group is taken from the queue only once
 * the lock is held, so it runs in one go without yielding: no decision of
 * this process ever sees another's half-done group.
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
  /** The retry of BEGIN IMMEDIATE while another connection holds the lock. */
  private lockTimer: NodeJS.Timeout | null = null;
  /** Failed BEGIN attempts since the lock was last held (the backoff step). */
  private attempts = 0;
  /** Groups committed whose sync has not reported yet. */
  private unsynced = 0;
  private failed: Error | null = null;
  /** Holds taken (./checkpoint.ts restarts the WAL meanwhile): no group begins while any is out. */
  private held = 0;
  private idleWaiters: (() => void)[] = [];
  /** Transactions committed (or failed), decisions run, syncs waited for: for tests and metrics. */
  readonly stats = { groups: 0, decisions: 0, fallbacks: 0, syncs: 0 };
  /** Told of each group that committed: its size, and its WAL sync's time when it waited for one (metrics). */
  observer: ((size: number, syncMs: number | null) => void) | null = null;
  readonly lock: WriteLock;
  private readonly onBegin: () => void;
  private readonly maxGroup: number;
  private readonly sync: DurableSync | undefined;
  /** Around each transaction: SQLite's own sync off for it (with `sync`), and back. */
  private readonly relax: () => void;
  private readonly restore: () => void;

  constructor(db: SqliteDatabase, options: GroupCommitOptions = {}) {
    this.onBegin = options.onBegin ?? (() => {});
    this.maxGroup = options.maxGroup ?? 512;
    this.sync = options.sync;
    this.lock = options.lock ?? new WriteLock(db);
    if (this.sync === undefined) {
      this.relax = this.restore = () => {};
    } else {
      // Only these transactions skip SQLite's sync; everything else on the
      // connection (sweeps, operator actions) keeps the configured level.
      const level = String(db.pragma('synchronous', { simple: true }));
      const relaxed = db.prepare('PRAGMA synchronous = NORMAL');
      const restore = db.prepare(`PRAGMA synchronous = ${level}`);
      this.relax = () => void relaxed.run();
      this.restore = () => void restore.run();
    }
  }

  /** Runs `fn` inside the next group's transaction; resolves after that group is durable. */
  run<T>(fn: () => T): Promise<T> {
    if (this.failed !== null) return Promise.reject(this.failed);
    return new Promise<T>((resolve, reject) => {
      this.queue.push({ fn, resolve, reject, since: performance.now(), alone: false });
      this.schedule();
    });
  }

  /**
   * No new group begins until the returned function is called (idempotent);
   * decisions queue meanwhile, the event loop runs. Called between groups
   * (a group runs synchronously), so none is half done.
   */
  hold(): () => void {
    this.held++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.held--;
      if (this.held === 0 && this.queue.length > 0) this.schedule();
    };
  }

  /** Resolves once every decision queued so far has been committed (and synced) or failed. */
  idle(): Promise<void> {
    if (this.isIdle()) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private isIdle(): boolean {
    return !this.scheduled && this.lockTimer === null && this.queue.length === 0 && this.unsynced === 0;
  }

  /** A flush on the next turn, unless one is due (or the lock's retry timer will flush). */
  private schedule(): void {
    if (this.scheduled || this.lockTimer !== null) return;
    this.scheduled = true;
    setImmediate(() => this.flush());
  }

  private flush(): void {
    this.scheduled = false;
    if (this.held > 0) return;
    // Re-runs after a group failed as a whole go one transaction each, in a row.
    do {
      if (this.failed !== null) {
        for (const item of this.queue.splice(0)) item.reject(this.failed);
        return this.wakeIdle();
      }
      if (this.queue.length === 0) return this.wakeIdle();
      this.relax();
      let busy: Error | null;
      try {
        busy = this.lock.tryBegin();
      } catch (err) {
        // BEGIN failed for another reason than the lock (a disk error, a
        // closed connection): the decisions it was for fail, as when BEGIN
        // threw inside the transaction function before.
        this.restore();
        for (const item of this.queue.splice(0, this.queue[0]!.alone ? 1 : this.maxGroup)) item.reject(err);
        continue;
      }
      if (busy !== null) {
        this.restore();
        return this.waitForLock(busy);
      }
      this.attempts = 0;
      this.runGroup();
    } while (this.queue[0]?.alone === true);
    if (this.queue.length > 0) this.schedule();
    else this.wakeIdle();
  }

  /** With the transaction open: takes the group from the queue, runs it, commits, answers once durable. */
  private runGroup(): void {
    // Re-runs sit at the head of the queue (nothing is queued before them).
    const items = this.queue.splice(0, this.queue[0]!.alone ? 1 : this.maxGroup);
    this.stats.groups++;
    this.stats.decisions += items.length;
    let results: unknown[] | null = null;
    let groupError: unknown;
    try {
      this.onBegin();
      results = items.map((item) => item.fn());
      this.lock.commit();
    } catch (err) {
      results = null;
      groupError = err;
      try {
        this.lock.rollback();
      } catch (rollbackError) {
        // The connection's transaction state is no longer known: nothing
        // more runs on it.
        this.failed ??= new Error(`the SQLite store stopped: rolling back a failed group failed (${(rollbackError as Error).message})`);
      }
    } finally {
      this.restore();
    }
    if (results === null && items.length > 1) {
      // Rolled back as a whole: each decision again, alone, so that one
      // fault (or a COMMIT that fails again) fails only its own caller.
      // Back at the head of the queue, keeping their order and their wait.
      this.stats.fallbacks++;
      for (const item of items) item.alone = true;
      this.queue.unshift(...items);
      return;
    }
    const settle = results !== null ? () => items.forEach((item, i) => item.resolve(results![i])) : () => items[0]!.reject(groupError);
    if (this.sync === undefined) {
      if (results !== null) this.observer?.(items.length, null);
      settle();
      return this.wakeIdle();
    }
    this.unsynced++;
    this.stats.syncs++;
    const syncStarted = performance.now();
    this.sync((err) => {
      if (err === null && results !== null) this.observer?.(items.length, performance.now() - syncStarted);
      this.unsynced--;
      if (err !== null && this.failed === null) {
        this.failed = new Error(`the SQLite store stopped: syncing its WAL failed (${err.message}); restart the gateway once the disk is healthy`);
      }
      if (this.failed !== null) for (const item of items) item.reject(this.failed);
      else settle();
      this.wakeIdle();
    });
  }

  /**
   * Another connection holds the write lock: fail the decisions that have
   * waited their whole `timeoutMs` (nothing of them ran), and try BEGIN
   * again from a timer for the rest, the event loop free meanwhile.
   */
  private waitForLock(busy: Error): void {
    if (this.attempts === 0) this.lock.stats.waits++;
    const now = performance.now();
    const timeout = this.lock.timeoutMs;
    const waiting: Pending[] = [];
    for (const item of this.queue) {
      if (now - item.since < timeout) waiting.push(item);
      else {
        this.lock.stats.timeouts++;
        item.reject(new WriteLockTimeout(now - item.since, busy));
      }
    }
    this.queue = waiting;
    if (waiting.length === 0) {
      this.attempts = 0;
      return this.wakeIdle();
    }
    // The queue is in arrival order: its head is the one whose wait ends first.
    const delay = Math.min(this.lock.delayMs(this.attempts++), waiting[0]!.since + timeout - now);
    this.lockTimer = setTimeout(
      () => {
        this.lockTimer = null;
        this.flush();
      },
      Math.max(0, delay),
    );
  }

  private wakeIdle(): void {
    if (this.isIdle()) for (const wake of this.idleWaiters.splice(0)) wake();
  }
}
