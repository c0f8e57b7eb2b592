/**
 * An attempt's abort signal, made on first use: a handler that never reads
 * `signal` (and never starts a fenced action) costs no AbortController, the
 * largest allocation the runner made per job (docs/bench-lease.md). The
 * first reason wins, as with AbortController; a signal made after the abort
 * is made aborted, with that reason.
 */
import type { Attempt } from './attempt-types.js';

export function signalOf(a: Attempt): AbortSignal {
  if (a.controller === undefined) {
    a.controller = new AbortController();
    if (a.aborted) a.controller.abort(a.abortReason);
  }
  return a.controller.signal;
}

export function abortAttempt(a: Attempt, reason: unknown): void {
  if (a.aborted) return;
  a.aborted = true;
  a.abortReason = reason;
  a.controller?.abort(reason);
}
