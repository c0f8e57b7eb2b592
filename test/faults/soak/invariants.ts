import type { Effect } from '../toolkit/upstream-child.js';

/**
 * The soak's invariants, checked once everything has drained, on what the
 * databases and the (non-idempotent) upstream recorded. Each violation is one
 * line naming the job, key or entity, so a failed run says what went wrong.
 *
 * I1 every job ended: succeeded, or failed with a reason (and a job that
 *    failed on `outcome_unknown` has its gateway record in that state: it is
 *    visible to an operator, not lost);
 * I2 the upstream saw each charge (route that deduplicates by key) at most
 *    once per idempotency key, and each succeeded job exactly once;
 * I3 per entity, the upstream saw non-decreasing fences, in arrival order,
 *    across routes (G1, G3);
 * I4 no stale result stored: a succeeded job's result was written by the
 *    owner of its final token, and names a charge the upstream made for it;
 * I5 nothing is `in_progress` at the gateway (G4).
 */

export interface FinalJob {
  id: number;
  /** The job's entity and the base of its step keys (`tool-job:<store id>:<id>`, see docs/lease.md). */
  jobKey: string;
  state: string;
  token: number;
  reason: string | null;
  error: { code?: string } | null;
  result: { worker?: string; fence?: number; charge?: number | null; notify?: number | null } | null;
}

export interface FinalRecord {
  scope: string;
  key: string;
  state: string;
  entity: string | null;
  fence: string | null;
}

export interface FinalState {
  effects: Effect[];
  jobs: FinalJob[];
  records: FinalRecord[];
  rejections: { reason: string; n: number }[];
}

const MAX_LINES_PER_INVARIANT = 20;

export function checkInvariants(s: FinalState): string[] {
  const out: string[] = [];
  const section = (name: string, lines: string[]) => {
    out.push(...lines.slice(0, MAX_LINES_PER_INVARIANT).map((l) => `${name}: ${l}`));
    if (lines.length > MAX_LINES_PER_INVARIANT) out.push(`${name}: … and ${lines.length - MAX_LINES_PER_INVARIANT} more`);
  };
  const unknown = new Map(s.records.filter((r) => r.state === 'outcome_unknown').map((r) => [r.key, r]));
  const chargesByKey = new Map<string, Effect[]>();
  for (const e of s.effects) {
    if (!e.path.startsWith('/payments/') || e.key === null) continue;
    chargesByKey.set(e.key, [...(chargesByKey.get(e.key) ?? []), e]);
  }

  // I1
  const i1: string[] = [];
  for (const j of s.jobs) {
    if (j.state === 'queued' || j.state === 'running') i1.push(`job ${j.id} is still ${j.state} (token ${j.token})`);
    else if (j.state === 'failed' && !j.reason) i1.push(`job ${j.id} failed without a reason`);
    else if (j.state === 'failed' && j.reason === 'outcome_unknown' && !unknown.has(`${j.jobKey}:charge`)) {
      i1.push(`job ${j.id} failed on outcome_unknown but its charge record is not outcome_unknown`);
    } else if (j.state !== 'succeeded' && j.state !== 'failed') i1.push(`job ${j.id} ended ${j.state}`);
  }
  section('I1 every job ended', i1);

  // I2
  const i2: string[] = [];
  for (const [key, effects] of chargesByKey) {
    if (effects.length > 1) i2.push(`charge key ${key} reached the upstream ${effects.length} times (fences ${effects.map((e) => e.fence).join(', ')})`);
  }
  for (const j of s.jobs.filter((x) => x.state === 'succeeded')) {
    const n = chargesByKey.get(`${j.jobKey}:charge`)?.length ?? 0;
    if (n !== 1) i2.push(`succeeded job ${j.id} has ${n} charges upstream`);
  }
  section('I2 at most one charge per key', i2);

  // I3
  const i3: string[] = [];
  const highest = new Map<string, { fence: bigint; seq: number }>();
  for (const e of [...s.effects].sort((a, b) => a.seq - b.seq)) {
    if (e.entity === null || e.fence === null) {
      i3.push(`effect #${e.seq} (${e.path}) came without an entity or fence`);
      continue;
    }
    const f = BigInt(e.fence);
    const top = highest.get(e.entity);
    if (top !== undefined && f < top.fence) {
      i3.push(`${e.entity}: fence ${f} reached the upstream (#${e.seq} ${e.path}) after fence ${top.fence} (#${top.seq})`);
    } else {
      highest.set(e.entity, { fence: f, seq: e.seq });
    }
  }
  section('I3 non-decreasing fences per entity', i3);

  // I4
  const i4: string[] = [];
  const bySeq = new Map(s.effects.map((e) => [e.seq, e]));
  for (const j of s.jobs.filter((x) => x.state === 'succeeded')) {
    const r = j.result;
    if (r?.fence !== j.token) {
      i4.push(`job ${j.id}: stored result written with fence ${r?.fence} but the job's token is ${j.token}`);
      continue;
    }
    const charge = r.charge === null || r.charge === undefined ? undefined : bySeq.get(r.charge);
    if (charge === undefined || charge.entity !== j.jobKey || charge.key !== `${j.jobKey}:charge`) {
      i4.push(`job ${j.id}: its result names charge #${r.charge}, which the upstream did not make for this job`);
    } else if (BigInt(charge.fence ?? '0') > BigInt(j.token)) {
      i4.push(`job ${j.id}: its charge carries fence ${charge.fence}, above the job's token ${j.token}`);
    }
  }
  section('I4 no stale result stored', i4);

  // I5
  section(
    'I5 nothing in_progress',
    s.records.filter((r) => r.state === 'in_progress').map((r) => `record ${r.scope}/${r.key} is still in_progress`),
  );
  return out;
}
