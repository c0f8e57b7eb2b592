/**
 * Every refusal fencegate can answer, in one table: its HTTP status, its
 * title, and whether a retry of the same request can ever succeed. Error
 * shapes (problem+json, Stripe-style, …) are renderings of this table.
 */
export const ERROR_CODES = {
  'no-route': { status: 404, title: 'No route matches this request', retryable: false },
  unauthorized: { status: 401, title: 'Authentication required', retryable: false },
  forbidden: { status: 403, title: 'Not allowed', retryable: false },
  'tool-denied': { status: 403, title: 'Tool not allowed on this route', retryable: false },
  'invalid-fence': { status: 400, title: 'Invalid execution fence', retryable: false },
  'missing-fence': { status: 400, title: 'Missing execution fence', retryable: false },
  'invalid-fence-signature': { status: 401, title: 'Invalid fence signature', retryable: false },
  'fence-expired': { status: 409, title: 'Fence expired', retryable: false },
  'invalid-idempotency-key': { status: 400, title: 'Invalid idempotency key', retryable: false },
  'missing-idempotency-key': { status: 400, title: 'Missing idempotency key', retryable: false },
  'missing-entity': { status: 400, title: 'Missing fence entity', retryable: false },
  'invalid-entity': { status: 400, title: 'Invalid fence entity', retryable: false },
  'invalid-request': { status: 400, title: 'Invalid request', retryable: false },
  'payload-too-large': { status: 413, title: 'Payload too large', retryable: false },
  'headers-too-large': { status: 431, title: 'Request header fields too large', retryable: false },
  'stale-fence': { status: 409, title: 'Stale execution fence', retryable: false },
  'idempotency-key-reused': { status: 422, title: 'Idempotency key reused with a different request', retryable: false },
  'idempotency-in-progress': { status: 409, title: 'A request with this idempotency key is in progress', retryable: true },
  'outcome-unknown': { status: 409, title: 'Outcome of an earlier attempt is unknown', retryable: false },
  'entity-busy': { status: 409, title: 'Another request for this entity is in flight', retryable: true },
  'upstream-unavailable': { status: 502, title: 'Upstream unavailable', retryable: true },
  'upstream-timeout': { status: 504, title: 'Upstream timed out; outcome unknown', retryable: false },
  'upstream-response-too-large': { status: 502, title: 'Upstream answer too large; not kept', retryable: false },
  'store-unavailable': { status: 503, title: 'Gateway store unavailable', retryable: true },
  'admission-expired': { status: 503, title: 'Gateway delayed past its lock; nothing was sent', retryable: true },
  'not-found': { status: 404, title: 'Not found', retryable: false },
  'admin-disabled': { status: 404, title: 'Admin API disabled', retryable: false },
  'not-outcome-unknown': { status: 409, title: 'Only an outcome_unknown record can be resolved', retryable: false },
  'internal-error': { status: 500, title: 'Internal error', retryable: true },
} as const satisfies Record<string, { status: number; title: string; retryable: boolean }>;

export type ErrorCode = keyof typeof ERROR_CODES;
