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
  /**
   * The record's outcome is unknown (DESIGN §3.5 f, g). `interim`: the interim
   * answer the record keeps (a finish `unknown` with `interim`, DESIGN §3.7,
   * e.g. a 202 Accepted with its Location, or an MCP CreateTaskResult whose
   * task still runs), while its time lasts: a codec may replay it.
   */
  | { outcome: 'outcome-unknown'; interim?: StoredResponse }
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
    /**
     * May have reached the upstream: the record becomes `outcome_unknown`.
     * `interim`: an answer that is not the outcome yet (a 202 Accepted with a
     * Location from an async upstream, an MCP CreateTaskResult whose task
     * still runs), kept in the record's response columns while the state
     * stays `outcome_unknown`; every retry's admission answers
     * `outcome-unknown` carrying it, until database now reaches the record's
     * `expires_at`: now + `interimRetentionMs` when given, else the retention
     * the admission set (now + `retentionMs`). Without `interim` the record
     * keeps no answer (one kept before is dropped). An operator's or the
     * reconciler's `completed` replaces it with the final answer; `released`
     * deletes the record.
     */
    | { outcome: 'unknown'; interim?: StoredResponse; interimRetentionMs?: number }
  );

/**
 * DESIGN §3.6: keeps a live attempt's lock (and its serial slot) for `ms`
 * more, measured by the database clock (G6): while a long upstream call
 * still holds the connection, or an MCP task runs.
 */
export interface ExtendLockInput {
  scope: string;
  /** The record's key; null for a keyless request (then only its slot is extended). */
  key: string | null;
  /** The request's entity: its serial slot, when this owner holds it live, is extended with the record. Omitted or null: no slot. */
  entity?: string | null;
  /** The admission's owner token (`AdmitInput.ownerToken`, `FinishBase.ownerToken`). */
  owner: string;
  /** The lock ends at greatest(its current end, database now + `ms`): never shorter than it was. */
  ms: number;
}

/** `recorded: false`: the record was taken over by a newer owner; the late finish was logged and discarded. */
export interface FinishResult {
  recorded: boolean;
}
