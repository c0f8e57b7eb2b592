import type { Job, JobState } from '../types.js';

/** A `tool_jobs` row as `pg` returns it (JOB_COLUMNS of ./queries.ts). */
export interface JobRow {
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

export function rowToJob(r: JobRow): Job {
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
