/**
 * What a handler's error means for the job: the stored error code, and
 * whether another attempt may help (DESIGN §6).
 */
import { JobError, OutcomeUnknownError, OwnershipUnknownError } from '../errors.js';

/** Stored error messages are capped: a handler may throw anything, at any length. */
export const MAX_ERROR_MESSAGE = 1_000;

export interface Classified {
  code: string;
  retryable: boolean;
  message: string;
}

/** Maps a handler's error to the stored error code and whether a retry may help. */
export function classify(error: unknown): Classified {
  const message = (error instanceof Error ? error.message : String(error)).slice(0, MAX_ERROR_MESSAGE);
  if (error instanceof JobError) return { code: error.code, retryable: error.retryable, message };
  // Validation errors never get better by retrying.
  if (error instanceof Error && error.name === 'ZodError') return { code: 'invalid_payload', retryable: false, message };
  if (error instanceof OwnershipUnknownError) return { code: 'ownership_unknown', retryable: true, message };
  // Retried with the same step names, hence the same idempotency keys.
  if (error instanceof OutcomeUnknownError) return { code: 'outcome_unknown', retryable: true, message };
  return { code: 'handler_error', retryable: true, message };
}
