import type { SqliteDatabase } from './open.js';

interface Pending {
  fn: () => unknown;
  resolve: (value: any) => void;
  reject: (err: unknown) => void;
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
 */
export class GroupCommit {
  private queue: Pending[] = [];
  private scheduled = false;
  private idleWaiters: (() => void)[] = [];
  /** Transactions committed (or failed) and decisions run: for tests and metrics. */
  readonly stats = { groups: 0, decisions: 0, fallbacks: 0 };
  private readonly runGroup: (items: Pending[]) => unknown[];
  private readonly runOne: (item: Pending) => unknown;

  constructor(
    db: SqliteDatabase,
    /** Called first inside every transaction (e.g. to read the database clock once). */
    onBegin: () => void = () => {},
    /** Upper bound on decisions per transaction, so one group never holds the write lock long. */
    private readonly maxGroup = 512,
  ) {
    const group = db.transaction((items: Pending[]) => {
      onBegin();
      return items.map((item) => item.fn());
    });
    const one = db.transaction((item: Pending) => {
      onBegin();
      return item.fn();
    });
    this.runGroup = (items) => group.immediate(items);
    this.runOne = (item) => one.immediate(item);
  }

  /** Runs `fn` inside the next group's transaction; resolves after that group is durable. */
  run<T>(fn: () => T): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.queue.push({ fn, resolve, reject });
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => this.flush());
      }
    });
  }

  /** Resolves once every decision queued so far has been committed or failed. */
  idle(): Promise<void> {
    if (!this.scheduled && this.queue.length === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private flush(): void {
    this.scheduled = false;
    const items = this.queue.splice(0, this.maxGroup);
    if (this.queue.length > 0) {
      this.scheduled = true;
      setImmediate(() => this.flush());
    }
    this.stats.groups++;
    this.stats.decisions += items.length;
    let results: unknown[] | null = null;
    let groupError: unknown;
    try {
      results = this.runGroup(items);
    } catch (err) {
      groupError = err;
    }
    if (results !== null) {
      items.forEach((item, i) => item.resolve(results![i]));
    } else if (items.length === 1) {
      items[0]!.reject(groupError);
    } else {
      // Rolled back as a whole: each decision again, alone, so that one
      // fault (or a COMMIT that fails again) fails only its own caller.
      this.stats.fallbacks++;
      for (const item of items) {
        try {
          item.resolve(this.runOne(item));
        } catch (err) {
          item.reject(err);
        }
      }
    }
    if (!this.scheduled) for (const wake of this.idleWaiters.splice(0)) wake();
  }
}
