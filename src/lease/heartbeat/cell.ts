/**
 * Memory shared between the handler's thread and the heartbeat thread.
 *
 * Why shared memory and not only messages: when the handler's thread wakes
 * up from a stall, the heartbeat thread's messages are still queued behind
 * it, but a `fencedFetch` about to start must know *now* whether the lease is
 * still confirmed. Both sides read and write these cells with `Atomics`.
 */

export const LeaseStatus = {
  /** Heartbeats succeed. */
  Ok: 0,
  /** Heartbeats fail (database unreachable): no new external action, keep trying. */
  Unknown: 1,
  /** Gone: zero rows, stale fence, or not confirmed before the conservative deadline. */
  Lost: 2,
  /** The handler's thread stopped ticking past the allowed stall: heartbeats stopped. */
  Stalled: 3,
  /** The handler finished (or the attempt ended): heartbeats stopped on purpose. */
  Released: 4,
} as const;
export type LeaseStatus = (typeof LeaseStatus)[keyof typeof LeaseStatus];

/** Why a lease ended in Lost or Stalled. */
export type LossCause = 'zero_rows' | 'unconfirmed' | 'stalled' | 'stale_fence' | 'thread_exit';
const CAUSES: readonly LossCause[] = ['zero_rows', 'unconfirmed', 'stalled', 'stale_fence', 'thread_exit'];

/** The bytes of one cell: confirmed-until (int64), status (int32), cause (int32). */
export const CELL_BYTES = 16;

/** One pair of whole-buffer views per buffer: a slab's cells share them instead of three views each. */
const VIEWS = new WeakMap<SharedArrayBuffer, { i64: BigInt64Array; i32: Int32Array }>();
function viewsOf(buffer: SharedArrayBuffer): { i64: BigInt64Array; i32: Int32Array } {
  let views = VIEWS.get(buffer);
  if (views === undefined) {
    views = { i64: new BigInt64Array(buffer, 0, buffer.byteLength >> 3), i32: new Int32Array(buffer, 0, buffer.byteLength >> 2) };
    VIEWS.set(buffer, views);
  }
  return views;
}

/**
 * One lease's shared state: until when (monotonic ms) the database has
 * confirmed it, its status, and why it was lost. Its own 16 bytes, never
 * reused, so a late write for an old lease can never land on a new one:
 * either a fresh buffer, or a slot of a lease slab (./slab.ts), which hands
 * out each slot once.
 */
export class LeaseCell {
  readonly buffer: SharedArrayBuffer;
  readonly byteOffset: number;
  readonly #i64: BigInt64Array;
  readonly #i32: Int32Array;
  /** Indexes of until (in #i64), status and cause (in #i32). */
  readonly #until: number;
  readonly #status: number;
  readonly #cause: number;

  /** `byteOffset`: a multiple of 8 within `buffer` (a slab's slot). */
  constructor(buffer: SharedArrayBuffer = new SharedArrayBuffer(CELL_BYTES), byteOffset = 0) {
    this.buffer = buffer;
    this.byteOffset = byteOffset;
    const views = viewsOf(buffer);
    this.#i64 = views.i64;
    this.#i32 = views.i32;
    this.#until = byteOffset / 8;
    this.#status = byteOffset / 4 + 2;
    this.#cause = byteOffset / 4 + 3;
  }

  get confirmedUntil(): number {
    return Number(Atomics.load(this.#i64, this.#until));
  }

  set confirmedUntil(ms: number) {
    Atomics.store(this.#i64, this.#until, BigInt(Math.floor(ms)));
  }

  get status(): LeaseStatus {
    return Atomics.load(this.#i32, this.#status) as LeaseStatus;
  }

  /** Moves from `from` to `to` only if nobody changed the status meanwhile. */
  transition(from: LeaseStatus, to: LeaseStatus): boolean {
    return Atomics.compareExchange(this.#i32, this.#status, from, to) === from;
  }

  /** Why it was lost (set with the Lost or Stalled status), or undefined. */
  get cause(): LossCause | undefined {
    return CAUSES[Atomics.load(this.#i32, this.#cause) - 1];
  }

  /**
   * Ends the cell unless it already ended; returns whether this call did.
   * The cause is written first (first writer wins), so whoever sees the
   * Lost status also sees why.
   */
  end(to: typeof LeaseStatus.Released): boolean;
  end(to: typeof LeaseStatus.Lost | typeof LeaseStatus.Stalled, cause: LossCause): boolean;
  end(to: LeaseStatus, cause?: LossCause): boolean {
    if (cause !== undefined) Atomics.compareExchange(this.#i32, this.#cause, 0, CAUSES.indexOf(cause) + 1);
    return this.transition(LeaseStatus.Ok, to) || this.transition(LeaseStatus.Unknown, to);
  }
}

/**
 * The handler thread's pulse: a counter it bumps on a timer. If the counter
 * stops moving, the thread's event loop is blocked (a tight loop, a stuck
 * native call) and the heartbeat thread stops extending its leases.
 */
export class Pulse {
  readonly buffer: SharedArrayBuffer;
  readonly #count: Int32Array;

  constructor(buffer: SharedArrayBuffer = new SharedArrayBuffer(4)) {
    this.buffer = buffer;
    this.#count = new Int32Array(buffer, 0, 1);
  }

  tick(): void {
    Atomics.add(this.#count, 0, 1);
  }

  read(): number {
    return Atomics.load(this.#count, 0);
  }
}
