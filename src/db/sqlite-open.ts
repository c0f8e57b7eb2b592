import Database from 'better-sqlite3';

export type SqliteDatabase = Database.Database;

export interface OpenSqliteOptions {
  /**
   * `FULL` (default) fsyncs the WAL on every commit, so an accepted fence
   * survives power loss. `NORMAL` may lose the last commits on power loss
   * (never on a process crash) and is faster.
   */
  synchronous?: 'FULL' | 'NORMAL';
  /**
   * How long a writer waits for another process's lock. Default 5000 ms.
   * `openSqlite` makes it SQLite's `busy_timeout`, which waits by sleeping
   * the thread, and so the event loop. The gateway store keeps that for its
   * migrations only, then waits between attempts with the loop free
   * (src/store/sqlite/write-lock.ts).
   */
  busyTimeoutMs?: number;
}

/**
 * Opens a SQLite file the way every fencegate store needs it: WAL (readers
 * never block the writer, several processes may share the file), the chosen
 * durability, and a busy timeout so that `BEGIN IMMEDIATE` in another process
 * waits instead of failing.
 */
export function openSqlite(path: string, options: OpenSqliteOptions = {}): SqliteDatabase {
  const db = new Database(path);
  db.pragma(`busy_timeout = ${options.busyTimeoutMs ?? 5000}`);
  if (path !== ':memory:') db.pragma('journal_mode = WAL');
  db.pragma(`synchronous = ${options.synchronous ?? 'FULL'}`);
  db.pragma('foreign_keys = ON');
  return db;
}
