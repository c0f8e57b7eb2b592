import { CONNECT_ONLY_CODES, causeCode } from '../../protocol/connect-errors.js';
import { MIN_RETRY_MS, retryDelayMs } from '../retry-schedule.js';
import type { AdmitInput, UnsentRelease } from '../types.js';
import type { PgContext } from './query.js';
import { encodeNullable, encodeText } from './text.js';
import { decisionTopics, wakeLocal, type PgWakeups } from './wakeups.js';

/**
 * An admission whose statement failed as a whole, as this store saw it (the
 * connection died, the server stopped or restarted, a timeout): the caller is
 * answered 503 and nothing goes upstream (DESIGN §3.5), but the statement
 * may have committed before its answer was lost, leaving a record
 * `in_progress` and a serial slot under the request's owner token. Left
 * there, the key's retry would be told `idempotency-in-progress` until the
 * lock ran out and then `outcome-unknown`, for a request that was never
 * sent. So, in the background, fencegate_release_unsent
 * (./sql/release_unsent.sql) frees whatever is held under that owner token,
 * and only that: the rule `releaseUnsent` of ../../core/admission.ts, to
 * which the admission conformance property holds it (DESIGN §8.2).
 *
 * None starts when the error shows nothing was written (`wroteNothing`),
 * nor past `maxPending`. Attempts repeat while they fail (the database is
 * still away), for the admission's lock time after the failure (at least
 * 1.25 s), on the finish's schedule (../retry-schedule.ts); then the record
 * is left to its lock. One that answers, whatever it found, is the last.
 * Limit: a statement the server is still running when the release has
 * answered (it waits for a row lock, or the client gave up first) can commit
 * after it; that record is left to its lock too.
 */
export function createRelease(ctx: PgContext, wakeups: Pick<PgWakeups, 'notifyChannel' | 'notify'>, closing: () => boolean) {
  const statement = `SELECT slot, record FROM ${ctx.table('fencegate_release_unsent')}($1, $2, $3, $4, $5, $6, $7, $8, $9)`;
  /**
   * For tests and metrics: releases that freed something, found nothing,
   * gave up, or were never started (the error showed nothing was written,
   * or too many were pending); attempts that failed.
   */
  const stats = { released: 0, nothing: 0, gaveUp: 0, notNeeded: 0, overCap: 0, failedAttempts: 0 };
  const pending = new Set<Promise<void>>();

  const paramsOf = (input: AdmitInput) => {
    const topics = decisionTopics(input);
    return [
      encodeText(input.scope),
      encodeNullable(input.key),
      encodeNullable(input.entity),
      encodeText(input.ownerToken),
      input.onUnknown === 'retry',
      Math.ceil(input.lockMs), // as the admission wrote it (./admit.ts)
      wakeups.notifyChannel,
      topics.entity,
      topics.record,
    ];
  };

  /** The admission committed between the function's two statements: its record went, but its slot was taken after the first. */
  const slotLeft = (row: UnsentRelease, input: AdmitInput) => row.record && !row.slot && input.entity !== null && input.mode === 'serial';

  async function run(input: AdmitInput): Promise<void> {
    const giveUpAt = performance.now() + Math.max(input.lockMs, MIN_RETRY_MS);
    const topics = decisionTopics(input);
    const params = paramsOf(input);
    let freed = false;
    const done = (outcome: 'answered' | 'gaveUp') => {
      if (freed) {
        stats.released++;
        // This replica's own waiters need not wait for the NOTIFY.
        wakeLocal(wakeups, topics);
      } else if (outcome === 'gaveUp') stats.gaveUp++;
      else stats.nothing++;
    };
    for (let attempt = 0; ; attempt++) {
      const left = giveUpAt - performance.now();
      if (left <= 0 || closing()) return done('gaveUp');
      // The finish's schedule (../retry-schedule.ts), from the first attempt:
      // the pool drops the broken connection meanwhile.
      await new Promise((r) => setTimeout(r, retryDelayMs(attempt, left)).unref?.());
      if (closing()) return done('gaveUp');
      let row: { slot: boolean; record: boolean } | undefined;
      try {
        row = (await ctx.query<{ slot: boolean; record: boolean }>(statement, params)).rows[0];
      } catch {
        // The database is still away: try again while the lock lives.
        stats.failedAttempts++;
        continue;
      }
      freed ||= row?.slot === true || row?.record === true;
      // The admission committed between the function's two statements: its
      // record went, but its slot was taken after the first; once more frees
      // it (only serial mode takes one; the record part then finds nothing).
      if (row !== undefined && slotLeft(row, input)) continue;
      return done('answered');
    }
  }

  const releases = {
    stats,
    /**
     * One release now, in the foreground (GatewayStore.releaseUnsent): the
     * function once, and once more if the admission committed between its
     * two statements (applying the rule again changes nothing else). Throws
     * when the database does; never counted in `stats`.
     */
    async once(input: AdmitInput): Promise<UnsentRelease> {
      const params = paramsOf(input);
      const call = async () => {
        const row = (await ctx.query<UnsentRelease>(statement, params)).rows[0];
        return { slot: row?.slot === true, record: row?.record === true };
      };
      let got = await call();
      if (slotLeft(got, input)) {
        const again = await call();
        got = { slot: got.slot || again.slot, record: got.record || again.record };
      }
      if (got.slot || got.record) wakeLocal(wakeups, decisionTopics(input));
      return got;
    },
    /**
     * Releases pending at once, at most: each waits out an outage with its own
     * attempts, so many failed admissions must not turn into a flood when the
     * database is back. Past it a failed admission's record is left to its
     * lock, as it would have been without the release.
     */
    maxPending: MAX_PENDING,
    /** Starts the release of a failed admission, unless `err` shows it wrote nothing; never rejects. */
    release(input: AdmitInput, err: unknown): void {
      if (wroteNothing(err)) {
        stats.notNeeded++;
        return;
      }
      if (pending.size >= releases.maxPending) {
        stats.overCap++;
        return;
      }
      const p = run(input).finally(() => pending.delete(p));
      pending.add(p);
    },
    /** Resolves once every release started so far has ended (tests). */
    idle(): Promise<void> {
      return Promise.all([...pending]).then(() => undefined);
    },
  };
  return releases;
}

/** Four groups' worth (a group holds at most 64 admissions). */
const MAX_PENDING = 256;

/**
 * Whether a failed admission's error shows that nothing of it committed: the
 * server answered the statement with an ERROR (a SQLSTATE: the statement,
 * and with it a whole group, rolled back), or the connection was never made
 * (a connect-only code: nothing reached the server). Not the classes 08
 * (connection exception), 57 (operator intervention: a shutdown terminates a
 * backend after its COMMIT as well as before), 58 (system error: I/O) and
 * XX (internal error). Anything else (a connection lost mid-statement, a
 * timeout, an answer that could not be read) may have come after the COMMIT.
 * When this is wrong, the record is left to its lock, as without the release.
 */
function wroteNothing(err: unknown): boolean {
  const e = err as { code?: unknown; severity?: unknown } | null;
  if (e !== null && typeof e === 'object' && typeof e.code === 'string' && typeof e.severity === 'string' && /^[0-9A-Z]{5}$/.test(e.code)) {
    // ERROR only: a FATAL or PANIC (a failed WAL flush after the commit
    // record was written) can come with a commit that survives. A server
    // with localised messages never says `ERROR`, and so always releases.
    return e.severity === 'ERROR' && !['08', '57', '58', 'XX'].includes(e.code.slice(0, 2));
  }
  const code = causeCode(err);
  return code !== null && CONNECT_ONLY_CODES.has(code);
}
