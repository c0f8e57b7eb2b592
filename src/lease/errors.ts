/**
 * Errors of `fencegate/lease`. Expected store outcomes (a lost lease) are
 * discriminated results, not exceptions; these classes are for faults and for
 * the places where a `fetch`-shaped API has no other way to say "not done":
 * `fencedFetch` and `step` throw them, and the runner recognises them.
 */

export type LeaseErrorCode =
  | 'invalid_config'
  | 'invalid_input'
  | 'lease_lost'
  | 'ownership_unknown'
  | 'outcome_unknown'
  | 'stage_timeout'
  | 'worker_stopping'
  | 'heartbeat_thread'
  | 'store_identity';

export class LeaseError extends Error {
  override name = 'LeaseError';
  readonly code: LeaseErrorCode;
  constructor(code: LeaseErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
  }
}

/** A `LeaseError` of one fixed name and code. */
type LeaseErrorClass = new (message: string, options?: { cause?: unknown }) => LeaseError;

/**
 * The base of each error below: a `LeaseError` with a fixed name and code,
 * so each is one line and `instanceof` works for both it and `LeaseError`.
 * Typed as a LeaseError constructor so that the declarations say so too.
 */
function leaseErrorOf(name: string, code: LeaseErrorCode): LeaseErrorClass {
  return class extends LeaseError {
    override name = name;
    constructor(message: string, options?: { cause?: unknown }) {
      super(code, message, options);
    }
  };
}

/** Start-up options that cannot work (e.g. `leaseMs ≤ missed × heartbeat + jitter`). */
export class LeaseConfigError extends leaseErrorOf('LeaseConfigError', 'invalid_config') {}

/**
 * The job is no longer ours: a heartbeat or a commit matched zero rows, the
 * gateway answered `stale-fence`, or the lease ran out unconfirmed. Nothing
 * more may be done for the job; its result will not be stored.
 */
export class LeaseLostError extends leaseErrorOf('LeaseLostError', 'lease_lost') {}

/**
 * The lease could not be confirmed for long enough (the database is
 * unreachable, or the last confirmation is too old): no new external action
 * may start until a heartbeat succeeds again.
 */
export class OwnershipUnknownError extends leaseErrorOf('OwnershipUnknownError', 'ownership_unknown') {}

/**
 * A tool call timed out or its connection broke after it was sent: it may
 * have happened. Retrying is safe only with the same idempotency key, which
 * `fencedFetch` guarantees (the key is per job and step, not per attempt).
 */
export class OutcomeUnknownError extends leaseErrorOf('OutcomeUnknownError', 'outcome_unknown') {}

/**
 * Thrown by a handler to fail the attempt with a chosen code. `retryable:
 * false` (validation errors, refused business rules) ends the job at once.
 *
 * @example
 * throw new JobError('invalid_amount', 'amount must be positive', { retryable: false });
 */
export class JobError extends Error {
  override name = 'JobError';
  readonly code: string;
  readonly retryable: boolean;
  constructor(code: string, message: string, options: { retryable?: boolean; cause?: unknown } = {}) {
    super(message, { cause: options.cause });
    this.code = code;
    this.retryable = options.retryable ?? true;
  }
}
