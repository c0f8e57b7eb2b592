import { createHash } from 'node:crypto';
import { LeaseError } from './errors.js';
import type {
  ClaimFailedJob,
  ClaimOptions,
  EnqueueInput,
  EnqueueResult,
  FailResult,
  Job,
  JobErrorInfo,
  JobState,
  JobStoreOptions,
  Lease,
  LeaseLost,
} from './types.js';

/** Defaults shared by both backends. */
export const DEFAULT_LEASE_MS = 30_000;
export const DEFAULT_MAX_ATTEMPTS = 3;

/** sha256 of a JSON value, hex: what events and logs carry instead of the value. */
export function sha256Json(value: unknown): string {
  return createHash('sha256')
    .update(JSON.stringify(value ?? null))
    .digest('hex');
}

/** `JSON.stringify` that never yields `undefined` (a NOT NULL column needs a value). */
export function toJson(value: unknown): string {
  return JSON.stringify(value ?? null);
}

function positiveInt(value: unknown, field: string): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value <= 0) {
    throw new LeaseError('invalid_input', `${field} must be a positive integer, got ${String(value)}`);
  }
  return value;
}

function text(value: unknown, field: string, max: number): string {
  if (typeof value !== 'string' || value.length === 0 || value.length > max) {
    throw new LeaseError('invalid_input', `${field} must be a string of 1 to ${max} characters`);
  }
  return value;
}

/** A custom fence key: it travels as the X-Fence-Entity header, so 1–512 characters of printable ASCII, no spaces. */
export function checkFenceKey(value: unknown): string {
  const fenceKey = text(value, 'fenceKey', 512);
  if (!/^[\x21-\x7e]+$/.test(fenceKey)) throw new LeaseError('invalid_input', 'fenceKey must be printable ASCII without spaces');
  return fenceKey;
}

/** Checks an enqueue request and fills in defaults. Bad input is a caller fault, so it throws. */
export function normaliseEnqueue(input: EnqueueInput) {
  const fenceKey = input.fenceKey === undefined ? null : checkFenceKey(input.fenceKey);
  return {
    kind: text(input.kind, 'kind', 200),
    idempotencyKey: text(input.idempotencyKey, 'idempotencyKey', 255),
    payloadJson: toJson(input.payload),
    payloadSha256: sha256Json(input.payload),
    maxAttempts: input.maxAttempts === undefined ? DEFAULT_MAX_ATTEMPTS : positiveInt(input.maxAttempts, 'maxAttempts'),
    deadlineMs: input.deadlineMs === undefined ? null : positiveInt(input.deadlineMs, 'deadlineMs'),
    fenceKey,
  };
}

/**
 * The lease lengths a claim uses: the claim's own, else the store's table of
 * kinds, else the default. Never anything from the payload: a job must not
 * choose how long it may hold its lease.
 */
export function leaseTable(store: JobStoreOptions, claim: ClaimOptions) {
  const byKind: Record<string, number> = {};
  for (const [kind, spec] of Object.entries(store.kinds ?? {})) {
    if (spec.leaseMs !== undefined) byKind[kind] = positiveInt(spec.leaseMs, `kinds.${kind}.leaseMs`);
  }
  for (const [kind, ms] of Object.entries(claim.leaseMsByKind ?? {})) {
    byKind[kind] = positiveInt(ms, `leaseMsByKind.${kind}`);
  }
  const defaultMs = positiveInt(claim.leaseMs ?? store.leaseMs ?? DEFAULT_LEASE_MS, 'leaseMs');
  return { defaultMs, byKind };
}

function checkWorkerId(workerId: unknown): string {
  return text(workerId, 'workerId', 200);
}

/** `null` means any kind; an empty list would claim nothing, which is surely a mistake. */
function kindFilter(kinds: readonly string[] | undefined): string[] | null {
  if (kinds === undefined) return null;
  if (kinds.length === 0) throw new LeaseError('invalid_input', 'kinds must not be empty (omit it to claim any kind)');
  return kinds.map((k, i) => text(k, `kinds[${i}]`, 200));
}

/** The store's identity as the database holds it (migration 0007); a store cannot work without it. */
export function checkStoreId(row: { store_id?: unknown } | undefined): string {
  const id = row?.store_id;
  if (typeof id !== 'string' || !/^[0-9a-f]{32}$/.test(id)) {
    throw new LeaseError(
      'store_identity',
      'the job store has no identity (table tool_job_store, migration 0007): run the migrations before opening it with migrate: false',
    );
  }
  return id;
}

/** The lease a claim hands out: the claimed row, its new owner, and the lease length of its kind. */
export function leaseFromJob(job: Job, workerId: string, lease: ReturnType<typeof leaseTable>): Lease {
  return {
    id: job.id,
    kind: job.kind,
    ownerId: workerId,
    fencingToken: job.fencingToken,
    leaseUntil: job.leaseUntil as Date,
    leaseMs: lease.byKind[job.kind] ?? lease.defaultMs,
    attempt: job.attempt,
    maxAttempts: job.maxAttempts,
    idempotencyKey: job.idempotencyKey,
    jobKey: job.jobKey,
    fenceKey: job.fenceKey,
    payload: job.payload,
    payloadSha256: job.payloadSha256,
    deadlineAt: job.deadlineAt,
    previousOwnerId: job.previousOwnerId,
  };
}

/** A job the claim found past its attempts or deadline and failed instead of handing out. */
export function failedFromJob(job: Job): ClaimFailedJob {
  return {
    id: job.id,
    kind: job.kind,
    fencingToken: job.fencingToken,
    reason: job.reason as ClaimFailedJob['reason'],
    previousOwnerId: job.previousOwnerId,
  };
}

/** The ENQUEUE statement's parameters, in its order (the same in both dialects). */
export function enqueueParams(job: ReturnType<typeof normaliseEnqueue>, storeId: string): unknown[] {
  return [job.kind, job.idempotencyKey, job.payloadJson, job.payloadSha256, job.maxAttempts, job.deadlineMs, job.fenceKey, storeId];
}

/** An enqueue's answer when the key was known: the job already under it, and whether its payload matches. */
export function enqueuedBefore(job: Job, payloadSha256: string): EnqueueResult {
  return { created: false, job, samePayload: job.payloadSha256 === payloadSha256 };
}

/** A claim's checked inputs, in the order they are checked: the owner, the kinds, the lease lengths. */
export function claimRequest(store: JobStoreOptions, claim: ClaimOptions) {
  return { workerId: checkWorkerId(claim.workerId), kinds: kindFilter(claim.kinds), lease: leaseTable(store, claim) };
}

/** The answer of an ownership-conditional statement that matched zero rows. */
export const LEASE_LOST: LeaseLost = { ok: false, reason: 'lease_lost' };

/** FAIL's error and backoff parameters: the error's code and message only, a whole non-negative backoff. */
export function failParams(error: JobErrorInfo, backoffMs: number) {
  return { errorJson: JSON.stringify({ code: error.code, message: error.message }), backoffMs: Math.max(0, Math.round(backoffMs)) };
}

/** FAIL's answer from its returned row (none: the lease was lost). */
export function failResult(row: { state: JobState; reason: string | null; runAfter: Date } | undefined, error: JobErrorInfo): FailResult {
  if (!row) return LEASE_LOST;
  return row.state === 'queued' ? { ok: true, state: 'queued', runAfter: row.runAfter } : { ok: true, state: 'failed', reason: row.reason ?? error.code };
}
