import type { Statement } from 'better-sqlite3';
import type { SqliteDatabase } from '../../db/sqlite-open.js';

/**
 * Waiting for SQLite's write lock without stopping the event loop.
 *
 * better-sqlite3 is synchronous, and SQLite's busy handler waits by sleeping
 * the calling thread: with `busy_timeout = 5000`, a `BEGIN IMMEDIATE` that
 * finds the write lock held by another process (one that is stopped, swapped
 * out or simply slow) holds the whole event loop for up to 5 s. Nothing else
 * runs meanwhile: not the health check, not reads, not the answers of
 * requests that need no lock.
 *
 * The protocol here:
 * - SQLite itself may wait only `blockingMs` (a few ms) inside one call:
 *   enough for the usual contention between live processes, whose
 *   transactions last microseconds.
 * - When BEGIN IMMEDIATE still finds the lock taken (SQLITE_BUSY), nothing
 *   was done, so it is tried again later from a timer (`setTimeout`), with
 *   growing delays (SQLite's own busy-handler steps, up to 50 ms). The event
 *   loop runs between attempts.
 * - A caller gives up `timeoutMs` after it started waiting (the old
 *   busy_timeout, default 5 s) with an SQLITE_BUSY error, which the gateway
 *   answers as before: 503 store-unavailable, nothing sent upstream.
 *
 * Only BEGIN is retried: once it succeeds the transaction holds the write
 * lock, and in WAL mode neither its statements nor its COMMIT wait for
 * another connection (a COMMIT's automatic checkpoint is PASSIVE and never
 * waits). A SQLITE_BUSY anywhere else is a fault like any other.
 */

/** Delays between attempts, in ms: SQLite's own busy-handler steps, then 50 ms each. */
const STEPS = [1, 2, 5, 10, 15, 20, 25, 25, 25, 50];

/** SQLITE_BUSY or one of its extended codes: another connection holds a lock this one needs. */
export function isBusy(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && code.startsWith('SQLITE_BUSY');
}

/** The error a caller gets once its wait for the write lock is over. */
export class WriteLockTimeout extends Error {
  readonly code = 'SQLITE_BUSY';
  constructor(waitedMs: number, cause: unknown) {
    super(`database is locked: another connection held the SQLite write lock for the whole wait (${Math.round(waitedMs)} ms)`, { cause });
    this.name = 'WriteLockTimeout';
  }
}

export interface WriteLockOptions {
  /** How long a caller waits in all for another connection's write lock. Default 5000 ms. */
  timeoutMs?: number;
  /**
   * Sets the connection's `busy_timeout` to this: how long SQLite may wait
   * inside one call, sleeping the thread (and so the event loop). Left as
   * the connection has it when omitted.
   */
  blockingMs?: number;
}

/** The wait statistics of one connection (both the group committer and single transactions count here). */
export interface WriteLockStats {
  /** Transactions (or groups) that found the lock taken at least once. */
  waits: number;
  /** BEGIN IMMEDIATE attempts that found it taken. */
  busy: number;
  /** Callers that gave up after `timeoutMs`. */
  timeouts: number;
}

/** One connection's write transactions, each begun with the event loop free while it waits (see above). */
export class WriteLock {
  readonly timeoutMs: number;
  readonly stats: WriteLockStats = { waits: 0, busy: 0, timeouts: 0 };
  private readonly begin: Statement;
  private readonly commitStmt: Statement;
  private readonly rollbackStmt: Statement;

  constructor(
    private readonly db: SqliteDatabase,
    options: WriteLockOptions = {},
  ) {
    this.timeoutMs = options.timeoutMs ?? 5000;
    if (options.blockingMs !== undefined) db.pragma(`busy_timeout = ${Math.max(0, Math.floor(options.blockingMs))}`);
    // IMMEDIATE: the write lock is taken at BEGIN, so that two processes
    // never both read the old fence and then both write (SQLITE_BUSY_SNAPSHOT).
    this.begin = db.prepare('BEGIN IMMEDIATE');
    this.commitStmt = db.prepare('COMMIT');
    this.rollbackStmt = db.prepare('ROLLBACK');
  }

  /** Delay before attempt `attempt + 1` (0-based count of failed attempts). */
  delayMs(attempt: number): number {
    return STEPS[Math.min(attempt, STEPS.length - 1)]!;
  }

  /**
   * One BEGIN IMMEDIATE. Returns null with the transaction open, or the
   * SQLITE_BUSY error when the lock stayed taken for `busy_timeout` (then
   * nothing was done and no transaction is open). Other errors throw.
   */
  tryBegin(): Error | null {
    try {
      this.begin.run();
      return null;
    } catch (err) {
      if (!isBusy(err) || this.db.inTransaction) throw err;
      this.stats.busy++;
      return err as Error;
    }
  }

  commit(): void {
    this.commitStmt.run();
  }

  /** Rolls back what is left of the transaction (SQLite may already have rolled it back after an I/O or full-disk error). */
  rollback(): void {
    if (this.db.inTransaction) this.rollbackStmt.run();
  }

  /**
   * Runs `fn` in a BEGIN IMMEDIATE transaction of its own, once the write
   * lock is free; COMMIT when it returns, ROLLBACK when it throws. `fn` may
   * be a better-sqlite3 transaction function: inside this one it becomes a
   * savepoint.
   */
  async transaction<T>(fn: () => T): Promise<T> {
    const since = performance.now();
    for (let attempt = 0; ; attempt++) {
      const busy = this.tryBegin();
      if (busy === null) break;
      if (attempt === 0) this.stats.waits++;
      const waited = performance.now() - since;
      if (waited >= this.timeoutMs) {
        this.stats.timeouts++;
        throw new WriteLockTimeout(waited, busy);
      }
      await sleep(Math.min(this.delayMs(attempt), this.timeoutMs - waited));
    }
    try {
      const result = fn();
      // A promise would run its rest after COMMIT, outside the transaction.
      if (result instanceof Promise) throw new TypeError('a write transaction function cannot return a promise');
      this.commit();
      return result;
    } catch (err) {
      this.rollback();
      throw err;
    }
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
}
