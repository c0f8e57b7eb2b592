import type { SqliteDatabase } from './open.js';

interface Pending {
  fn: () => unknown;
  resolve: (value: any) => void;
  reject: (err: unknown) => void;
}

/**
 * Group commit for SQLite. With `synchronous=FULL` every COMMIT waits for
 * its own fsync of the WAL, and that fsync, not the SQL, is what limits a
 * one-transaction-per-decision store (measured: about 2k req/s, against 17k
 * for a stateless proxy on the same box).
 *
 * Decisions that arrive in the same event-loop turn are run in ONE
 * `BEGIN IMMEDIATE` transaction, each inside its own savepoint, and answered
 * only after that COMMIT has returned, so one fsync makes the whole group
 * durable and no caller hears an answer that could still be lost.
 *
 * Why the guarantees are unchanged:
 * - Each decision runs whole, in arrival order, and sees the writes of the
 *   ones before it: the group's effect is that of the same decisions run one
 *   after another (serial equivalence), which is all the single-transaction
 *   design promised.
 * - A decision that throws rolls back to its savepoint and fails alone; a
 *   failed COMMIT (disk error, another process holding the lock past
 *   busy_timeout) fails every decision of the group, none of which was
 *   answered yet.
 * - Nothing is answered before COMMIT, so a crash loses only unanswered work.
 *
 * Added latency is one turn of the event loop (`setImmediate`): microseconds
 * when idle. Under load, the decisions that queued while the previous group
 * was fsyncing form the next group, so the group size adapts to the load.
 */
export class GroupCommit {
  private queue: Pending[] = [];
  private scheduled = false;
  private idleWaiters: (() => void)[] = [];
  /** Transactions committed (or failed) and decisions run: for tests and metrics. */
  readonly stats = { groups: 0, decisions: 0 };
  private readonly runGroup: (group: Pending[], out: { ok: boolean; value: unknown }[]) => void;

  constructor(
    db: SqliteDatabase,
    /** Upper bound on decisions per transaction, so one group never holds the write lock long. */
    private readonly maxGroup = 512,
  ) {
    // better-sqlite3 runs a transaction function called inside another one
    // as a SAVEPOINT: rolled back alone on throw.
    const savepoint = db.transaction((fn: () => unknown) => fn());
    const group = db.transaction((items: Pending[], out: { ok: boolean; value: unknown }[]) => {
      for (const item of items) {
        try {
          out.push({ ok: true, value: savepoint(item.fn) });
        } catch (err) {
          out.push({ ok: false, value: err });
        }
      }
    });
    this.runGroup = (items, out) => group.immediate(items, out);
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
    const out: { ok: boolean; value: unknown }[] = [];
    this.stats.groups++;
    this.stats.decisions += items.length;
    try {
      this.runGroup(items, out);
    } catch (err) {
      // BEGIN or COMMIT failed: nothing of this group is durable.
      for (const item of items) item.reject(err);
      if (!this.scheduled) for (const wake of this.idleWaiters.splice(0)) wake();
      return;
    }
    items.forEach((item, i) => (out[i]!.ok ? item.resolve(out[i]!.value) : item.reject(out[i]!.value)));
    if (!this.scheduled) for (const wake of this.idleWaiters.splice(0)) wake();
  }
}
