import { SWEEP_KINDS, type SweepKind, type SweepOptions, type SweepResult } from './types.js';

/** Rows per batch by default: one batch is one short write transaction. */
export const SWEEP_BATCH = 1000;
/** Default bound on one sweep: no new batch starts after this. */
export const SWEEP_TIME_BUDGET_MS = 10_000;
/** A backlog is counted up to this many rows, so that counting it stays cheap however far behind the sweeper is. */
export const SWEEP_BACKLOG_CAP = 100_000;

/** One kind of row a store sweeps. */
export interface SweepStep {
  /** Deletes (or marks) at most `batch` rows past their retention, in one write transaction; how many it did. */
  run(batch: number): Promise<number>;
  /** How many rows are still past their retention, counted up to `cap`. */
  count(cap: number): Promise<number>;
}

/**
 * The steps of one sweep with these options: a step for each kind of row the
 * options sweep, built by `step` from the kind and its retention (whole ms,
 * at least 0; null for the two kinds of record, which expire by their own
 * columns). A kind whose retention is not given is kept, so it has no step.
 */
export function sweepSteps(options: SweepOptions, step: (kind: SweepKind, retentionMs: number | null) => SweepStep): Partial<Record<SweepKind, SweepStep>> {
  const ms = (v: number) => Math.max(0, Math.floor(v));
  const retentions: Partial<Record<SweepKind, number | null>> = { expiredRecords: null, unknownRecords: null, oldRejections: ms(options.rejectionRetentionMs) };
  if (options.entityRetentionMs !== undefined) retentions.oldEntities = retentions.oldFenceHistory = ms(options.entityRetentionMs);
  if (options.operatorActionRetentionMs !== undefined) retentions.oldOperatorActions = ms(options.operatorActionRetentionMs);
  if (options.commandRetentionMs !== undefined) retentions.oldCommands = ms(options.commandRetentionMs);
  const steps: Partial<Record<SweepKind, SweepStep>> = {};
  for (const kind of SWEEP_KINDS) if (retentions[kind] !== undefined) steps[kind] = step(kind, retentions[kind]!);
  return steps;
}

export interface SweepHooks {
  /** Gives the event loop a turn between batches. Default: a zero timeout. */
  yieldTurn?: () => Promise<void>;
  /** True once the store is closing: no new batch starts. */
  stopped?: () => boolean;
}

/**
 * The sweep every store runs: batches of `batch` rows, one kind after the
 * other in turn (so that a deep backlog of one kind never starves the
 * others), each kind until a batch comes back short, with a turn of the
 * event loop between batches so that no batch waits behind another and the
 * write lock (SQLite's, or PostgreSQL's row locks) is held one short
 * transaction at a time. It stops starting batches once `timeBudgetMs` has
 * passed (after at least one batch per kind, so it always progresses), and
 * then counts what is left of each kind it cut off: the backlog `/metrics`
 * shows. A kind without a step (no retention given) is skipped.
 *
 * The counts are exact at the moment each kind finished; rows that pass
 * their retention later belong to the next sweep.
 */
export async function sweepInBatches(steps: Partial<Record<SweepKind, SweepStep>>, options: SweepOptions, hooks: SweepHooks = {}): Promise<SweepResult> {
  const batch = Math.floor(options.batch ?? SWEEP_BATCH);
  if (!(batch >= 1)) throw new RangeError(`sweep: batch must be at least 1, not ${options.batch}`);
  const maxBatches = options.maxBatches ?? Infinity;
  if (!(maxBatches >= 1)) throw new RangeError(`sweep: maxBatches must be at least 1, not ${options.maxBatches}`);
  const deadline = Date.now() + Math.max(0, options.timeBudgetMs ?? SWEEP_TIME_BUDGET_MS);
  const yieldTurn = hooks.yieldTurn ?? (() => new Promise<void>((resolve) => setTimeout(resolve, 0)));
  const stopped = hooks.stopped ?? (() => false);

  const result: SweepResult = {
    expiredRecords: 0,
    unknownRecords: 0,
    oldRejections: 0,
    oldEntities: 0,
    oldFenceHistory: 0,
    oldOperatorActions: 0,
    oldCommands: 0,
    backlog: { expiredRecords: 0, unknownRecords: 0, oldRejections: 0, oldEntities: 0, oldFenceHistory: 0, oldOperatorActions: 0, oldCommands: 0 },
    batches: 0,
  };
  let active = SWEEP_KINDS.filter((k) => steps[k] !== undefined);
  /** Kinds whose last batch came back short: nothing of them was left past its retention. */
  const done = new Set<SweepKind>();
  /** Kinds stopped with a full last batch (maxBatches, the time budget): rows may be left. */
  const cut = new Set<SweepKind>();
  const runs = new Map<SweepKind, number>();
  for (let round = 0; active.length > 0; round++) {
    if (round > 0 && Date.now() >= deadline) break;
    for (const kind of active) {
      if (stopped()) return result;
      const n = await steps[kind]!.run(batch);
      result[kind] += n;
      result.batches++;
      const ran = (runs.get(kind) ?? 0) + 1;
      runs.set(kind, ran);
      if (n < batch) done.add(kind);
      else if (ran >= maxBatches) cut.add(kind);
      await yieldTurn();
    }
    active = active.filter((k) => !done.has(k) && !cut.has(k));
  }
  for (const kind of active) cut.add(kind);
  for (const kind of cut) {
    if (stopped()) break;
    result.backlog[kind] = await steps[kind]!.count(SWEEP_BACKLOG_CAP);
  }
  return result;
}
