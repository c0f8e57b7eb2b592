/**
 * `fencegate/graphile-worker`: fenced, idempotent gateway calls from
 * graphile-worker tasks (docs/queues.md). The fence is a row of
 * `fencegate_queue_fences` in the same PostgreSQL, raised in one statement
 * that also checks, under a share lock on the job's row, that this worker
 * still holds the job.
 *
 * Why not the job's `attempts`: graphile-worker raises it in the very
 * `UPDATE` that locks the job (src/sql/getJob.ts: `attempts = attempts + 1,
 * locked_by = $1, locked_at = now()`), take-overs of an expired lock
 * included, so on its own it rises with every hand-out. But `add_job` with
 * `job_key_mode: 'replace'` sets it back to 0 on an unlocked job, and
 * `reschedule_jobs(..., attempts => n)` sets it to anything: a later owner
 * could present a fence the gateway already saw, and be refused or, worse,
 * tie with a stale one.
 */
import { LeaseConfigError } from '../lease/errors.js';
import { beginAttempt, runAttempt, type AdapterOptions, type FencedJobContext } from './context.js';

/** The fields of graphile-worker's `helpers.job` the adapter reads. */
export interface GraphileJobLike {
  id: string | number | bigint;
  /** The worker that holds the job's lock (set by get_job). */
  locked_by: string | null;
  /**
   * When get_job locked the job, on the database's clock (its `now()`): the
   * lock lasts until `locked_at` + 4 h. Needed with a `fenceSigner`.
   */
  locked_at?: Date | string | null;
}

export interface GraphileHelpersLike {
  job: GraphileJobLike;
  abortSignal?: AbortSignal;
}

export type FencedTask<P, H extends GraphileHelpersLike> = (payload: P, helpers: H, fenced: FencedJobContext) => void | Promise<void>;

export interface FencedTaskOptions extends AdapterOptions {
  /** graphile-worker's `schema`; default `graphile_worker`. */
  workerSchema?: string;
  /**
   * How long graphile-worker's lock lasts from `locked_at`: its resetLockedAt
   * frees locks older than 4 h, and nothing renews one. The signed fence's
   * `exp` (DESIGN §7) is `locked_at + lockMs`. Default and maximum 4 h.
   */
  lockMs?: number;
}

/** graphile-worker's resetLockedAt: `locked_at < now() - interval '4 hours'`. */
const GRAPHILE_LOCK_MS = 4 * 3_600_000;

const SCHEMA = /^[a-z_][a-z0-9_$]{0,62}$/;

/**
 * Wraps a task: each run draws the next fence for the job (the fences must
 * be a PostgreSQL source on the worker's database), the task sends its side
 * effects with `fencedFetch`, and a gateway `stale-fence` aborts `signal`
 * and fails the run with `LeaseLostError`.
 *
 * @example
 * const fences = await createFenceSource({ postgres: pgPool });
 * await run({ pgPool, taskList: { pay: fencedTask(async (payload, helpers, { fencedFetch }) => {
 *   await fencedFetch(`${gateway}/payments/charges`, { step: 'charge', method: 'POST', body: JSON.stringify(payload) });
 * }, { fences }) } });
 */
export function fencedTask<P = unknown, H extends GraphileHelpersLike = GraphileHelpersLike>(
  task: FencedTask<P, H>,
  options: FencedTaskOptions,
): (payload: P, helpers: H) => Promise<void> {
  if (options.fences?.backend !== 'postgres')
    throw new LeaseConfigError("fencegate/graphile-worker needs a PostgreSQL fence source on the worker's database (createFenceSource({ postgres }))");
  const { workerSchema = 'graphile_worker', lockMs = GRAPHILE_LOCK_MS, ...adapter } = options;
  if (!Number.isSafeInteger(lockMs) || lockMs <= 0 || lockMs > GRAPHILE_LOCK_MS) {
    throw new LeaseConfigError(
      `lockMs must be an integer of ms in 1–${GRAPHILE_LOCK_MS} (graphile-worker's lock lasts 4 h from locked_at), got ${String(lockMs)}`,
    );
  }
  if (!SCHEMA.test(workerSchema)) throw new LeaseConfigError(`workerSchema must be a plain lowercase identifier, got ${JSON.stringify(workerSchema)}`);
  // $3 the job id, $4 this worker's id. FOR SHARE: a take-over's get_job
  // (FOR UPDATE SKIP LOCKED) cannot lock the row between this check and the
  // increment, and a check that waited on one re-reads the row it locked.
  const owned = `EXISTS (SELECT 1 FROM "${workerSchema}"._private_jobs WHERE id = $3::bigint AND locked_by = $4 FOR SHARE)`;
  return async function fencedGraphileTask(payload, helpers) {
    const { id, locked_by: workerId, locked_at: lockedAt } = helpers.job;
    if (workerId === null) throw new LeaseConfigError('a fenced task needs the job as graphile-worker hands it out (locked_by is empty)');
    // The lock's end as the database wrote it at hand-out, never the clock at
    // the time of a call: a worker frozen past it mints an expired fence.
    const lockedAtMs = lockedAt == null ? NaN : new Date(lockedAt).getTime();
    if (adapter.fenceSigner !== undefined && !Number.isFinite(lockedAtMs)) {
      throw new LeaseConfigError(
        "a fenced task with a fenceSigner needs the job's locked_at as graphile-worker hands it out (the signed fence expires with the lock)",
      );
    }
    const attempt = await beginAttempt(
      adapter,
      { queue: workerSchema, id: String(id) },
      { kind: 'sql', where: owned, values: [String(id), workerId] },
      helpers.abortSignal,
      () => () => new Date(lockedAtMs + lockMs),
    );
    await runAttempt(attempt, async () => task(payload, helpers, attempt.context));
  };
}

export { createFenceSource, type FenceSourceOptions } from './fence-source.js';
export type { FencedJobContext } from './context.js';
export type { FenceSource, BeginResult } from './types.js';
export { LeaseLostError, OutcomeUnknownError } from '../lease/errors.js';
