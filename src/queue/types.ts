/**
 * The narrow contract of a fence source: one atomic increment per attempt
 * in the queue's own durable store (docs/queues.md).
 */
import type { JobRef } from './keys.js';

/**
 * A condition that must hold at the instant of the increment, checked in the
 * same statement (CONTRIBUTING.md convention 1): "this worker still holds the job". Without
 * it, a worker frozen between the queue's hand-out and `begin` could wake
 * after a take-over and draw a higher fence than the new owner.
 *
 * - `sql` (PostgreSQL, SQLite): a boolean SQL expression; its placeholders
 *   come after the source's own two (`$3`, `$4`, … on PostgreSQL; `?` on SQLite).
 * - `redis-key` (Redis): the key must hold exactly `equals` (a lock token).
 */
export type FenceGuard =
  | { kind: 'sql'; where: string; values: readonly unknown[] }
  | {
      kind: 'redis-key';
      key: string;
      equals: string;
      /**
       * The job's own hash in the queue's Redis (BullMQ's `<prefix>:<queue>:<id>`):
       * the script marks it once per life of the job and answers which life
       * of the job id it is (`BeginResult.life`), so a job removed and added
       * again under the same id gets keys of its own (docs/queues.md).
       */
      lifeHash?: string;
    };

export type BeginResult =
  | {
      ok: true;
      fence: number;
      /**
       * `redis-key` guards: the guard key's remaining life in ms (`PTTL`) in
       * the script that drew the fence, i.e. how long the queue's lock was
       * still confirmed for; `-1` for a key without expiry.
       */
      guardTtlMs?: number;
      /** With a `lifeHash`: 1 for the first life of the job id in this store, 2 for the next, … */
      life?: number;
      /**
       * Redis: the store identity the fence was drawn under, for `jobKeys`. A
       * Redis that lost its identity (restarted without persistence, flushed)
       * gets a new one at the next `begin`, and `FenceSource.storeId` follows.
       */
      storeId?: string;
    }
  /** The guard did not hold: the job is no longer this worker's. Nothing was incremented. */
  | { ok: false; reason: 'not_owner' };

export interface FenceSource {
  readonly backend: 'postgres' | 'sqlite' | 'redis';
  /** 32 hex characters; part of every entity and key built from this source (Redis: the latest begin's, see `BeginResult.storeId`). */
  readonly storeId: string;
  /**
   * Raises the job's fence by one and returns it, in one atomic statement
   * (`INSERT … ON CONFLICT DO UPDATE … RETURNING`, or `INCR`). Call it once
   * per attempt, after the queue handed the job to this worker: every later
   * attempt, a take-over included, gets a strictly higher fence.
   */
  begin(job: JobRef, guard?: FenceGuard): Promise<BeginResult>;
  /**
   * Redis only: checks a `redis-key` guard without drawing a fence, in one
   * script. The key's remaining life in ms (`PTTL`, `-1` without expiry),
   * or `null` when the key no longer holds the value (the lock is gone or
   * another worker's).
   */
  guardTtl?(guard: FenceGuard): Promise<number | null>;
  /**
   * PostgreSQL and SQLite: deletes the rows of job ids whose latest fence was
   * drawn more than `olderThanMs` ago, at most `batch` (default 1000) per
   * call; returns how many. Run it from the queue's own schedule (a cron
   * task) so the ids of finished jobs do not pile up; `olderThanMs` must be
   * longer than the gateway's `entityRetention` plus the longest a job
   * runs, and at least a day (docs/queues.md). Redis keys expire by
   * themselves (`keyTtlMs`).
   */
  sweep?(options: { olderThanMs: number; batch?: number }): Promise<number>;
}
