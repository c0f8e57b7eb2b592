import type { LongCallConfig } from '../../config/schema.js';
import type { GatewayStore } from '../../store/types.js';
import { errorText, type Logger } from '../logger.js';

// A long call's record lock, kept alive while the request is on its way and
// the upstream holds the connection (DESIGN §3.6 "Long calls"). The admission
// locked the record (and the entity's serial slot) for the route's
// `longCall.lockWindow`; every `renewEvery` the store's `extendLock` sets the
// lock's end to `lockWindow` past the database's now (never shorter than it
// was, G6). The end this process may rely on is measured as the admission's
// is (../lock-budget.ts): from just BEFORE the extension that succeeded was
// sent, so it is never later than the end the database wrote.

export interface LockKeeper {
  /** `performance.now()` at which the lock, as last extended, ends by this process's reckoning. */
  lockEnds(): number;
  /**
   * The lock may have been lost: an extension was refused (the record is no
   * longer this attempt's live lock: taken over, marked outcome_unknown,
   * resolved), or the lock's end passed without one landing (the store was
   * unreachable). Sticky: once true the attempt's outcome may only be
   * recorded as `completed` (a finish conditional on the owner token) or
   * `unknown`, never `released` (./settle.ts).
   */
  lost(): boolean;
  /** Stops renewing (the outcome is known; the finish follows). Idempotent. */
  stop(): void;
}

export interface KeepLockInput {
  scope: string;
  key: string;
  entity: string | null;
  ownerToken: string;
  /** `performance.now()` just before the admission was sent. */
  sentAt: number;
  /** The lock the admission took (the route's `lockWindow`). */
  lockMs: number;
}

/**
 * Renews the lock of one admitted long call until `stop()`. A renewal that
 * fails on a store error is tried again at the next tick (the lock may
 * still be alive); a refused one ends the renewing: the record is no longer
 * this attempt's, and the store never revives an expired lock.
 */
export function keepLock(
  store: GatewayStore,
  input: KeepLockInput,
  longCall: LongCallConfig,
  log: { logger: Logger; requestId: string; route: string },
): LockKeeper {
  let ends = input.sentAt + input.lockMs;
  let lost = false;
  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const markLost = (reason: string, extra: Record<string, unknown> = {}) => {
    if (lost) return;
    lost = true;
    log.logger.warn('lock-lost', { request_id: log.requestId, route: log.route, idempotency_key: input.key, reason, ...extra });
  };
  const tick = async (): Promise<void> => {
    if (stopped) return;
    // Past the end with no renewal landed: someone may already judge the attempt dead (§3.5 f).
    if (performance.now() >= ends) markLost('lock-expired');
    const sentAt = performance.now();
    try {
      // With the entity: the serial slot is kept with the record (DESIGN §3.5 h).
      const ok = await store.extendLock({ scope: input.scope, key: input.key, entity: input.entity, owner: input.ownerToken, ms: input.lockMs });
      if (stopped) return;
      if (!ok) {
        markLost('extension-refused');
        return stop();
      }
      ends = Math.max(ends, sentAt + input.lockMs);
    } catch (err) {
      if (stopped) return;
      log.logger.warn('lock-extend-failed', { request_id: log.requestId, route: log.route, idempotency_key: input.key, error: errorText(err) });
    }
    schedule();
  };
  const schedule = () => {
    if (stopped) return;
    timer = setTimeout(() => void tick(), longCall.renewEvery);
  };
  const stop = () => {
    stopped = true;
    clearTimeout(timer);
  };
  schedule();
  return {
    lockEnds: () => ends,
    lost: () => lost || performance.now() >= ends,
    stop,
  };
}
