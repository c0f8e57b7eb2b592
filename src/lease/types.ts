/**
 * The narrow job-store contract of `fencegate/lease`. Both backends (SQLite
 * and PostgreSQL) implement it with one conditional statement per operation
 * and the database clock only (DESIGN §6, §2 G6).
 */

export type JobState = 'queued' | 'running' | 'succeeded' | 'failed' | 'cancelled';

/** Why a job ended in `failed` (or `cancelled`), as stored in `tool_jobs.reason`. */
export type TerminalReason = 'max_attempts' | 'deadline' | 'cancelled' | (string & {});

/** The last attempt's error, as stored in `tool_jobs.error`. Never a payload. */
export interface JobErrorInfo {
  /** Stable code, e.g. `stage_timeout`, `lease_expired`, `handler_error`, `invalid_payload`. */
  code: string;
  message: string;
  /** The attempt the error belongs to (filled in by the store). */
  attempt?: number;
}

/** One row of `tool_jobs`, as the read helpers return it. */
export interface Job {
  id: number;
  kind: string;
  state: JobState;
  ownerId: string | null;
  leaseUntil: Date | null;
  fencingToken: number;
  heartbeatAt: Date | null;
  attempt: number;
  maxAttempts: number;
  idempotencyKey: string;
  /**
   * The job's key, unique across job stores: `tool-job:<storeId>:<id>`
   * (`tool-job:<id>` for a job enqueued before migration 0007). The default
   * fence entity, and every step's `Idempotency-Key` is `<jobKey>:<step>`.
   */
  jobKey: string;
  /** The fence entity: the custom key given at enqueue, else the `jobKey`. */
  fenceKey: string;
  payload: unknown;
  payloadSha256: string;
  result: unknown;
  error: JobErrorInfo | null;
  reason: TerminalReason | null;
  previousOwnerId: string | null;
  createdAt: Date;
  firstClaimedAt: Date | null;
  deadlineAt: Date | null;
  runAfter: Date;
  finishedAt: Date | null;
}

/**
 * What a successful claim hands out. The fields that identify the lease
 * (`id`, `ownerId`, `fencingToken`) are the ones every later conditional
 * statement checks; `leaseMs` is the kind's lease length, reused by `extend`.
 */
export interface Lease {
  id: number;
  kind: string;
  ownerId: string;
  fencingToken: number;
  /** The database's lease end right after the claim. */
  leaseUntil: Date;
  leaseMs: number;
  attempt: number;
  maxAttempts: number;
  idempotencyKey: string;
  /** See `Job.jobKey`: the base of every step's `Idempotency-Key`. */
  jobKey: string;
  fenceKey: string;
  payload: unknown;
  payloadSha256: string;
  deadlineAt: Date | null;
  /** Set when this claim took over a lease that expired in another owner's hands. */
  previousOwnerId: string | null;
}

/** The part of a lease that ownership checks need. */
export type LeaseRef = Pick<Lease, 'id' | 'ownerId' | 'fencingToken' | 'leaseMs'>;

export interface EnqueueInput {
  kind: string;
  /** Unique per job: a second enqueue with the same key returns the existing job. */
  idempotencyKey: string;
  /** Any JSON value. Stored as given; events and logs only ever see its sha256. */
  payload: unknown;
  /** Default 3. */
  maxAttempts?: number;
  /** Total deadline, counted from the enqueue by the database clock. */
  deadlineMs?: number;
  /**
   * The fence entity; default the job key (`tool-job:<storeId>:<id>`). See
   * docs/lease.md before using one. The step keys stay per store and job.
   */
  fenceKey?: string;
}

export type EnqueueResult =
  | { created: true; job: Job }
  /** The key was known: the existing job, and whether its payload hash matches. */
  | { created: false; job: Job; samePayload: boolean };

export interface ClaimOptions {
  workerId: string;
  /** Only these kinds; default any kind. */
  kinds?: readonly string[];
  /** Lease length for kinds not in `leaseMsByKind`; default the store's `leaseMs`. */
  leaseMs?: number;
  /** Lease length per kind; default the store's `kinds` table. */
  leaseMsByKind?: Readonly<Record<string, number>>;
}

/** A job that claim moved to `failed` instead of handing it out. */
export interface ClaimFailedJob {
  id: number;
  kind: string;
  fencingToken: number;
  reason: 'max_attempts' | 'deadline';
  /** The owner whose lease had expired, if the job was running. */
  previousOwnerId: string | null;
}

export interface ClaimResult {
  lease: Lease | null;
  /** Jobs found dead on the way (attempts used up or deadline passed). */
  failed: ClaimFailedJob[];
}

/** The answer of every ownership-conditional statement that refused. */
export interface LeaseLost {
  ok: false;
  reason: 'lease_lost';
}

export type ExtendResult = { ok: true; leaseUntil: Date } | LeaseLost;
export type CompleteResult = { ok: true } | LeaseLost;

/** `completeAndClaim`'s answer: the complete's, and the claim's (nothing claimed when the complete was refused). */
export interface CompleteAndClaimResult {
  complete: CompleteResult;
  claim: ClaimResult;
}
export type ReleaseResult = { ok: true } | LeaseLost;

export interface FailOptions {
  /** Retry after `backoffMs` if attempts (and the deadline) allow. */
  retryable: boolean;
  /** Delay before the retry may be claimed; default 0. */
  backoffMs?: number;
}

export type FailResult = { ok: true; state: 'queued'; runAfter: Date } | { ok: true; state: 'failed'; reason: TerminalReason } | LeaseLost;

export type CancelResult = { ok: true } | { ok: false; reason: 'not_cancellable' };

export interface JobCount {
  state: JobState;
  kind: string;
  count: number;
}

/**
 * How to reach the same database from another thread or process: the
 * heartbeat thread re-opens the store from this (a live connection cannot
 * cross a thread boundary).
 */
export type StoreDescriptor = { sqlite: string; busyTimeoutMs?: number } | { postgres: string; pooler?: 'session' | 'transaction' };

export interface JobStore {
  readonly dialect: 'sqlite' | 'postgres';
  /**
   * The database's own identity (table `tool_job_store`, created with the
   * schema by migration 0007): part of every job key enqueued through it, so
   * two job databases behind one gateway never share a key or an entity.
   */
  readonly storeId: string;
  /** How to re-open this store elsewhere; undefined for a pool handed in without a URL. */
  readonly descriptor: StoreDescriptor | undefined;
  enqueue(input: EnqueueInput): Promise<EnqueueResult>;
  claim(options: ClaimOptions): Promise<ClaimResult>;
  extend(lease: LeaseRef): Promise<ExtendResult>;
  complete(lease: LeaseRef, result: unknown): Promise<CompleteResult>;
  /**
   * `complete(lease, result)` and then, only if that stored the result,
   * `claim(claim)`: what a worker's slot does when its job succeeded and it
   * wants the next one. The complete keeps its full ownership condition and
   * the claim its rules; a refused complete claims nothing. The complete and
   * the claim's first pick commit in one transaction; on PostgreSQL, when
   * the job that pick found was dead (failed, and reported in the
   * `failed` of one claim of the statement, not always this call's), one
   * more claim follows in a transaction of its own,
   * and if that fails the answer keeps the committed complete with
   * `claim.lease` null. Optional: the runner calls `complete` and `claim` on
   * a store without it.
   */
  completeAndClaim?(lease: LeaseRef, result: unknown, claim: ClaimOptions): Promise<CompleteAndClaimResult>;
  fail(lease: LeaseRef, error: JobErrorInfo, options: FailOptions): Promise<FailResult>;
  /** Gives a running job back (queued, claimable now); the attempt still counts. */
  release(lease: LeaseRef): Promise<ReleaseResult>;
  /** For operators: a queued or running job becomes `cancelled`; its owner's next check fails. */
  cancel(id: number): Promise<CancelResult>;
  get(id: number): Promise<Job | null>;
  counts(): Promise<JobCount[]>;
  /** Closes connections the store opened itself; a handed-in pool or db stays open. */
  close(): Promise<void>;
}

/** Options shared by both store factories. */
export interface JobStoreOptions {
  /** Default lease length; default 30 000 ms. */
  leaseMs?: number;
  /** Lease length per kind, e.g. `{ payment: { leaseMs: 60_000 } }`. */
  kinds?: Readonly<Record<string, { leaseMs?: number }>>;
  /** Apply pending migrations on open; default true. */
  migrate?: boolean;
}
