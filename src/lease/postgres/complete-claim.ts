import { failedFromJob, LEASE_LOST, leaseFromJob, toJson } from '../store-common.js';
import type { ClaimOptions, ClaimResult, CompleteAndClaimResult, JobStoreOptions, LeaseRef } from '../types.js';
import { claimFor, claimParams, groupsByKey } from './claim.js';
import { MAX_GROUP, StatementGroup } from './group.js';
import type { Prepared } from './prepared.js';
import * as q from './queries.js';
import { rowToJob, type JobRow } from './rows.js';

type Claim = ReturnType<typeof claimParams>;
type Item = { lease: LeaseRef; json: string; claim: Claim };

const NOTHING = (): ClaimResult => ({ lease: null, failed: [] });

/**
 * Completes and claims for concurrent completeAndClaim() calls with the same
 * claim parameters: one COMPLETE_CLAIM_MANY for all of them. Only the calls
 * whose own complete matched get a claim, so a stale lease claims nothing.
 * Dead jobs met by the claim are reported once (to the first call that
 * claims); calls left without a lease because some picked jobs were dead
 * claim again through the claim's own loop (./claim.ts), as claim() would.
 */
async function completeClaimFor(prepared: Prepared, items: Item[]): Promise<CompleteAndClaimResult[]> {
  // A lease given twice in one group (never by the runner) goes one call at
  // a time, so the second sees the first, as in ./complete.ts.
  if (items.length > 1 && new Set(items.map((i) => i.lease.id)).size < items.length) {
    const out: CompleteAndClaimResult[] = [];
    for (const item of items) out.push(...(await completeClaimFor(prepared, [item])));
    return out;
  }
  const { workerId, params, lease } = items[0]!.claim;
  const { rows } = await prepared<JobRow & { done: string[] | null }>(q.COMPLETE_CLAIM_MANY, [
    ...params,
    items.map((i) => i.lease.id),
    items.map((i) => i.lease.ownerId),
    items.map((i) => i.lease.fencingToken),
    items.map((i) => i.json),
  ]);
  const done = new Set((rows[0]?.done ?? []).map(Number));
  const out = items.map(
    (i): CompleteAndClaimResult => (done.has(i.lease.id) ? { complete: { ok: true }, claim: NOTHING() } : { complete: LEASE_LOST, claim: NOTHING() }),
  );
  const claimers = out.filter((o) => o.complete.ok);
  let given = 0;
  let picked = 0;
  for (const row of rows) {
    if (row.id === null) continue; // the one row of a statement that claimed nothing
    picked++;
    const job = rowToJob(row);
    if (job.state !== 'running') claimers[0]!.claim.failed.push(failedFromJob(job));
    else claimers[given++]!.claim.lease = leaseFromJob(job, workerId, lease);
  }
  // Every pick was used and some were dead: more may be claimable, as in claimFor.
  const left = claimers.slice(given);
  if (picked === claimers.length && left.length > 0) {
    const again = await claimFor(prepared, workerId, params, lease, left.length);
    left.forEach((o, i) => {
      o.claim.lease = again[i]!.lease;
      o.claim.failed.push(...again[i]!.failed);
    });
  }
  return out;
}

/**
 * The store's completeAndClaim(): concurrent calls with the same claim
 * parameters share a statement (./group.ts), as claims do; a lone call goes
 * out at once.
 */
export function completeClaimer(
  prepared: Prepared,
  store: JobStoreOptions,
): (lease: LeaseRef, result: unknown, claim: ClaimOptions) => Promise<CompleteAndClaimResult> {
  const group = groupsByKey<Item, CompleteAndClaimResult>((onIdle) => new StatementGroup((items) => completeClaimFor(prepared, items), MAX_GROUP, onIdle));
  return async (lease, result, claim) => {
    // Checked before anything is sent: bad claim options throw, and nothing is completed.
    const c = claimParams(store, claim);
    return group(c.key).submit({ lease, json: toJson(result), claim: c });
  };
}
