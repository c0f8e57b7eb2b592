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
export async function claimFor(
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
 * A claim's checked inputs as the claim statements' $1–$4, and the key of
 * its group: only claims with the same owner, kinds and leases share a
 * statement.
 */
export function claimParams(store: JobStoreOptions, claim: ClaimOptions) {
  const { workerId, kinds, lease } = claimRequest(store, claim);
  const params: unknown[] = [workerId, kinds, lease.defaultMs, JSON.stringify(lease.byKind)];
  return { workerId, lease, params, key: JSON.stringify(params) };
}

/** One statement group per key, dropped while idle. */
export function groupsByKey<I, O>(make: (onIdle: () => void) => StatementGroup<I, O>): (key: string) => StatementGroup<I, O> {
  const groups = new Map<string, StatementGroup<I, O>>();
  return (key) => {
    let group = groups.get(key);
    if (!group) {
      group = make(() => groups.delete(key));
      groups.set(key, group);
    }
    return group;
  };
}

/**
 * The store's claim(): concurrent calls with the same owner, kinds and
 * leases share a statement (./group.ts); a lone call goes out at once.
 */
export function claimer(prepared: Prepared, store: JobStoreOptions): (claim: ClaimOptions) => Promise<ClaimResult> {
  type Claim = ReturnType<typeof claimParams>;
  const group = groupsByKey<Claim, ClaimResult>(
    (onIdle) =>
      new StatementGroup(
        // Every caller of a group has the same parameters: the first one's serve all.
        (callers) => claimFor(prepared, callers[0]!.workerId, callers[0]!.params, callers[0]!.lease, callers.length),
        MAX_GROUP,
        onIdle,
      ),
  );
  return async (claim) => {
    const c = claimParams(store, claim);
    return group(c.key).submit(c);
  };
}
