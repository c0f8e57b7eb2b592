import { claimRequest, failedFromJob, leaseFromJob, type leaseTable } from '../store-common.js';
import type { ClaimOptions, ClaimResult, JobStoreOptions } from '../types.js';
import { MAX_GROUP, StatementGroup } from './group.js';
import type { Prepared } from './prepared.js';
import * as q from './queries.js';
import { rowToJob, type JobRow } from './rows.js';

/** How many dead jobs one claim call may finalise before it returns (the caller claims again). */
const MAX_DEAD_PER_CLAIM = 50;

/**
 * Claims for `callers` concurrent claim() calls with the same parameters:
 * one CLAIM when alone, else CLAIM_MANY for all of them. Jobs found dead
 * are reported once (to the first caller); callers left without a lease
 * because some picked jobs were dead claim again, as a single claim does,
 * for at most MAX_DEAD_PER_CLAIM rounds.
 */
async function claimFor(
  prepared: Prepared,
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

/**
 * The store's claim(): concurrent calls with the same owner, kinds and
 * leases share a statement (./group.ts); a lone call goes out at once.
 */
export function claimer(prepared: Prepared, store: JobStoreOptions): (claim: ClaimOptions) => Promise<ClaimResult> {
  const groups = new Map<string, StatementGroup<undefined, ClaimResult>>();
  return async (claim) => {
    const { workerId, kinds, lease } = claimRequest(store, claim);
    const params = [workerId, kinds, lease.defaultMs, JSON.stringify(lease.byKind)];
    // Only claims with the same owner, kinds and leases share a statement.
    const key = JSON.stringify(params);
    let group = groups.get(key);
    if (!group) {
      group = new StatementGroup<undefined, ClaimResult>(
        (callers) => claimFor(prepared, workerId, params, lease, callers.length),
        MAX_GROUP,
        () => groups.delete(key),
      );
      groups.set(key, group);
    }
    return group.submit(undefined);
  };
}
