import { createHash } from 'node:crypto';
import { migrateLeasePostgres } from '../migrate.js';
import type { PoolLike } from '../../store/postgres/types.js';
import { checkStoreId, checkWorkerId, failedFromJob, kindFilter, leaseFromJob, leaseTable, normaliseEnqueue, toJson } from '../store-common.js';
import type {
  ClaimResult,
  CompleteResult,
  Job,
  JobState,
  JobStore,
  JobStoreOptions,
  LeaseRef,
  StoreDescriptor,
} from '../types.js';
import { StatementGroup } from './group.js';
import * as q from './queries.js';

export type PostgresJobStoreOptions = JobStoreOptions & {
  /** Timeout of each statement on a pool the store opens itself (`statement_timeout` and client-side `query_timeout`). */
  queryTimeoutMs?: number;
  /** Connection timeout on a pool the store opens itself. */
  connectionTimeoutMs?: number;
  /** Pool size on a pool the store opens itself; default 4. */
  poolMax?: number;
} & (
    | { connectionString: string }
    /**
     * A pool you opened (e.g. a `pg.Pool`); not ended by `close()`. Give its
     * `connectionString` too so that the heartbeat thread can open its own.
     */
    | { pool: PoolLike; connectionString?: string }
  );

interface JobRow {
  id: string;
  kind: string;
  state: JobState;
  owner_id: string | null;
  lease_until: Date | null;
  fencing_token: string;
  heartbeat_at: Date | null;
  attempt: number;
  max_attempts: number;
  idempotency_key: string;
  job_key: string;
  fence_key: string;
  payload: unknown;
  payload_sha256: string;
  result: unknown;
  error: Job['error'];
  reason: string | null;
  previous_owner_id: string | null;
  created_at: Date;
  first_claimed_at: Date | null;
  deadline_at: Date | null;
  run_after: Date;
  finished_at: Date | null;
}

/** bigint columns arrive as text; ids and tokens stay far below 2^53. */
function int(text: string): number {
  const n = Number(text);
  if (!Number.isSafeInteger(n)) throw new RangeError(`integer out of the safe range: ${text}`);
  return n;
}

function rowToJob(r: JobRow): Job {
  return {
    id: int(r.id),
    kind: r.kind,
    state: r.state,
    ownerId: r.owner_id,
    leaseUntil: r.lease_until,
    fencingToken: int(r.fencing_token),
    heartbeatAt: r.heartbeat_at,
    attempt: r.attempt,
    maxAttempts: r.max_attempts,
    idempotencyKey: r.idempotency_key,
    jobKey: r.job_key,
    fenceKey: r.fence_key,
    payload: r.payload,
    payloadSha256: r.payload_sha256,
    result: r.result,
    error: r.error,
    reason: r.reason,
    previousOwnerId: r.previous_owner_id,
    createdAt: r.created_at,
    firstClaimedAt: r.first_claimed_at,
    deadlineAt: r.deadline_at,
    runAfter: r.run_after,
    finishedAt: r.finished_at,
  };
}

/**
 * A statement's name for the server: a hash of its text, so each connection
 * parses and plans a hot-path statement once instead of on every call. The
 * claim's parse and plan cost more server CPU than running it: 1.46 → 0.56 ms
 * per claim, 0.82 → 0.45 ms per complete, once prepared (docs/bench-lease.md).
 * Same text, same name: stores on different schemas may share a pool, since
 * PostgreSQL re-parses a prepared statement when the search_path changes.
 */
const statementNames = new Map<string, string>();
function statementName(text: string): string {
  let name = statementNames.get(text);
  if (name === undefined) {
    name = `fencegate_lease_${createHash('sha1').update(text).digest('hex').slice(0, 16)}`;
    statementNames.set(text, name);
  }
  return name;
}

/** The database's identity (migration 0007), read once: every job this store enqueues carries it. */
async function readStoreId(pool: PoolLike): Promise<string> {
  let row: { store_id: string } | undefined;
  try {
    row = (await pool.query<{ store_id: string }>(q.STORE_ID)).rows[0];
  } catch (err) {
    // Before migration 0007 the table does not exist (undefined_table): the same fault as no row.
    if ((err as { code?: unknown }).code !== '42P01') throw err;
  }
  return checkStoreId(row);
}

/** How many dead jobs one claim call may finalise before it returns (the caller claims again). */
const MAX_DEAD_PER_CLAIM = 50;

/** The most calls one grouped statement serves. */
const MAX_GROUP = 100;

/**
 * The job store on PostgreSQL. Every operation is one statement (its own
 * transaction), so the store needs no client of its own between calls and
 * works through any pool. Concurrent claim() calls (same owner, kinds and
 * leases) and concurrent complete() calls share a statement when they arrive
 * while one is in flight (./group.ts); a lone call goes out at once.
 *
 * @example
 * const store = await createPostgresJobStore({ connectionString: process.env.DATABASE_URL! });
 * const { lease } = await store.claim({ workerId: 'w1' });
 */
export async function createPostgresJobStore(options: PostgresJobStoreOptions): Promise<JobStore> {
  let pool: PoolLike;
  let ownsPool = false;
  if ('pool' in options) {
    pool = options.pool;
  } else {
    // Loaded on demand: `pg` stays out of programs that only use SQLite.
    const { default: pg } = await import('pg');
    const own = new pg.Pool({
      connectionString: options.connectionString,
      max: options.poolMax ?? 4,
      // Both sides: the server cancels a statement stuck on a lock, the client
      // gives up on a connection that went silent.
      ...(options.queryTimeoutMs === undefined
        ? {}
        : { query_timeout: options.queryTimeoutMs, statement_timeout: options.queryTimeoutMs }),
      ...(options.connectionTimeoutMs === undefined ? {} : { connectionTimeoutMillis: options.connectionTimeoutMs }),
    });
    // An idle client that loses its connection emits 'error' on the pool; unheard,
    // it would crash the process. The next query reports the fault instead.
    own.on('error', () => {});
    pool = own as unknown as PoolLike;
    ownsPool = true;
  }
  let storeId: string;
  try {
    if (options.migrate ?? true) await migrateLeasePostgres(pool);
    storeId = await readStoreId(pool);
  } catch (err) {
    if (ownsPool) await pool.end().catch(() => {});
    throw err;
  }

  const descriptor: StoreDescriptor | undefined =
    options.connectionString === undefined ? undefined : { postgres: options.connectionString };
  /** A hot-path statement, named (prepared once per connection); `pg` accepts a query config object. */
  const prepared = <R>(text: string, values: unknown[]) =>
    (pool as unknown as { query(q: { name: string; text: string; values: unknown[] }): Promise<{ rows: R[] }> }).query({
      name: statementName(text),
      text,
      values,
    });
  const owned = (lease: LeaseRef) => [lease.id, lease.ownerId, lease.fencingToken];
  const lost = { ok: false, reason: 'lease_lost' } as const;
  let closed = false;

  /**
   * Claims for `callers` concurrent claim() calls with the same parameters:
   * one CLAIM when alone, else CLAIM_MANY for all of them. Jobs found dead
   * are reported once (to the first caller); callers left without a lease
   * because some picked jobs were dead claim again, as a single claim does,
   * for at most MAX_DEAD_PER_CLAIM rounds.
   */
  async function claimFor(
    workerId: string,
    params: unknown[],
    lease: ReturnType<typeof leaseTable>,
    callers: number,
  ): Promise<ClaimResult[]> {
    const results: ClaimResult[] = Array.from({ length: callers }, () => ({ lease: null, failed: [] }));
    let waiting = results;
    for (let round = 0; round < MAX_DEAD_PER_CLAIM && waiting.length > 0; round++) {
      const want = waiting.length;
      const { rows } = want === 1 ? await prepared<JobRow>(q.CLAIM, params) : await prepared<JobRow>(q.CLAIM_MANY, [...params, want]);
      let given = 0;
      for (const row of rows) {
        const job = rowToJob(row);
        if (job.state !== 'running') {
          results[0]!.failed.push(failedFromJob(job));
          continue;
        }
        waiting[given++]!.lease = leaseFromJob(job, workerId, lease);
      }
      // Fewer rows than asked for: nothing else is claimable now.
      if (rows.length < want) break;
      waiting = waiting.slice(given);
    }
    return results;
  }
  const claimGroups = new Map<string, StatementGroup<undefined, ClaimResult>>();

  /**
   * Completes concurrent complete() calls: one COMPLETE when alone, else
   * COMPLETE_MANY; each lease is ok only if its own row matched the full
   * ownership condition. A lease given twice in one group (never by the
   * runner) goes one statement at a time, so the second sees the first.
   */
  async function completeFor(items: { lease: LeaseRef; json: string }[]): Promise<CompleteResult[]> {
    const one = async ({ lease, json }: { lease: LeaseRef; json: string }): Promise<CompleteResult> => {
      const { rows } = await prepared(q.COMPLETE, [...owned(lease), json]);
      return rows.length === 1 ? { ok: true } : lost;
    };
    if (items.length === 1 || new Set(items.map((i) => i.lease.id)).size < items.length) {
      const out: CompleteResult[] = [];
      for (const item of items) out.push(await one(item));
      return out;
    }
    const { rows } = await prepared<{ id: string }>(q.COMPLETE_MANY, [
      items.map((i) => i.lease.id),
      items.map((i) => i.lease.ownerId),
      items.map((i) => i.lease.fencingToken),
      items.map((i) => i.json),
    ]);
    const done = new Set(rows.map((r) => Number(r.id)));
    return items.map((i) => (done.has(i.lease.id) ? { ok: true } : lost));
  }
  const completeGroup = new StatementGroup(completeFor, MAX_GROUP);

  return {
    dialect: 'postgres',
    descriptor,
    storeId,

    async enqueue(input) {
      const job = normaliseEnqueue(input);
      const inserted = await pool.query<JobRow>(q.ENQUEUE, [
        job.kind,
        job.idempotencyKey,
        job.payloadJson,
        job.payloadSha256,
        job.maxAttempts,
        job.deadlineMs,
        job.fenceKey,
        storeId,
      ]);
      const row = inserted.rows[0];
      if (row) return { created: true, job: rowToJob(row) };
      // ON CONFLICT DO NOTHING waited for the other inserter to commit, so
      // this (new-snapshot) read finds its row.
      const existing = await pool.query<JobRow>(q.BY_KEY, [job.idempotencyKey]);
      const found = rowToJob(existing.rows[0] as JobRow);
      return { created: false, job: found, samePayload: found.payloadSha256 === job.payloadSha256 };
    },

    async claim(claim) {
      const workerId = checkWorkerId(claim.workerId);
      const kinds = kindFilter(claim.kinds);
      const lease = leaseTable(options, claim);
      const params = [workerId, kinds, lease.defaultMs, JSON.stringify(lease.byKind)];
      // Only claims with the same owner, kinds and leases share a statement.
      const key = JSON.stringify(params);
      let group = claimGroups.get(key);
      if (!group) {
        group = new StatementGroup<undefined, ClaimResult>(
          (callers) => claimFor(workerId, params, lease, callers.length),
          MAX_GROUP,
          () => claimGroups.delete(key),
        );
        claimGroups.set(key, group);
      }
      return group.submit(undefined);
    },

    async extend(lease) {
      const { rows } = await prepared<{ lease_until: Date }>(q.EXTEND, [...owned(lease), lease.leaseMs]);
      return rows[0] ? { ok: true, leaseUntil: rows[0].lease_until } : lost;
    },

    async complete(lease, result) {
      return completeGroup.submit({ lease, json: toJson(result) });
    },

    async fail(lease, error, { retryable, backoffMs = 0 }) {
      const { rows } = await prepared<{ state: JobState; reason: string | null; run_after: Date }>(q.FAIL, [
        ...owned(lease),
        JSON.stringify({ code: error.code, message: error.message }),
        retryable,
        Math.max(0, Math.round(backoffMs)),
        error.code,
      ]);
      const row = rows[0];
      if (!row) return lost;
      return row.state === 'queued'
        ? { ok: true, state: 'queued', runAfter: row.run_after }
        : { ok: true, state: 'failed', reason: row.reason ?? error.code };
    },

    async release(lease) {
      const { rows } = await prepared(q.RELEASE, owned(lease));
      return rows.length === 1 ? { ok: true } : lost;
    },

    async cancel(id) {
      const { rows } = await pool.query(q.CANCEL, [id]);
      return rows.length === 1 ? { ok: true } : { ok: false, reason: 'not_cancellable' };
    },

    async get(id) {
      const { rows } = await pool.query<JobRow>(q.BY_ID, [id]);
      return rows[0] ? rowToJob(rows[0]) : null;
    },

    async counts() {
      const { rows } = await pool.query<{ state: JobState; kind: string; count: number }>(q.COUNTS);
      return rows;
    },

    async close() {
      if (closed) return;
      closed = true;
      if (ownsPool) await pool.end();
    },
  };
}
