import { claimRequest, failedFromJob, LEASE_LOST, leaseFromJob, type leaseTable, toJson } from '../store-common.js';
import type { ClaimOptions, ClaimResult, CompleteAndClaimResult, CompleteResult, JobStoreOptions, LeaseRef } from '../types.js';
import { firstStatement, MAX_GROUP, RunAlone, StatementGroup } from './group.js';
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
 * for at most `rounds` rounds.
 *
 * Only the first round's failure throws. Each round commits on its own:
 * once one has, the leases it claimed and the dead jobs it finalised must
 * reach their callers (a lease nobody hears of stays running, with no
 * heartbeat, until it runs out), so a later round that fails ends the
 * rounds, and those still waiting get no lease, as when nothing was left.
 */
async function claimFor(
  prepared: Prepared,
  workerId: string,
  params: unknown[],
  lease: ReturnType<typeof leaseTable>,
  callers: number,
  rounds = MAX_DEAD_PER_CLAIM,
): Promise<ClaimResult[]> {
  const results: ClaimResult[] = Array.from({ length: callers }, () => ({ lease: null, failed: [] }));
  let waiting = results;
  for (let round = 0; round < rounds && waiting.length > 0; round++) {
    const want = waiting.length;
    let rows: JobRow[];
    try {
      const send = () => (want === 1 ? prepared<JobRow>(q.CLAIM, params) : prepared<JobRow>(q.CLAIM_MANY, [...params, want]));
      ({ rows } = round === 0 ? await firstStatement(send) : await send());
    } catch (err) {
      if (round === 0) throw err;
      break;
    }
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
function claimParams(store: JobStoreOptions, claim: ClaimOptions) {
  const { workerId, kinds, lease } = claimRequest(store, claim);
  const params: unknown[] = [workerId, kinds, lease.defaultMs, JSON.stringify(lease.byKind)];
  return { workerId, lease, params, key: JSON.stringify(params) };
}

type Claim = ReturnType<typeof claimParams>;
/** A call of a claim group: a claim, or a complete whose claim runs only if it matched. */
type Item = { claim: Claim; complete?: { lease: LeaseRef; json: string } };
type Served = { complete?: CompleteResult; claim: ClaimResult };

/**
 * Serves the calls of a claim group in one statement: CLAIM or CLAIM_MANY
 * when none of them completes, else COMPLETE_CLAIM_MANY, which claims for
 * each plain claim and for each complete that matched (a stale lease claims
 * nothing). Jobs found dead are reported once (to the first claimer); the
 * claimers left without a lease because some picked jobs were dead claim
 * again through claimFor, as a claim alone would.
 */
async function serve(prepared: Prepared, items: Item[]): Promise<Served[]> {
  const { workerId, params, lease } = items[0]!.claim;
  const completing = items.filter((i) => i.complete);
  if (completing.length === 0) return (await claimFor(prepared, workerId, params, lease, items.length)).map((claim) => ({ claim }));
  // A lease given twice in one group (never by the runner): the group goes
  // one call at a time, so the second sees the first, as in ./complete.ts.
  if (new Set(completing.map((i) => i.complete!.lease.id)).size < completing.length) throw new RunAlone();
  const { rows } = await firstStatement(() =>
    prepared<JobRow & { done: string[] | null }>(q.COMPLETE_CLAIM_MANY, [
      ...params,
      completing.map((i) => i.complete!.lease.id),
      completing.map((i) => i.complete!.lease.ownerId),
      completing.map((i) => i.complete!.lease.fencingToken),
      completing.map((i) => i.complete!.json),
      items.length - completing.length,
    ]),
  );
  const done = new Set((rows[0]?.done ?? []).map(Number));
  const out = items.map((i): Served => {
    const claim: ClaimResult = { lease: null, failed: [] };
    if (!i.complete) return { claim };
    return { complete: done.has(Number(i.complete.lease.id)) ? { ok: true } : LEASE_LOST, claim };
  });
  const claimers = out.filter((o) => o.complete?.ok !== false);
  let given = 0;
  let picked = 0;
  for (const row of rows) {
    if (row.id === null) continue; // the one row of a statement that claimed nothing
    picked++;
    const job = rowToJob(row);
    if (job.state !== 'running') claimers[0]!.claim.failed.push(failedFromJob(job));
    else claimers[given++]!.claim.lease = leaseFromJob(job, workerId, lease);
  }
  // Every pick was used and some were dead: more may be claimable. The
  // statement above has committed: its completes and leases must reach
  // their callers whatever the follow-up does, so a follow-up that fails
  // leaves those waiting on it without a lease (as when nothing was left)
  // instead of failing the group. One round only: the group's completes
  // wait for it with their heartbeats already stopped (../runner/attempt.ts,
  // endAttempt), so their leases run down meanwhile (DESIGN §6.3); a claimer
  // left without a lease claims again through its lane. Chosen over keeping
  // the heartbeat until the complete settles: a heartbeat after the commit
  // matches no row and would report the lease lost. (A plain claim already
  // in flight ahead of them may still take its dead-job rounds, each one
  // short statement.)
  const left = claimers.slice(given);
  if (picked === claimers.length && left.length > 0) {
    let again: ClaimResult[] = [];
    try {
      again = await claimFor(prepared, workerId, params, lease, left.length, 1);
    } catch {
      // Committed above; the follow-up claimed nothing.
    }
    again.forEach((r, i) => {
      left[i]!.claim.lease = r.lease;
      left[i]!.claim.failed.push(...r.failed);
    });
  }
  return out;
}

/**
 * The store's claim() and completeAndClaim(). Concurrent calls with the same
 * owner, kinds and leases share a group (./group.ts): one statement in
 * flight, the calls that arrive meanwhile together in the next one, so a
 * worker's claims through one store never run at once, whichever call
 * carries them, and its jobs sharing a custom fence key see each other's
 * tokens. A lone call goes out at once.
 */
export function claimers(prepared: Prepared, store: JobStoreOptions) {
  const groups = new Map<string, StatementGroup<Item, Served>>();
  const submit = (item: Item) => {
    const { key } = item.claim;
    let group = groups.get(key);
    if (!group) {
      group = new StatementGroup(
        (items: Item[]) => serve(prepared, items),
        MAX_GROUP,
        () => groups.delete(key),
        // A runner slot whose complete claimed its next job comes back with its next complete.
        (item) => item.complete !== undefined,
      );
      groups.set(key, group);
    }
    return group.submit(item);
  };
  return {
    claim: async (claim: ClaimOptions): Promise<ClaimResult> => (await submit({ claim: claimParams(store, claim) })).claim,
    async completeAndClaim(lease: LeaseRef, result: unknown, claim: ClaimOptions): Promise<CompleteAndClaimResult> {
      // Checked before anything is sent: bad claim options throw, and nothing is completed.
      const c = claimParams(store, claim);
      const served = await submit({ claim: c, complete: { lease, json: toJson(result) } });
      return { complete: served.complete!, claim: served.claim };
    },
  };
}
