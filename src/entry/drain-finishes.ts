import type { Logger } from '../http/logger.js';
import { overrideStore } from '../store/override.js';
import { retryDelayMs } from '../store/retry-schedule.js';
import type { FinishInput, FinishResult, GatewayStore } from '../store/types.js';

/** A finish the drain retries in the background, and what became of it. */
interface Background {
  /** Ends once the finish landed, or at abandon(). */
  done: Promise<void>;
  result: FinishResult | null;
  /** The last attempt's fault, what the gateway's own attempts are told meanwhile. */
  error: unknown;
}

/**
 * The finishes a shutdown must not lose (DESIGN §3.7). Outside a shutdown
 * this changes nothing: each finish call is the store's, and the gateway
 * retries a failed one for as long as the record's lock lives, then gives the
 * caller its answer all the same. Once `drain(deadline)` was called (SIGTERM,
 * SIGINT), a finish that fails goes on in the background here, on the
 * store's retry schedule (../store/retry-schedule.ts), until it lands or
 * `abandon()` is called at the deadline, past the record's lock too: the
 * finish is conditional on the request's owner token, so a late one
 * completes a record that was only marked `outcome_unknown`, and is
 * discarded (and logged as a late finish) if another request took it over.
 * So when the database comes back within the drain's bound, every answer a
 * caller was given is written, and the key's retry is a replay, not
 * `outcome-unknown`.
 *
 * Never two attempts of one finish at once: while the background retries
 * one, the gateway's own attempts of it send nothing (they are told the last
 * fault, or the result once it landed). The store's close() waits for the
 * background retries first. `abandon()` logs each finish still unwritten
 * (retried in the background, or an attempt still unanswered), one
 * `finish-unwritten` line with its route, key, entity, outcome and request
 * id, never a body, so that an operator can settle it
 * (docs/deploy-postgres.md §6).
 */
export function drainingFinishes(store: GatewayStore, logger: Logger) {
  let deadline: number | null = null;
  let abandoned = false;
  /** Wakes the background retries sleeping between attempts (abandon()). */
  const sleepers = new Set<() => void>();
  /** Finish attempts sent and not answered yet. */
  const inFlight = new Set<FinishInput>();
  const background = new Map<FinishInput, Background>();

  const sleep = (ms: number) =>
    new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        sleepers.delete(done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      sleepers.add(done);
    });

  const retryInBackground = (input: FinishInput, first: unknown, until: number): void => {
    const b: Background = { done: Promise.resolve(), result: null, error: first };
    b.done = (async () => {
      for (let attempt = 0; !abandoned; attempt++) {
        // Past the deadline (abandon() comes at it) the last step repeats.
        await sleep(retryDelayMs(attempt, Math.max(until - performance.now(), 50)));
        if (abandoned) return;
        try {
          b.result = await store.finish(input);
          // The request may have logged its finish as failed (store-error) when its own retries gave up: it landed after all.
          logger.info('finish-drained', { ...describe(input), recorded: b.result.recorded, attempts: attempt + 2 });
          return;
        } catch (err) {
          b.error = err;
        }
      }
    })();
    background.set(input, b);
  };

  const finish = async (input: FinishInput): Promise<FinishResult> => {
    const b = background.get(input);
    if (b !== undefined) {
      if (b.result === null) throw b.error;
      background.delete(input);
      return b.result;
    }
    inFlight.add(input);
    try {
      return await store.finish(input);
    } catch (err) {
      if (deadline !== null && !abandoned) retryInBackground(input, err, deadline);
      throw err;
    } finally {
      inFlight.delete(input);
    }
  };

  const close = async (): Promise<void> => {
    await Promise.all([...background.values()].map((b) => b.done));
    await store.close();
  };

  return {
    store: overrideStore(store, { finish, close }),
    /** From now on a failed finish is retried in the background until it lands or `abandon()`. */
    drain(until: number): void {
      deadline = until;
    },
    /** The drain's time is up: stops the retries and logs every finish not written. Returns how many. */
    abandon(reason: string): number {
      if (abandoned) return 0;
      abandoned = true;
      for (const wake of [...sleepers]) wake();
      const left = [...inFlight, ...[...background].filter(([, b]) => b.result === null).map(([input]) => input)];
      for (const input of left) logger.error('finish-unwritten', { ...describe(input), reason });
      return left.length;
    },
  };
}

/** What a log line says of a finish: never its body or headers. */
function describe(input: FinishInput): Record<string, unknown> {
  return {
    route: input.scope.split('\u0000')[0],
    idempotency_key: input.key,
    entity: input.entity,
    outcome: input.outcome,
    request_id: input.audit.requestId,
  };
}
