/**
 * Group commit for the lease store's hot path. The first call goes out at
 * once, alone; calls that arrive while it is in flight (and, in a group
 * whose callers call again, those its answer releases in the same turn of
 * the event loop) wait for it and then go out together, as one statement
 * (one round trip, one commit, one WAL flush) for up to `max` of them. So
 * a lone worker sends the same single statements as before, and many
 * concurrent slots pay a fraction of a statement each. On the 2-core bench
 * box at 16 workers, server CPU per claim + complete fell from ~0.9 to
 * ~0.3 ms, and the store used 2 connections instead of 10
 * (docs/bench-lease.md).
 *
 * One statement in flight per group. Two in flight gave 12–20% more jobs/s
 * at 16 workers while the box ran at load 8, but 10–15% fewer at load 5, and
 * 1.2–1.5× the server CPU per job; four were worse still (same bench). One
 * in flight also means a worker's claims through one store never run at
 * once (its completeAndClaim calls share the claims' group, ./claim.ts),
 * so its jobs sharing a custom fence key see each other's tokens.
 *
 * A grouped statement that the server refused for one element's data (a
 * result jsonb refuses: `firstStatement`) rolled back whole, so its calls
 * go again one at a time, still one statement in
 * flight, and only the faulty one fails: otherwise a neighbour's refused
 * complete would leave its job running, to run again. Any other failure
 * (the connection lost, the database stopped, a timeout) rejects every call
 * in the group: each of them would have been that fault on its own, and
 * going again alone would pay it once per call.
 */

/**
 * Thrown by a group's `run` when its calls must go again one statement at a
 * time, and only when nothing of the group was committed: before it sends
 * anything (the same lease twice: the second must see the first's commit),
 * or by `firstStatement` when the server refused the group's first
 * statement for its data (`cause`, the server's error).
 */
export class RunAlone extends Error {
  constructor(cause?: unknown) {
    super('these calls go one statement at a time', cause === undefined ? undefined : { cause });
    this.name = 'RunAlone';
  }
}

/**
 * A group's first statement: refused by the server for one element's data
 * (SQLSTATE class 22, a data exception such as "\u0000" in jsonb; 23, an
 * integrity constraint; 54, a program limit such as a value too large), it
 * rolled back whole and nothing was committed, so the calls may go again
 * one at a time (`RunAlone`). Only here: after a statement has committed,
 * any fault (a row the client cannot read, a bug) must not make the group
 * send its calls again, or a complete or a claim would be made twice.
 */
export async function firstStatement<T>(send: () => Promise<T>): Promise<T> {
  try {
    return await send();
  } catch (err) {
    const code = (err as { code?: unknown } | null)?.code;
    if (typeof code === 'string' && /^(22|23|54)/.test(code)) throw new RunAlone(err);
    throw err;
  }
}

/** What a caller is told of a failure: the server's own error for a data fault. */
function unwrap(err: unknown): unknown {
  return err instanceof RunAlone && err.cause !== undefined ? err.cause : err;
}

/** The most calls one grouped statement serves. */
export const MAX_GROUP = 100;

export class StatementGroup<I, O> {
  readonly #run: (inputs: I[]) => Promise<O[]>;
  readonly #max: number;
  readonly #onIdle: (() => void) | undefined;
  readonly #rejoins: ((input: I) => boolean) | undefined;
  #queue: { input: I; resolve: (o: O) => void; reject: (e: unknown) => void }[] = [];
  #running = false;

  /**
   * `run` answers one output per input, in order. `rejoins`: whether the
   * caller of an input is likely to call this group again as soon as it is
   * answered (see #drain).
   */
  constructor(run: (inputs: I[]) => Promise<O[]>, max: number, onIdle?: () => void, rejoins?: (input: I) => boolean) {
    this.#run = run;
    this.#max = max;
    this.#onIdle = onIdle;
    this.#rejoins = rejoins;
  }

  submit(input: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      this.#queue.push({ input, resolve, reject });
      if (!this.#running) void this.#drain();
    });
  }

  async #drain(): Promise<void> {
    this.#running = true;
    while (this.#queue.length > 0) {
      const group = this.#queue.splice(0, this.#max);
      try {
        const outputs = await this.#run(group.map((g) => g.input));
        group.forEach((g, i) => g.resolve(outputs[i] as O));
      } catch (err) {
        if (group.length > 1 && err instanceof RunAlone) {
          for (const g of group) {
            try {
              g.resolve((await this.#run([g.input]))[0] as O);
            } catch (alone) {
              g.reject(unwrap(alone));
            }
          }
        } else {
          for (const g of group) g.reject(unwrap(err));
        }
      }
      // Callers that call this group again once answered (a worker slot
      // whose complete claimed its next job, and whose job is quick) do so
      // in microtasks: let them run before the next statement leaves, so
      // they join it instead of waiting for the one after. Without this,
      // at 16 busy slots half of them sat out every other statement
      // (docs/bench-lease.md). Only in such a group: where the callers go
      // on to another group (claim, then complete), the pause made no
      // statement larger, and 10–15% more statements per job.
      const rejoins = this.#rejoins;
      if (rejoins && group.some((g) => rejoins(g.input))) await new Promise<void>((resolve) => process.nextTick(resolve));
    }
    this.#running = false;
    this.#onIdle?.();
  }
}
