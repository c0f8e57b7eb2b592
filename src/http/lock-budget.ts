/**
 * How long an admitted request may still spend before and at the upstream
 * (DESIGN §3.5 b and h, §3.6).
 *
 * The admission gives the request a record lock and, in serial mode, the
 * entity's slot, both `lockMs` long on the database clock. When they expire,
 * another replica (or this one) may admit a higher fence for the entity, or
 * mark the key outcome_unknown and take it over, and forward. A request that
 * was admitted and then delayed past its lock (a paused process, a GC or VM
 * pause, a database reply held in the network, a blocked event loop) must
 * therefore never be sent: it would reach the upstream after a newer owner,
 * which is exactly the stale write fencing exists to stop (G1, G3).
 *
 * The budget is measured on this process's monotonic clock from just BEFORE
 * the admission was sent. The database computes the lock's end after it got
 * the admission, so `sentAt + lockMs` is never later than the end the
 * database wrote, whatever the round trip or the pause took. A small margin
 * is kept off the end for the step from the last check to the first byte on
 * the wire and for the two clocks' rates.
 *
 * What no proxy can close: a pause that falls between the last check (the
 * forwarder's, just before it writes the request) and the bytes leaving. An
 * upstream that checks `X-Execution-Fence` itself closes that window.
 */
export interface ForwardBudget {
  /** The upstream deadline: the route's timeout, or less when the lock ends sooner. */
  timeoutMs: number;
  /** `performance.now()` after which the request must not start (the forwarder checks it before the first byte). */
  startBy: number;
}

/**
 * Margin kept off the lock's end: half the route's `lockMarginMs`, at most
 * 250 ms, and never under 25 ms (a route with no margin still keeps one for
 * the step to the wire and the undici forwarder's two loop turns of grace).
 */
export function lockSafetyMs(lockMarginMs: number): number {
  return Math.max(25, Math.min(250, lockMarginMs / 2));
}

/**
 * null: less than half the route's timeout is left of the lock; the caller
 * must release the record instead of forwarding. A request sent with a few
 * milliseconds of deadline would mostly end in a timeout after it reached
 * the upstream, an outcome_unknown for an operator, where refusing it now is
 * safe to retry. Otherwise the deadline is the route's, or what is left when
 * that is less.
 */
export function forwardBudget(o: { sentAt: number; lockMs: number; safetyMs: number; routeTimeoutMs: number; now: number }): ForwardBudget | null {
  const startBy = o.sentAt + o.lockMs - o.safetyMs;
  const left = startBy - o.now;
  if (left < Math.max(1, o.routeTimeoutMs / 2)) return null;
  return { timeoutMs: Math.min(o.routeTimeoutMs, Math.floor(left)), startBy };
}

/**
 * A long call's pause check (DESIGN §3.6 "Long calls"): the lock is the
 * route's `lockWindow`, renewed while the call runs, so the deadline is the
 * route's whole `timeoutMs` and the check is against the lock as last
 * extended (`lockEnds`, measured as the admission's is). Null: less than half
 * the window is left before the margin, nothing may be sent (the renewal
 * that keeps it alive might not land in time).
 */
export function longCallBudget(o: { lockEnds: number; windowMs: number; safetyMs: number; routeTimeoutMs: number; now: number }): ForwardBudget | null {
  const startBy = o.lockEnds - o.safetyMs;
  if (startBy - o.now < Math.max(1, o.windowMs / 2)) return null;
  return { timeoutMs: o.routeTimeoutMs, startBy };
}
