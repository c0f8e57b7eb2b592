/**
 * One element's answer from a grouped round trip: its value, or the fault
 * that failed it alone; or `alone`: the group did not decide it (nothing of
 * it committed), it goes again by itself through `one` once the group has
 * returned (the admission, ./admit.ts; the finish never answers so).
 */
export type Settled<O> = { ok: true; value: O } | { ok: false; error: Error } | { alone: true };

/** How a group goes to the database: one element alone, or several in one statement. */
export interface GroupSender<I, O> {
  /** One element, one statement; a fault rejects. */
  one(input: I): Promise<O>;
  /** Several in ONE statement and one transaction, each settled on its own; the promise rejects only when the statement as a whole failed. */
  many(inputs: I[]): Promise<Settled<O>[]>;
}

/** How big a group may grow, and what to do when one fails before it was sent. */
export interface GroupLimits<I> {
  /** Elements per group (64: see below). */
  maxGroup?: number;
  /** An element's weight (for the finish: its body's bytes); 0 when not given. */
  weigh?: (input: I) => number;
  /** A group's total weight; an element that would take it past this waits for the next round trip. */
  maxWeight?: number;
  /** An element heavier than this always goes alone, through `one`. */
  aloneAbove?: number;
  /**
   * True when a group's failure as a whole happened before its statement
   * went out (the driver could not serialise it): nothing of it reached the
   * database, so its elements may go again, one by one. A connection or
   * server error is never such a failure: the group may have committed.
   */
  unsent?: (err: unknown) => boolean;
  /**
   * For elements a group answered `alone`: the names (an entity, a key) an
   * element shares with others. Those run alone one after the other in
   * arrival order, each once the previous one with a common name was
   * answered; the others at once. None when not given.
   */
  chain?: (input: I) => string[];
}

interface Pending<I, O> {
  input: I;
  resolve: (value: O) => void;
  reject: (err: unknown) => void;
}

/**
 * Group commit for one kind of PostgreSQL statement (the finish, the
 * admission: DESIGN §8.2):
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
 * A group is bounded by count (`maxGroup`) so that one statement stays short
 * and, on PostgreSQL, its subtransactions fit the backend's subxid cache
 * (64); and by weight (`maxWeight`, `aloneAbove`) so that its parameters stay
 * far below what the driver can build: a group's array parameter becomes one
 * text literal, and a few large elements in one would pass V8's longest
 * string and fail every element of the group, again on each retry.
 * Elements leave in arrival order.
 */
export class RoundTripGroup<I, O> {
  private queue: Pending<I, O>[] = [];
  private busy = false;
  private idleWaiters: (() => void)[] = [];
  private readonly maxGroup: number;
  private readonly weigh: (input: I) => number;
  private readonly maxWeight: number;
  private readonly aloneAbove: number;
  private readonly unsent: (err: unknown) => boolean;
  private readonly chain: (input: I) => string[];
  /** The last `alone` run per name (./admit.ts), and how many such runs are out. */
  private readonly chains = new Map<string, Promise<void>>();
  private aloneOut = 0;
  /**
   * Round trips made, elements sent, how many of them went in a group of
   * more than one, the largest group, how many elements went again one by
   * one after their group failed before it was sent, and how many went
   * again alone because their group answered `alone` (or were held back
   * from a group behind such an element of their entity or key): for tests
   * and metrics.
   */
  readonly stats = { roundTrips: 0, elements: 0, grouped: 0, largest: 0, rerunAlone: 0, deferred: 0 };

  constructor(
    private readonly sender: GroupSender<I, O>,
    limits: GroupLimits<I> = {},
  ) {
    this.maxGroup = limits.maxGroup ?? 64;
    this.weigh = limits.weigh ?? (() => 0);
    this.maxWeight = limits.maxWeight ?? Infinity;
    this.aloneAbove = limits.aloneAbove ?? Infinity;
    this.unsent = limits.unsent ?? (() => false);
    this.chain = limits.chain ?? (() => []);
  }

  run(input: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      this.queue.push({ input, resolve, reject });
      if (!this.busy) {
        // One turn of the event loop first, as the SQLite group does: the
        // calls of this turn leave together.
        this.busy = true;
        setImmediate(() => void this.next());
      }
    });
  }

  /** Resolves once every call made so far has been answered (those that went again `alone` too). */
  idle(): Promise<void> {
    if (!this.busy && this.aloneOut === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private wakeIfIdle(): void {
    if (!this.busy && this.aloneOut === 0) for (const wake of this.idleWaiters.splice(0)) wake();
  }

  private async next(): Promise<void> {
    const items = this.take();
    if (items.length === 0) {
      this.busy = false;
      this.wakeIfIdle();
      return;
    }
    try {
      if (items.length === 1) await this.alone(items[0]!);
      else await this.together(items);
    } finally {
      void this.next();
    }
  }

  /** The next group: the queue's head, and those after it while they fit. */
  private take(): Pending<I, O>[] {
    // An element that shares a name (entity, key) with one still waiting to
    // run alone goes behind it, not into this group: order per name holds
    // across groups, not only within one.
    if (this.chains.size > 0) {
      const rest: Pending<I, O>[] = [];
      for (const p of this.queue) {
        if (this.chain(p.input).some((n) => this.chains.has(n))) this.again(p, false);
        else rest.push(p);
      }
      this.queue = rest;
    }
    if (this.queue.length === 0) return [];
    let weight = this.weigh(this.queue[0]!.input);
    let n = 1;
    if (weight <= this.aloneAbove) {
      for (; n < this.queue.length && n < this.maxGroup; n++) {
        const w = this.weigh(this.queue[n]!.input);
        if (w > this.aloneAbove || weight + w > this.maxWeight) break;
        weight += w;
      }
    }
    return this.queue.splice(0, n);
  }

  /**
   * Told, after each statement that returned, how many of its elements it
   * decided and committed (not those it left to run alone, nor those that
   * failed alone), for the group-size metric.
   */
  observer: ((size: number) => void) | null = null;

  private committed(n: number): void {
    if (n > 0) this.observer?.(n);
  }

  private count(n: number): void {
    this.stats.roundTrips++;
    this.stats.elements += n;
    this.stats.largest = Math.max(this.stats.largest, n);
  }

  private alone(p: Pending<I, O>): Promise<void> {
    this.count(1);
    return this.sender.one(p.input).then((value) => {
      this.committed(1);
      p.resolve(value);
    }, p.reject);
  }

  private async together(items: Pending<I, O>[]): Promise<void> {
    this.count(items.length);
    this.stats.grouped += items.length;
    let settled: Settled<O>[];
    try {
      settled = await this.sender.many(items.map((p) => p.input));
    } catch (err) {
      if (this.unsent(err)) {
        // Nothing went out: each element goes again alone, one round trip
        // at a time, so that one that cannot be sent fails only itself.
        this.stats.rerunAlone += items.length;
        for (const p of items) await this.alone(p);
        return;
      }
      // The statement failed as a whole (connection lost, the database
      // stopped): nothing of the group committed, every caller hears it.
      for (const p of items) p.reject(err);
      return;
    }
    let decided = 0;
    items.forEach((p, i) => {
      const s = settled[i] ?? { ok: false, error: new Error('the grouped statement returned fewer rows than it was sent') };
      if ('alone' in s) this.again(p, true);
      else if (s.ok) {
        decided++;
        p.resolve(s.value);
      } else p.reject(s.error);
    });
    this.committed(decided);
  }

  /**
   * An element its group did not decide: alone, after the group returned
   * (so after its COMMIT), behind the earlier ones of its names. Not awaited
   * by the next group: such an element is one that met another session's
   * row lock, and may wait for it as long as a lone call would. `counted`:
   * its group counted it among its elements already (false for one held
   * back from a group, behind an earlier one of its names).
   */
  private again(p: Pending<I, O>, counted: boolean): void {
    this.stats.deferred++;
    this.aloneOut++;
    const names = this.chain(p.input);
    const before = names.map((n) => this.chains.get(n)).filter((b) => b !== undefined);
    const done: Promise<void> = Promise.all(before)
      .then(() => {
        this.count(1);
        if (counted) this.stats.elements--; // once is enough
        return this.sender.one(p.input);
      })
      .then((value) => {
        this.committed(1);
        p.resolve(value);
      }, p.reject)
      .finally(() => {
        for (const n of names) if (this.chains.get(n) === done) this.chains.delete(n);
        this.aloneOut--;
        this.wakeIfIdle();
      });
    for (const n of names) this.chains.set(n, done);
  }
}
