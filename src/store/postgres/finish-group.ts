/** One element's answer from a grouped round trip: its value, or the fault that failed it alone. */
export type Settled<O> = { ok: true; value: O } | { ok: false; error: Error };

/** How a group goes to the database: one element alone, or several in one statement. */
export interface GroupSender<I, O> {
  /** One element, one statement; a fault rejects. */
  one(input: I): Promise<O>;
  /** Several in ONE statement and one transaction, each settled on its own; the promise rejects only when the statement as a whole failed. */
  many(inputs: I[]): Promise<Settled<O>[]>;
}

interface Pending<I, O> {
  input: I;
  resolve: (value: O) => void;
  reject: (err: unknown) => void;
}

/**
 * Group commit for one kind of PostgreSQL statement (the finish, DESIGN §8):
 * at most one round trip in flight; the calls that arrive in the same
 * event-loop turn, or while that round trip is out, go to the database
 * together as the next one, in one statement and so one transaction and one
 * WAL flush. Every caller is answered after that statement returned, i.e.
 * after its COMMIT. A lone call takes the plain one-element statement.
 *
 * Why one in flight: the database does the work of a group in about the
 * time of one element (a commit is the WAL flush, not the SQL), so the load
 * makes the groups, not more connections; and two groups never hold each
 * other's rows (no deadlock between finishes of one gateway).
 *
 * A group is bounded (`maxGroup`) so that one statement stays short and, on
 * PostgreSQL, its subtransactions fit the backend's subxid cache (64).
 */
export class RoundTripGroup<I, O> {
  private queue: Pending<I, O>[] = [];
  private busy = false;
  private idleWaiters: (() => void)[] = [];
  /** Round trips made, elements sent, and how many of them went in a group of more than one: for tests and metrics. */
  readonly stats = { roundTrips: 0, elements: 0, grouped: 0, largest: 0 };

  constructor(
    private readonly sender: GroupSender<I, O>,
    private readonly maxGroup = 64,
  ) {}

  run(input: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      this.queue.push({ input, resolve, reject });
      if (!this.busy) {
        // One turn of the event loop first, as the SQLite group does: the
        // calls of this turn leave together.
        this.busy = true;
        setImmediate(() => this.next());
      }
    });
  }

  /** Resolves once every call made so far has been answered. */
  idle(): Promise<void> {
    if (!this.busy) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private next(): void {
    const items = this.queue.splice(0, this.maxGroup);
    if (items.length === 0) {
      this.busy = false;
      for (const wake of this.idleWaiters.splice(0)) wake();
      return;
    }
    this.stats.roundTrips++;
    this.stats.elements += items.length;
    this.stats.largest = Math.max(this.stats.largest, items.length);
    const sent =
      items.length === 1
        ? this.sender.one(items[0]!.input).then(
            (value): Settled<O>[] => [{ ok: true, value }],
            (error: Error): Settled<O>[] => [{ ok: false, error }],
          )
        : ((this.stats.grouped += items.length), this.sender.many(items.map((p) => p.input)));
    sent
      .then(
        (settled) => items.forEach((p, i) => settle(p, settled[i] ?? { ok: false, error: new Error('the grouped statement returned fewer rows than it was sent') })),
        // The statement failed as a whole (connection lost, the database
        // stopped): nothing of the group committed, every caller hears it.
        (err) => items.forEach((p) => p.reject(err)),
      )
      .finally(() => this.next());
  }
}

function settle<I, O>(p: Pending<I, O>, s: Settled<O>): void {
  if (s.ok) p.resolve(s.value);
  else p.reject(s.error);
}
