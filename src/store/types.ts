/**
 * The gateway's storage contract. Every backend (SQLite, PostgreSQL, D1)
 * implements this narrow, semantic interface; the gateway never sees SQL.
 *
 * Each method that decides something is ONE atomic step in the database
 * (one transaction, or one statement), and takes every expiry decision with
 * the database clock (DESIGN §2 G6). Expected outcomes are discriminated
 * results; exceptions mean a fault (the gateway answers 503 store-unavailable).
 */

import type {
  Admission,
  AdmitInput,
  AuditInfo,
  FinishInput as CoreFinishInput,
  ExtendLockInput,
  FinishResult,
  RecordState,
  StoredResponse,
} from '../core/admission-types.js';

// The types of one admission and one finish belong to the pure rules (../core/admission-types.ts).
export type {
  Admission,
  AdmitInput,
  AuditInfo,
  ExtendLockInput,
  FinishResult,
  Mode,
  RecordState,
  StoredResponse,
  UnknownPolicy,
} from '../core/admission-types.js';

/**
 * The finish of the pure rules, and the command-log row of its outcome
 * (DESIGN §4.1 `commands`): given, the store writes it in the finish's
 * transaction, so the outcome and its row exist together. The rules ignore it.
 */
export type FinishInput = CoreFinishInput & { command?: CommandInput };

/** Reasons written to the rejection log (DESIGN §2 G5), plus `late-finish`. */
export type RejectionReason =
  | 'stale-fence'
  | 'idempotency-key-reused'
  | 'outcome-unknown'
  | 'invalid-fence-signature'
  | 'fence-expired'
  | 'unauthorized'
  | 'forbidden'
  | 'late-finish'
  // The 400s of a malformed or missing fence, entity or key (DESIGN §3.11):
  // logged before any admission, with their bounded presented value in `detail`.
  | 'invalid-fence'
  | 'missing-fence'
  | 'invalid-entity'
  | 'missing-entity'
  | 'invalid-idempotency-key'
  | 'missing-idempotency-key'
  // An mcp route's tools/call of a tool its `toolAccess` does not allow, with the tool in `tool`.
  | 'tool-denied';

/**
 * Every reason, once (the CLI's `--reason`, the console's filter and
 * colours). A Record, so that a reason added to the type above fails to
 * compile here until it is listed.
 */
const REASONS: Record<RejectionReason, true> = {
  'stale-fence': true,
  'idempotency-key-reused': true,
  'outcome-unknown': true,
  'invalid-fence-signature': true,
  'fence-expired': true,
  unauthorized: true,
  forbidden: true,
  'late-finish': true,
  'invalid-fence': true,
  'missing-fence': true,
  'invalid-entity': true,
  'missing-entity': true,
  'invalid-idempotency-key': true,
  'missing-idempotency-key': true,
  'tool-denied': true,
};

export const REJECTION_REASONS = Object.keys(REASONS) as readonly RejectionReason[];

export interface RejectionInput {
  reason: RejectionReason;
  entity: string | null;
  presentedFence: bigint | null;
  currentFence: bigint | null;
  idempotencyKey: string | null;
  /**
   * `payloadSha256` is `''` when the refusal came before the body was read
   * (auth, step 2); stores write it as NULL.
   */
  audit: AuditInfo;
  /** Why, for auditors ("expired", "missing scope fencegate:proxy"); never a token or a body. */
  detail?: string | null;
}

export interface RejectionRow {
  id: string;
  at: Date;
  reason: string;
  entity: string | null;
  presentedFence: string | null;
  currentFence: string | null;
  idempotencyKey: string | null;
  caller: string | null;
  method: string | null;
  path: string | null;
  payloadSha256: string | null;
  requestId: string | null;
  /** The caller's `X-Request-Id` (see `AuditInfo.clientRequestId`); null when it sent none. */
  clientRequestId: string | null;
  /** The MCP tool of a refused `tools/call` (see `AuditInfo.tool`); null for a plain route. */
  tool: string | null;
  /** Why, for auditors (see `RejectionInput.detail`); absent on stores that predate it. */
  detail?: string | null;
}

export interface RejectionQuery {
  entity?: string;
  reason?: string;
  caller?: string;
  /** The MCP tool name (rows of plain routes, whose tool is null, never match). */
  tool?: string;
  since?: Date;
  until?: Date;
  /** 1…1000. */
  limit: number;
  /** Opaque keyset cursor from a previous page (`nextCursor`). */
  cursor?: string;
}

export interface RejectionPage {
  /** Newest first (by id, which follows commit order closely). */
  items: RejectionRow[];
  nextCursor: string | null;
}

export interface EntityInfo {
  entity: string;
  fence: string | null;
  acceptedAt: Date;
  /** The serial-mode slot, when a request holds it and it has not expired. */
  inflight: { until: Date } | null;
}

export interface RecordInfo {
  scope: string;
  key: string;
  state: RecordState;
  fingerprint: string;
  entity: string | null;
  fence: string | null;
  status: number | null;
  lockedUntil: Date | null;
  createdAt: Date;
  expiresAt: Date;
  /**
   * The lock end of the attempt last sent (admission, takeover, `extendLock`;
   * kept once the record left `in_progress`): what a reconciler's "not found"
   * is weighed against (DESIGN §3.12). Null for a record written before it was kept.
   */
  attemptUntil: Date | null;
  /** The gateway's request id of the attempt last sent (`{request_id}` of a reconcile path); null for a record written before it was kept. */
  requestId: string | null;
  /** The reconciler's last answer about this record that settled nothing, by the database clock (DESIGN §3.12); absent when none. */
  lastReconcile?: { result: ReconcileNote; at: Date };
  /**
   * An `outcome_unknown` record that carries an interim answer now (a finish
   * `unknown` with `interim`, DESIGN §3.7, before its `expiresAt`). Never
   * the answer itself here: `getInterim` reads it.
   */
  interim: boolean;
}

/** A status query's answer as the record keeps it (src/http/pipeline/reconcile.ts `ReconcileResult`). */
export type ReconcileNote = 'found' | 'not-found' | 'not-yet-trusted' | 'unknown' | 'error';

/** One attempt of a record, as `listRecords` / `getRecords` gave its `createdAt` (ms precision). */
export interface AttemptRef {
  scope: string;
  key: string;
  createdAt: Date;
}

export interface SweepOptions {
  /** Rejections older than this are deleted. */
  rejectionRetentionMs: number;
  /**
   * Entity rows whose last accepted fence is older than this, and that hold
   * no live serial slot, are deleted, and fence-history rows older than this.
   * Forgetting an entity's fence re-opens it to any holder of an older token:
   * see docs/configuration.md "Retention and the sweeper". Omitted: entities and their history are kept.
   */
  entityRetentionMs?: number;
  /** Operator-action rows older than this are deleted. Omitted: kept. */
  operatorActionRetentionMs?: number;
  /** Command-log rows (DESIGN §4.1 `commands`) older than this are deleted. Omitted: kept. */
  commandRetentionMs?: number;
  /** Rows per batch: one short write transaction each. Default 1000 (`SWEEP_BATCH`). */
  batch?: number;
  /**
   * Batches per kind of row in one sweep. Default: no limit, the sweep goes
   * on until a batch comes back short (or `timeBudgetMs` runs out).
   */
  maxBatches?: number;
  /**
   * Once this much time has passed the sweep starts no new batch (the one
   * running finishes). Every kind gets at least one batch, so a sweep always
   * makes progress. Default 10 000 ms (`SWEEP_TIME_BUDGET_MS`).
   */
  timeBudgetMs?: number;
}

/** What a sweep deletes (or, for `deadRecords`, marks outcome_unknown), one kind of row each. */
export const SWEEP_KINDS = [
  'expiredRecords',
  'unknownRecords',
  'oldRejections',
  'oldEntities',
  'oldFenceHistory',
  'oldOperatorActions',
  'oldCommands',
] as const;
export type SweepKind = (typeof SWEEP_KINDS)[number];

export interface SweepResult {
  expiredRecords: number;
  /** in_progress records whose lock expired (their gateway died), now outcome_unknown (G4). */
  unknownRecords: number;
  oldRejections: number;
  /** Entity rows forgotten (entityRetention). */
  oldEntities: number;
  oldFenceHistory: number;
  oldOperatorActions: number;
  /** Command-log rows deleted (`commandRetention`). */
  oldCommands: number;
  /**
   * Rows of each kind still past their retention when the sweep stopped:
   * 0 for a kind whose last batch came back short; counted (up to
   * `SWEEP_BACKLOG_CAP`) for a kind the time budget or `maxBatches` cut off.
   */
  backlog: Record<SweepKind, number>;
  /** Write transactions the sweep ran. */
  batches: number;
}

/** One accepted rise of an entity's fence (written in the admission transaction). */
export interface FenceHistoryRow {
  fence: string;
  at: Date;
  caller: string | null;
  requestId: string | null;
}

export interface FenceHistoryPage {
  /** Highest fence first. */
  items: FenceHistoryRow[];
  /** The lowest fence of this page, to pass as `before`; null on the last page. */
  nextCursor: string | null;
}

export interface RecordQuery {
  state: RecordState;
  /** 1…1000. */
  limit: number;
  /** Opaque keyset cursor from a previous page. */
  cursor?: string;
}

export interface RecordPage {
  /** Newest first (by created_at, then scope and key). */
  items: RecordInfo[];
  nextCursor: string | null;
}

/** How an operator settles an `outcome_unknown` record. */
export type Resolution =
  /** The upstream did perform it: store the response the operator confirmed, replayed to later retries. */
  | { outcome: 'completed'; response: StoredResponse; retentionMs: number }
  /**
   * It never happened upstream: delete the record, the next request with the key is forwarded.
   * `notBefore`: only once the database clock is at least `settleMs` past the
   * lock end of the attempt last sent (`attemptUntil`: its admission's or
   * takeover's lock, as `extendLock` moved it), decided in the same
   * conditional write; before that the answer is `too-early` and nothing
   * changes. A record written before the attempt's lock end was kept
   * (`attemptUntil` null) is weighed as before: `legacyBoundMs` past its
   * `created_at`. The reconciler passes the route's settle time (and its lock
   * plus settle time for the fallback), so that an upstream's "not found" is
   * trusted only when the attempt can no longer be in flight nor be still
   * landing (DESIGN §3.12). Omitted: at once (an operator's decision).
   */
  | { outcome: 'released'; notBefore?: { settleMs: number; legacyBoundMs: number } };

export interface ResolveInput {
  scope: string;
  key: string;
  resolution: Resolution;
  /** The operator's caller id (token `sub`), or null without auth. */
  operator: string | null;
  note: string | null;
  requestId: string;
  /**
   * The `createdAt` of the record the operator decided on (as `listRecords` /
   * `getRecords` returned it, ms precision). Given, only that attempt is
   * settled: a record of a later attempt with the same key (released, then
   * retried into outcome_unknown again) is refused with `changed`, never
   * released or overwritten in its place. Omitted: whichever record holds the key.
   */
  createdAt?: Date;
}

export interface OperatorAction {
  id: string;
  at: Date;
  action: 'resolve-completed' | 'resolve-released';
  scope: string;
  key: string;
  entity: string | null;
  fence: string | null;
  fingerprint: string | null;
  status: number | null;
  operator: string | null;
  note: string | null;
  requestId: string | null;
}

/**
 * One transaction: conditional on the record being `outcome_unknown` (a
 * record in progress, completed or gone is not the operator's to settle),
 * plus the operator-action row.
 */
export type ResolveResult =
  | { ok: true; action: OperatorAction }
  | { ok: false; reason: 'not-found' }
  | { ok: false; reason: 'not-outcome-unknown'; state: RecordState }
  /** Still outcome_unknown, but another attempt's record: its `createdAt` is not `ResolveInput.createdAt`. */
  | { ok: false; reason: 'changed'; createdAt: Date }
  /** A release with `notBefore` asked for before the database clock reached it: the record is unchanged. */
  | { ok: false; reason: 'too-early' };

export interface OperatorActionPage {
  /** Newest first. */
  items: OperatorAction[];
  nextCursor: string | null;
}

/** Gauges for `/metrics`. */
export interface AuditStats {
  /** Rows in the rejection log. */
  rejections: number;
  /** Records waiting for an operator. */
  outcomeUnknown: number;
}

/**
 * The audit methods: fence history, records for operators, their resolution
 * and its log (DESIGN §4.1). Every backend implements them.
 */
export interface AuditStore {
  /** An entity's accepted fences, highest first; `cursor`: a previous page's `nextCursor`. */
  getFenceHistory(entity: string, page: { limit: number; cursor?: string }): Promise<FenceHistoryPage>;
  listRecords(query: RecordQuery): Promise<RecordPage>;
  resolveRecord(input: ResolveInput): Promise<ResolveResult>;
  listOperatorActions(page: { limit: number; cursor?: string }): Promise<OperatorActionPage>;
  auditStats(): Promise<AuditStats>;
}

/**
 * How a request the gateway decided on ended, as the command log keeps it:
 * the record's outcome of an admitted request (`completed`, `released`,
 * `outcome_unknown`; `late-finish` when its finish found the record taken
 * over or resolved), or the transient refusal that has no finish.
 */
export type CommandOutcome = 'completed' | 'released' | 'outcome_unknown' | 'late-finish' | 'entity-busy' | 'idempotency-in-progress' | 'payload-too-large';

/**
 * One row of the command log (DESIGN §4.1 `commands`): ids, hashes and
 * bounded text of the request (`audit`), never a body, a token or a query.
 * Stores bound its text as the rejection log's (../bounds.ts).
 */
export interface CommandInput {
  /** The route's name. */
  route: string;
  /** The record's key scope (route, caller, …: DESIGN §4.1); null for a row with no admission (413). */
  scope: string | null;
  entity: string | null;
  fence: bigint | null;
  idempotencyKey: string | null;
  /**
   * For a finish's row, the outcome the gateway finished with (`completed`,
   * `released`, `outcome_unknown`); the store writes `late-finish` instead
   * when the finish was not recorded.
   */
  outcome: CommandOutcome;
  /** The decision log line's decision (`forwarded`, `upstream-timeout`, `entity-busy`, …). */
  decision: string;
  /** The status the caller was answered (the upstream's, or the gateway's 502, 503, 504, 409, 413). */
  status: number;
  /** Milliseconds the upstream took; null when nothing was sent. */
  upstreamMs: number | null;
  audit: AuditInfo;
}

export interface CommandRow {
  id: string;
  at: Date;
  route: string | null;
  method: string | null;
  path: string | null;
  entity: string | null;
  fence: string | null;
  idempotencyKey: string | null;
  scope: string | null;
  caller: string | null;
  tool: string | null;
  outcome: string;
  decision: string | null;
  status: number | null;
  upstreamMs: number | null;
  requestId: string | null;
  clientRequestId: string | null;
  payloadSha256: string | null;
}

export interface CommandQuery {
  entity?: string;
  /** The idempotency key. */
  key?: string;
  route?: string;
  caller?: string;
  since?: Date;
  until?: Date;
  /** 1…1000. */
  limit: number;
  /** Opaque keyset cursor from a previous page (`nextCursor`). */
  cursor?: string;
}

export interface CommandPage {
  /** Newest first (by id). */
  items: CommandRow[];
  nextCursor: string | null;
}

/** What a release of a lost admission freed (DESIGN §8.2): its entity's slot, its record. */
export interface UnsentRelease {
  slot: boolean;
  record: boolean;
}

export interface GatewayStore extends AuditStore {
  /** Backend name for logs and metrics: `sqlite`, `postgres`, `d1`. */
  readonly kind: string;
  /** A store that commits decisions in groups tells `observer` of each group committed: its size and its WAL sync's time (null when it waited for none; on PostgreSQL always, the COMMIT being inside the statement). SQLite groups admissions and finishes together; PostgreSQL groups each kind in a statement of its own. */
  observeGroups?(observer: (size: number, syncMs: number | null) => void): void;
  /** DESIGN §3.5 in one transaction. */
  admit(input: AdmitInput): Promise<Admission>;
  /** DESIGN §3.7, conditional on the owner token; also frees the serial slot it held. */
  finish(input: FinishInput): Promise<FinishResult>;
  /**
   * The release of an admission whose answer was lost (DESIGN §8.2): one
   * attempt, one transaction, of `releaseUnsent` (../core/admission.ts) on
   * the rows of `input`'s key and entity; `slot` / `record` say what it
   * freed. Given the lost admission's own input (its owner token).
   * PostgreSQL runs it in the background after a failed admission, retried
   * while the database is away (./postgres/release.ts); SQLite's answers are
   * never lost (in process; a failed WAL sync stops the store) and it has
   * the method for the same rule; a store without it (D1) leaves such a
   * record to its lock (DESIGN §8.2).
   */
  releaseUnsent?(input: AdmitInput): Promise<UnsentRelease>;
  /**
   * Keeps a live attempt's lock alive (DESIGN §3.6): the record, when it is
   * still `input.owner`'s `in_progress` record with a live lock, gets
   * `locked_until` = greatest(locked_until, database now + `ms`) (G6), and
   * the entity's serial slot this owner holds, the same. One transaction.
   * False once the record is no longer this owner's live attempt (taken
   * over, finished, resolved, or its lock already expired: never revived);
   * a keyless request answers for its slot.
   */
  extendLock(input: ExtendLockInput): Promise<boolean>;
  /**
   * The interim answer (DESIGN §3.7) of the `outcome_unknown` record of this
   * attempt (`createdAt`, as `listRecords` gave it), while its time lasts
   * (database clock); null otherwise (another attempt, another state, no
   * interim, or past its time). For the reconciler.
   */
  getInterim(input: AttemptRef): Promise<StoredResponse | null>;
  /**
   * Keeps the reconciler's last answer about this attempt's `outcome_unknown`
   * record (`reconcile_result`, `reconciled_at` = database now): for the
   * record listing. A no-op for another attempt, another state, or no record.
   */
  noteReconcile(input: AttemptRef & { result: ReconcileNote }): Promise<void>;
  /** Logs a refusal decided before admission (signature, expiry, auth). */
  recordRejection(input: RejectionInput): Promise<void>;
  /**
   * Writes one row of the command log (DESIGN §4.1 `commands`) for an
   * outcome that has no finish: a request refused `entity-busy`,
   * `idempotency-in-progress` or `payload-too-large`. An admitted request's
   * row is written by `finish` itself (`FinishInput.command`), in its transaction.
   */
  recordCommand(input: CommandInput): Promise<void>;
  /** The command log, newest first (by id), filtered by what `query` names. */
  listCommands(query: CommandQuery): Promise<CommandPage>;
  /**
   * Resolves when `topic` (see `entityTopic` / `recordTopic`) may have changed,
   * or after `timeoutMs`, or when `signal` aborts; never rejects. The gateway
   * re-runs the admission afterwards, so a spurious wake-up is harmless.
   */
  waitForChange(topic: string, timeoutMs: number, signal?: AbortSignal): Promise<void>;
  listRejections(query: RejectionQuery): Promise<RejectionPage>;
  getEntity(entity: string): Promise<EntityInfo | null>;
  /** Every record with this key, across scopes. Never the stored body. */
  getRecords(key: string): Promise<RecordInfo[]>;
  sweep(options: SweepOptions): Promise<SweepResult>;
  /** Idempotent. */
  close(): Promise<void>;
}

export const entityTopic = (entity: string): string => `e:${entity}`;
export const recordTopic = (scope: string, key: string): string => `k:${scope}\u0000${key}`;
