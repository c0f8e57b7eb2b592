/**
 * The types of one admission and one finish (DESIGN §3.5, §3.7): what the
 * gateway asks, what the store answers. They belong to the pure rules
 * (./admission.ts), which import nothing from `src/store/`; the storage
 * contract (../store/types.ts) re-exports them for its importers.
 */

export type Mode = 'serial' | 'concurrent';
export type UnknownPolicy = 'reject' | 'retry';
export type RecordState = 'in_progress' | 'completed' | 'outcome_unknown';

/** What the rejection log keeps of a request: ids, tokens and hashes, never bodies. */
export interface AuditInfo {
  /** The gateway's own id for the request (a fresh UUID): the id every row of it is filed under. */
  requestId: string;
  /**
   * The caller's `X-Request-Id`, when it sent a well-formed one; null
   * otherwise. Kept beside `requestId`, never instead of it: a caller must not
   * choose the id its refusal is filed under (it could name another
   * request's id).
   */
  clientRequestId: string | null;
  caller: string | null;
  method: string;
  /** Path and query as received. */
  path: string;
  /** sha256 (hex) of the request body. */
  payloadSha256: string;
  /**
   * The MCP tool a `tools/call` names (DESIGN §4: `rejections.tool`); absent
   * or null for a plain HTTP route.
   */
  tool?: string | null;
}

/** A response kept for replay: status, allow-listed headers, exact body bytes. */
export interface StoredResponse {
  status: number;
  headers: [name: string, value: string][];
  body: Uint8Array;
}

export interface AdmitInput {
  /** Idempotency scope: the route name (and the caller once auth is on). */
  scope: string;
  /** The Idempotency-Key, or null when the route allows requests without one. */
  key: string | null;
  /** The fence entity, or null when none applies (then no fence and no serial slot). */
  entity: string | null;
  /** The presented fence, or null when the route allows requests without one. */
  fence: bigint | null;
  /** sha256(method, path?query, content-type, body), hex. */
  fingerprint: string;
  mode: Mode;
  /** Owner token for this attempt; the finish must present it (DESIGN §3.7). */
  ownerToken: string;
  /** How long the owner holds the record and the serial slot: upstream timeout + margin. */
  lockMs: number;
  /** How long a completed record is kept for replay. */
  retentionMs: number;
  onUnknown: UnknownPolicy;
  audit: AuditInfo;
}

/**
 * The admission decision (DESIGN §3.5, steps a–h). Every refusal that matters
 * to an auditor has already been written to the rejection log in the same
 * transaction when this resolves.
 */
export type Admission =
  /** Forward upstream; `takeover` when an `outcome_unknown` record was taken over (onUnknown: retry). */
  | { outcome: 'forward'; takeover: boolean }
  | { outcome: 'stale-fence'; currentFence: bigint }
  | { outcome: 'replay'; response: StoredResponse }
  | { outcome: 'idempotency-key-reused' }
  | { outcome: 'idempotency-in-progress'; retryAfterMs: number }
  | { outcome: 'outcome-unknown' }
  | { outcome: 'entity-busy'; retryAfterMs: number };

interface FinishBase {
  scope: string;
  key: string | null;
  entity: string | null;
  ownerToken: string;
  audit: AuditInfo;
}

export type FinishInput = FinishBase &
  (
    | { outcome: 'completed'; response: StoredResponse; retentionMs: number }
    /** Never reached the upstream (or it said "not processed"): the record is deleted, safe to retry. */
    | { outcome: 'released' }
    /** May have reached the upstream: the record becomes `outcome_unknown`. */
    | { outcome: 'unknown' }
  );

/** `recorded: false`: the record was taken over by a newer owner; the late finish was logged and discarded. */
export interface FinishResult {
  recorded: boolean;
}
