/**
 * The schedule of a store write that must land once the store is back (the
 * finish, src/http/pipeline/settle.ts; the release of an admission whose answer was
 * lost, ./postgres/release.ts): attempts for as long as the record's lock
 * lives, but at least MIN_RETRY_MS, spaced by these steps (the last one
 * repeats), each jittered within [half, all] so that the callers of one
 * failed group or outage do not all come back in the same turn and regroup.
 * Why 1.25 s at least: see src/http/pipeline/settle.ts.
 */
export const RETRY_STEPS_MS = [50, 200, 500, 1000] as const;
export const MIN_RETRY_MS = 1_250;

/** The wait before attempt `attempt + 1`, at most `left` ms. */
export function retryDelayMs(attempt: number, left: number): number {
  const step = RETRY_STEPS_MS[Math.min(attempt, RETRY_STEPS_MS.length - 1)]!;
  return Math.min(step * (0.5 + Math.random() / 2), left);
}
