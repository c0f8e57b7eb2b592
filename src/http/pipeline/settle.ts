import type { FinishInput, GatewayStore, StoredResponse } from '../../store/types.js';
import { MIN_RETRY_MS, retryDelayMs } from '../../store/retry-schedule.js';
import { START_DEADLINE_PASSED } from '../forward.js';
import type { Reply } from '../inbound.js';
import { errorText, type Logger } from '../logger.js';
import type { Forwarding } from './admit.js';
import type { Codec, Command, Settled } from './codec.js';
import { roundMs, type Exchange } from './exchange.js';
import type { Forwarded } from './forward.js';
import type { Observer } from './observe.js';
import { setHeader } from './reply.js';
import { commandOf, commandStatus } from '../command-log.js';
import type { Config } from '../../config/schema.js';
import type { CommandOutcome } from '../../store/types.js';

/** A finish's outcome as the command log names it (DESIGN §4.1 `commands`). */
const COMMAND_OUTCOME: Record<FinishInput['outcome'], CommandOutcome> = { completed: 'completed', released: 'released', unknown: 'outcome_unknown' };

// Stage 8 of the decision order (DESIGN §3.7): one outcome per admitted
// request, recorded by a finish conditional on the owner token (G4). What
// an answer means is the codec's (../plain/outcome.ts, ../mcp/outcome.ts);
// recording it, and "nothing was sent", are the same for every protocol.

export function createSettleStage(deps: { store: GatewayStore; logger: Logger; observer: Observer; config: Pick<Config, 'fence'> }) {
  const { store, logger, observer } = deps;

  return async function settle<S>(x: Exchange, codec: Codec<S>, state: S, command: Command, admitted: Forwarding, forwarded: Forwarded): Promise<Reply> {
    const { admission, input, sentAt } = admitted;
    const { result, keeper } = forwarded;
    // A long call's lock as last renewed; its renewing stops now that the outcome is known (./lock-keeper.ts).
    const lockLost = keeper?.lost() ?? false;
    keeper?.stop();
    const lockEnds = keeper !== undefined ? keeper.lockEnds() : sentAt + input.lockMs;
    const base = { scope: input.scope, key: input.key, entity: input.entity, ownerToken: input.ownerToken, audit: input.audit };

    const record = async (s: Settled): Promise<Reply> => {
      const decision = admission.takeover ? `${s.decision}-after-takeover` : s.decision;
      // Its command-log row, written by the finish in its transaction: the outcome and what the caller was answered.
      s.finish.command = commandOf(x, deps.config, {
        scope: input.scope,
        outcome: COMMAND_OUTCOME[s.finish.outcome],
        decision,
        status: commandStatus(s.decision, s.reply.status),
      });
      const finishSpan = x.span.phase('fencegate.finish', { 'fencegate.finish': s.finish.outcome });
      const recorded = await finishWithRetries(store, s.finish, logger, x.requestId, lockEnds);
      finishSpan.end({ 'fencegate.recorded': recorded === null ? 'store-error' : recorded });
      if (recorded === false) logger.warn('late-finish-discarded', { request_id: x.requestId, route: x.route!.name, idempotency_key: input.key });
      return observer.done(x, s.reply, decision);
    };

    if (result.kind === 'refused' && result.error === START_DEADLINE_PASSED) {
      // Nothing was sent: release the record and the slot (conditional on the
      // owner token, so a takeover that already happened is left alone). A
      // record this request took over from outcome_unknown goes back to
      // outcome_unknown: the earlier attempt's outcome is as unknown as before,
      // and its fingerprint must keep refusing another payload under the key.
      logger.warn('forward-abandoned', {
        request_id: x.requestId,
        route: x.route!.name,
        idempotency_key: input.key,
        waited_ms: roundMs(performance.now() - sentAt),
        lock_ms: input.lockMs,
      });
      const refusal = {
        code: 'admission-expired' as const,
        detail: codec.expiredDetail(input.lockMs),
        extras: { ...codec.expiredExtras(command), retry_after: 1 },
      };
      return record({
        finish: finishOf(base, { outcome: admission.takeover ? 'unknown' : 'released' }),
        reply: codec.render(x, refusal, state),
        decision: refusal.code,
      });
    }

    const settled = codec.settle(x, state, result, base, forwarded.timeoutMs);
    if (!('head' in settled)) return record(lockLost && result.kind !== 'refused' ? keepUnknown(settled, x, logger) : settled);
    // An answer handed on as it comes: its head now; the log line, the
    // finish and the in-flight count wait for its end (`Reply.settled`).
    const { head } = settled;
    setHeader(head, 'x-request-id', x.requestId);
    head.settled = settled.ended
      .then(async (end) => {
        await record(end);
        end.after();
      })
      .catch((err) => {
        logger.error('mcp-stream-error', { request_id: x.requestId, route: x.route!.name, error: errorText(err) });
        settled.abort();
      });
    return head;
  };
}

/**
 * A long call whose lock was lost while the request was on the wire
 * (DESIGN §3.6 "Long calls"): the request cannot be recalled, and meanwhile
 * the record may have been judged dead, so the attempt's outcome is recorded
 * as `completed` (an answer: the finish lands only if the record is still
 * this owner's, §3.7) or `unknown`, never `released`: a release would let
 * the key be sent again while nobody knows what the lapse let happen.
 */
function keepUnknown(s: Settled, x: Exchange, logger: Logger): Settled {
  if (s.finish.outcome !== 'released') return s;
  logger.warn('release-kept-unknown', { request_id: x.requestId, route: x.route!.name, idempotency_key: s.finish.key, reason: 'lock-lost' });
  const { outcome: _released, ...rest } = s.finish;
  return { ...s, finish: Object.assign(rest, { outcome: 'unknown' as const }) };
}

/**
 * `{ ...base, ...end }`, the same object: in Node 20's V8 an object spread
 * followed by more properties takes a slow path (~2 µs a call, measured),
 * Object.assign onto a new object does not.
 */
export function finishOf(
  base: Omit<FinishInput, 'outcome'>,
  end: { outcome: 'released' | 'unknown' } | { outcome: 'completed'; response: StoredResponse; retentionMs: number },
): FinishInput {
  return Object.assign({}, base, end);
}

/**
 * The finish must land, or the record would wait for its lock to expire and
 * become outcome_unknown although the gateway knows the answer. Retries ride
 * out a store outage (a PostgreSQL restart or failover, a busy SQLite file)
 * for as long as the record's lock lives (`timeoutMs + lockMarginMs` from the
 * admission; at least ~1.25 s), the margin the lock keeps for this finish.
 * A PostgreSQL restart under load (test/replicas/postgres-restart.test.ts)
 * kept the server away ~1.5 s; with a fixed 1.25 s of retries every request
 * at the upstream at that moment ended outcome_unknown although it had been
 * answered. Past the lock a retry is harmless (the finish is conditional on
 * the owner token) but the caller has waited long enough.
 */
export async function finishWithRetries(
  store: GatewayStore,
  finish: FinishInput,
  logger: Logger,
  requestId: string,
  lockEnds: number,
): Promise<boolean | null> {
  // performance.now(): lockEnds is measured on the monotonic clock.
  const giveUpAt = Math.max(lockEnds, performance.now() + MIN_RETRY_MS);
  for (let attempt = 0; ; attempt++) {
    try {
      return (await store.finish(finish)).recorded;
    } catch (err) {
      const left = giveUpAt - performance.now();
      if (left <= 0) {
        logger.error('store-error', { request_id: requestId, phase: 'finish', outcome: finish.outcome, attempts: attempt + 1, error: errorText(err) });
        return null;
      }
      // Jittered (../store/retry-schedule.ts); the last attempt falls on the deadline itself.
      await new Promise((r) => setTimeout(r, retryDelayMs(attempt, left)));
    }
  }
}
