import { entityTopic, recordTopic, type AdmitInput } from '../types.js';
import type { PgContext } from './query.js';
import { MIN_RETRY_MS, retryDelayMs } from '../retry-schedule.js';
import { encodeNullable, encodeText } from './text.js';
import { topicHash, type PgWakeups } from './wakeups.js';


/**
 * An admission whose statement failed as a whole, as this store saw it (the
 * connection died, the server stopped or restarted, a timeout): the caller is
 * answered 503 and nothing goes upstream (DESIGN §3.5), but the statement
 * may have committed before its answer was lost, leaving a record
 * `in_progress` and a serial slot under the request's owner token. Left
 * there, the key's retry would be told `idempotency-in-progress` until the
 * lock ran out and then `outcome-unknown`, for a request that was never
 * sent. So, in the background, fencegate_release_unsent
 * (./sql/release_unsent.sql) removes whatever is held under that owner token,
 * and only that (DESIGN §8.2).
 *
 * Attempts repeat while they fail (the database is still away), for the
 * admission's lock time after the failure (at least 1.25 s), on the finish's
 * schedule (../retry-schedule.ts); then the record is left to its lock. One
 * that answers, whatever it found, is the last. Limit: a statement the
 * server is still running when the release has answered (the client gave up
 * first) can commit after it; that record is left to its lock too.
 */
export function createRelease(ctx: PgContext, wakeups: Pick<PgWakeups, 'notifyChannel' | 'notify'>, closing: () => boolean) {
  const statement = `SELECT released FROM ${ctx.table('fencegate_release_unsent')}($1, $2, $3, $4, $5, $6, $7)`;
  /** For tests and metrics: releases that removed something, found nothing, or gave up; attempts that failed. */
  const stats = { released: 0, nothing: 0, gaveUp: 0, failedAttempts: 0 };
  const pending = new Set<Promise<void>>();

  async function run(input: AdmitInput): Promise<void> {
    const giveUpAt = performance.now() + Math.max(input.lockMs, MIN_RETRY_MS);
    const params = [
      encodeText(input.scope),
      encodeNullable(input.key),
      encodeNullable(input.entity),
      encodeText(input.ownerToken),
      wakeups.notifyChannel,
      input.entity === null ? null : topicHash(entityTopic(input.entity)),
      input.key === null ? null : topicHash(recordTopic(input.scope, input.key)),
    ];
    for (let attempt = 0; ; attempt++) {
      const left = giveUpAt - performance.now();
      if (left <= 0 || closing()) {
        stats.gaveUp++;
        return;
      }
      // The finish's schedule (../retry-schedule.ts), from the first attempt:
      // the pool drops the broken connection meanwhile.
      await new Promise((r) => setTimeout(r, retryDelayMs(attempt, left)).unref?.());
      if (closing()) {
        stats.gaveUp++;
        return;
      }
      try {
        const { rows } = await ctx.query<{ released: boolean }>(statement, params);
        if (rows[0]?.released) {
          stats.released++;
          // This replica's own waiters need not wait for the NOTIFY.
          if (input.entity !== null) wakeups.notify(topicHash(entityTopic(input.entity)));
          if (input.key !== null) wakeups.notify(topicHash(recordTopic(input.scope, input.key)));
        } else stats.nothing++;
        return;
      } catch {
        // The database is still away: try again while the lock lives.
        stats.failedAttempts++;
      }
    }
  }

  return {
    stats,
    /** Starts the release of a failed admission; never rejects. */
    release(input: AdmitInput): void {
      const p = run(input).finally(() => pending.delete(p));
      pending.add(p);
    },
    /** Resolves once every release started so far has ended (tests, close). */
    idle(): Promise<void> {
      return Promise.all([...pending]).then(() => undefined);
    },
  };
}
