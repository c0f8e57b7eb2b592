import { openSqlite, type OpenSqliteOptions, type SqliteDatabase } from '../../db/sqlite-open.js';
import { migrateLeaseSqlite } from '../migrate.js';
import {
  checkStoreId,
  claimRequest,
  enqueuedBefore,
  enqueueParams,
  failedFromJob,
  failParams,
  failResult,
  LEASE_LOST,
  leaseFromJob,
  normaliseEnqueue,
  toJson,
} from '../store-common.js';
import type { ClaimFailedJob, ClaimOptions, ClaimResult, Job, JobErrorInfo, JobState, JobStore, JobStoreOptions, LeaseRef, StoreDescriptor } from '../types.js';
import * as q from './queries.js';

export type SqliteJobStoreOptions = JobStoreOptions &
  (
    | ({ path: string } & OpenSqliteOptions)
    /** A database you opened (use `openSqlite` for WAL and a busy timeout); not closed by `close()`. */
    | { db: SqliteDatabase }
  );

interface JobRow {
  id: number;
  kind: string;
  state: JobState;
  owner_id: string | null;
  lease_until: number | null;
  fencing_token: number;
  heartbeat_at: number | null;
  attempt: number;
  max_attempts: number;
  idempotency_key: string;
  job_key: string;
  fence_key: string;
  payload: string;
  payload_sha256: string;
  result: string | null;
  error: string | null;
  reason: string | null;
  previous_owner_id: string | null;
  created_at: number;
  first_claimed_at: number | null;
  deadline_at: number | null;
  run_after: number;
  finished_at: number | null;
}

const date = (ms: number | null) => (ms === null ? null : new Date(ms));
const json = (text: string | null) => (text === null ? null : JSON.parse(text));

function rowToJob(r: JobRow): Job {
  return {
    id: r.id,
    kind: r.kind,
    state: r.state,
    ownerId: r.owner_id,
    leaseUntil: date(r.lease_until),
    fencingToken: r.fencing_token,
    heartbeatAt: date(r.heartbeat_at),
    attempt: r.attempt,
    maxAttempts: r.max_attempts,
    idempotencyKey: r.idempotency_key,
    jobKey: r.job_key,
    fenceKey: r.fence_key,
    payload: JSON.parse(r.payload),
    payloadSha256: r.payload_sha256,
    result: json(r.result),
    error: json(r.error),
    reason: r.reason,
    previousOwnerId: r.previous_owner_id,
    createdAt: new Date(r.created_at),
    firstClaimedAt: date(r.first_claimed_at),
    deadlineAt: date(r.deadline_at),
    runAfter: new Date(r.run_after),
    finishedAt: date(r.finished_at),
  };
}

/** The database's identity (migration 0007), read once: every job this store enqueues carries it. */
function readStoreId(db: SqliteDatabase): string {
  let row: { store_id: string } | undefined;
  try {
    row = db.prepare(q.STORE_ID).get() as { store_id: string } | undefined;
  } catch (err) {
    // Before migration 0007 the table does not exist: the same fault as no row.
    if (!/no such table/.test(err instanceof Error ? err.message : '')) throw err;
  }
  return checkStoreId(row);
}

/** How many dead jobs one claim call may finalise before it returns (the caller claims again). */
const MAX_DEAD_PER_CLAIM = 50;

/**
 * The job store on a SQLite file (better-sqlite3). Several processes may
 * share the file: it is opened in WAL mode with a busy timeout, and every
 * write runs in `BEGIN IMMEDIATE`, so writers queue on the file lock instead
 * of failing half-way.
 *
 * @example
 * const store = createSqliteJobStore({ path: 'jobs.db', kinds: { payment: { leaseMs: 60_000 } } });
 * await store.enqueue({ kind: 'payment', idempotencyKey: 'order-17', payload: { amount: 1200 } });
 */
export function createSqliteJobStore(options: SqliteJobStoreOptions): JobStore {
  const ownsDb = 'path' in options;
  const db = ownsDb ? openSqlite(options.path, options) : options.db;
  if (options.migrate ?? true) migrateLeaseSqlite(db);
  let storeId: string;
  try {
    storeId = readStoreId(db);
  } catch (err) {
    if (ownsDb) db.close();
    throw err;
  }

  const descriptor: StoreDescriptor | undefined = ownsDb
    ? { sqlite: options.path, ...(options.busyTimeoutMs === undefined ? {} : { busyTimeoutMs: options.busyTimeoutMs }) }
    : db.memory
      ? undefined
      : { sqlite: db.name };

  const stmt = {
    enqueue: db.prepare(q.ENQUEUE),
    byKey: db.prepare(q.BY_KEY),
    byId: db.prepare(q.BY_ID),
    claim: db.prepare(q.CLAIM),
    extend: db.prepare(q.EXTEND),
    complete: db.prepare(q.COMPLETE),
    fail: db.prepare(q.FAIL),
    release: db.prepare(q.RELEASE),
    cancel: db.prepare(q.CANCEL),
    counts: db.prepare(q.COUNTS),
  };

  /** Runs `fn` in BEGIN IMMEDIATE: the write lock is taken (or waited for) up front. */
  const immediate = <T>(fn: () => T): T => db.transaction(fn).immediate();

  const owned = (lease: LeaseRef) => ({ id: lease.id, owner: lease.ownerId, token: lease.fencingToken });

  /** A claim's checked inputs, as CLAIM's parameters. */
  const claimParams = (claim: ClaimOptions) => {
    const { workerId, kinds, lease } = claimRequest(options, claim);
    const params = {
      owner: workerId,
      kinds: kinds === null ? null : JSON.stringify(kinds),
      lease_default_ms: lease.defaultMs,
      lease_by_kind: JSON.stringify(lease.byKind),
    };
    return { workerId, lease, params };
  };

  /** The claim, inside the caller's transaction: dead jobs are failed on the way, the first live one is handed out. */
  const claimIn = ({ workerId, lease, params }: ReturnType<typeof claimParams>): ClaimResult => {
    const failed: ClaimFailedJob[] = [];
    for (let i = 0; i < MAX_DEAD_PER_CLAIM; i++) {
      const row = stmt.claim.get(params) as JobRow | undefined;
      if (!row) return { lease: null, failed };
      const job = rowToJob(row);
      if (job.state !== 'running') {
        failed.push(failedFromJob(job));
        continue;
      }
      return { lease: leaseFromJob(job, workerId, lease), failed };
    }
    return { lease: null, failed };
  };
  let closed = false;

  return {
    dialect: 'sqlite',
    descriptor,
    storeId,

    async enqueue(input) {
      const job = normaliseEnqueue(input);
      return immediate(() => {
        const inserted = stmt.enqueue.get(...enqueueParams(job, storeId)) as JobRow | undefined;
        if (inserted) return { created: true as const, job: rowToJob(inserted) };
        return enqueuedBefore(rowToJob(stmt.byKey.get(job.idempotencyKey) as JobRow), job.payloadSha256);
      });
    },

    async claim(claim) {
      const c = claimParams(claim);
      return immediate(() => claimIn(c));
    },

    async extend(lease) {
      const row = immediate(() => stmt.extend.get({ ...owned(lease), lease_ms: lease.leaseMs })) as { lease_until: number } | undefined;
      return row ? { ok: true, leaseUntil: new Date(row.lease_until) } : LEASE_LOST;
    },

    async complete(lease, result) {
      const row = immediate(() => stmt.complete.get({ ...owned(lease), result: toJson(result) }));
      return row ? { ok: true } : LEASE_LOST;
    },

    // The same two statements as complete() and claim(), in one transaction;
    // the claim runs only if the complete matched.
    async completeAndClaim(lease, result, claim) {
      const c = claimParams(claim);
      return immediate(() => {
        if (!stmt.complete.get({ ...owned(lease), result: toJson(result) })) return { complete: LEASE_LOST, claim: { lease: null, failed: [] } };
        return { complete: { ok: true as const }, claim: claimIn(c) };
      });
    },

    async fail(lease, error: JobErrorInfo, { retryable, backoffMs = 0 }) {
      const p = failParams(error, backoffMs);
      const row = immediate(() =>
        stmt.fail.get({
          ...owned(lease),
          error: p.errorJson,
          error_code: error.code,
          retryable: retryable ? 1 : 0,
          backoff_ms: p.backoffMs,
        }),
      ) as { state: JobState; reason: string | null; run_after: number } | undefined;
      return failResult(row && { state: row.state, reason: row.reason, runAfter: new Date(row.run_after) }, error);
    },

    async release(lease) {
      const row = immediate(() => stmt.release.get(owned(lease)));
      return row ? { ok: true } : LEASE_LOST;
    },

    async cancel(id) {
      const row = immediate(() => stmt.cancel.get(id));
      return row ? { ok: true } : { ok: false, reason: 'not_cancellable' };
    },

    async get(id) {
      const row = stmt.byId.get(id) as JobRow | undefined;
      return row ? rowToJob(row) : null;
    },

    async counts() {
      return stmt.counts.all() as { state: JobState; kind: string; count: number }[];
    },

    async close() {
      if (closed) return;
      closed = true;
      if (ownsDb) db.close();
    },
  };
}
