/**
 * What the gateway counts, on any backend: the hand-written text exposition
 * (./metrics-text.ts, the default, no dependency, Workers and Node alike) or
 * prom-client (./metrics-node.ts, the Node entry). Names and labels are in
 * ./metrics-spec.ts; docs/metrics.md is the reference.
 */
import { SWEEP_KINDS, type SweepKind, type SweepResult } from '../store/types.js';
import { decisionOutcomeOf, FENCEGATE_VERSION, KNOWN_COARSE, KNOWN_REASONS, knownDecisionSeries, outcomeOf, rejectionReasonOf, SPECS } from './metrics-spec.js';
import { createTextBackend, type MetricBackend } from './metrics-text.js';

export { outcomeOf, decisionOutcomeOf, rejectionReasonOf } from './metrics-spec.js';

/** The sweeper's kinds of row → the `kind` label of its metrics. */
const SWEEP_LABELS: Record<SweepKind, string> = {
  expiredRecords: 'expired_records',
  unknownRecords: 'dead_records',
  oldRejections: 'rejections',
  oldEntities: 'fence_entities',
  oldFenceHistory: 'fence_history',
  oldOperatorActions: 'operator_actions',
  oldCommands: 'commands',
};

export interface RequestObservation {
  route: string | null;
  decision: string;
  status: number;
  totalMs: number;
  upstreamMs: number | undefined;
  /** An mcp route's tools/call: the tool's name (or `_unlisted`: ./mcp/codec.ts keeps the set bounded). */
  tool?: string;
}

export interface Gauges {
  inflight: number;
  /** From the store; absent when the store could not answer (then `fencegate_store_up 0`). */
  stats?: { rejections: number; outcomeUnknown: number } | null;
  /** A PostgreSQL store's pool (pg's `totalCount`, `idleCount`, `waitingCount`); absent for other stores. */
  pool?: { total: number; idle: number; waiting: number };
  /** A PostgreSQL store's replication check (1 at risk, 0 safe); absent when it cannot tell or for other stores. */
  asyncReplication?: number;
}

/** A store call's end: `discarded` is a finish the store refused (the record had another owner). */
export type StoreCallResult = 'ok' | 'error' | 'discarded';

/** The age buckets of fencegate_reconcile_unknown_records. */
export const RECONCILE_AGES = ['under_1m', 'under_1h', 'under_1d', 'over_1d'] as const;
export type ReconcileAge = (typeof RECONCILE_AGES)[number];

/** One background reconcile pass over the outcome_unknown records (../http/reconciler.ts). */
export interface ReconcilePassGauges {
  /** Per route with reconcile: its outcome_unknown records by age. */
  unknown: Map<string, Record<ReconcileAge, number>>;
  /** Per route with reconcile: those past its maxAge. */
  gaveUp: Map<string, number>;
}

export interface Metrics {
  observe(o: RequestObservation): void;
  /** One admit or finish call to the store, how long it took and how it ended. */
  storeCall(op: 'admit' | 'finish', ms: number, result: StoreCallResult): void;
  /** One group committed (SQLite: admissions and finishes; PostgreSQL: one grouped statement): how many decisions, and its WAL sync's time (null: no sync of its own). */
  storeGroup(size: number, syncMs: number | null): void;
  /** One sweep's result (rows swept, backlog left) and how long it took. */
  swept(r: SweepResult, durationMs: number): void;
  /** A sweep that failed (its batches before the fault are committed). */
  sweepFailed(): void;
  /** One status query's result (./pipeline/reconcile.ts). */
  reconciled(route: string, result: string): void;
  /** The gauges of the last background reconcile pass. */
  reconcilePass(p: ReconcilePassGauges): void;
  render(gauges: Gauges): string | Promise<string>;
  /** The Content-Type of `render()`. */
  readonly contentType: string;
}

export interface MetricsOptions {
  /** Default: the text backend. */
  backend?: MetricBackend;
  /** Route names: their known series start at zero. */
  routes?: readonly string[];
  /** Routes with `reconcile`: their reconcile series start at zero. None: no reconcile series at all. */
  reconcileRoutes?: readonly string[];
  /** The `node` label of fencegate_build_info. Default: the runtime's `process.versions.node`, or "". */
  nodeVersion?: string;
}

/**
 * @example
 * const metrics = createMetrics({ routes: ['payments'] });
 * metrics.observe({ route: 'payments', decision: 'forwarded', status: 201, totalMs: 12, upstreamMs: 10 });
 * await metrics.render({ inflight: 0, stats: { rejections: 3, outcomeUnknown: 0 } });
 */
export function createMetrics(options: MetricsOptions = {}): Metrics {
  const b = options.backend ?? createTextBackend();
  const m = {
    requests: b.metric(SPECS.requests),
    decisions: b.metric(SPECS.decisions),
    rejections: b.metric(SPECS.rejections),
    toolCalls: b.metric(SPECS.toolCalls),
    total: b.metric(SPECS.total),
    upstream: b.metric(SPECS.upstream),
    overhead: b.metric(SPECS.overhead),
    store: b.metric(SPECS.store),
    groupSize: b.metric(SPECS.groupSize),
    groupSync: b.metric(SPECS.groupSync),
    storeErrors: b.metric(SPECS.storeErrors),
    lateFinishes: b.metric(SPECS.lateFinishes),
    inflight: b.metric(SPECS.inflight),
    storeUp: b.metric(SPECS.storeUp),
    rejectionRows: b.metric(SPECS.rejectionRows),
    unknownRecords: b.metric(SPECS.unknownRecords),
    sweeps: b.metric(SPECS.sweeps),
    swept: b.metric(SPECS.swept),
    buildInfo: b.metric(SPECS.buildInfo),
  };
  // Known series at zero: an alert on increase(...) sees the first event.
  for (const route of options.routes ?? []) {
    for (const o of KNOWN_COARSE) m.requests.inc([route, o], 0);
    for (const [o, status] of knownDecisionSeries()) m.decisions.inc([route, o, status], 0);
    for (const r of KNOWN_REASONS) m.rejections.inc([route, r], 0);
  }
  for (const op of ['admit', 'finish']) m.storeErrors.inc([op], 0);
  m.lateFinishes.inc([], 0);
  m.sweeps.inc(['ok'], 0);
  m.sweeps.inc(['failed'], 0);
  for (const k of SWEEP_KINDS) m.swept.inc([SWEEP_LABELS[k]], 0);
  // Only with a route that has reconcile: without one, /metrics is as it was.
  const reconciles = (options.reconcileRoutes?.length ?? 0) > 0 ? b.metric(SPECS.reconciles) : null;
  for (const route of options.reconcileRoutes ?? [])
    for (const r of ['found', 'not-found', 'not-yet-trusted', 'unknown', 'error']) reconciles!.inc([route, r], 0);
  let reconcileGauges: { unknown: ReturnType<MetricBackend['metric']>; gaveUp: ReturnType<MetricBackend['metric']> } | null = null;
  m.buildInfo.set([FENCEGATE_VERSION, options.nodeVersion ?? (globalThis as { process?: { versions?: { node?: string } } }).process?.versions?.node ?? ''], 1);
  // Shown from the first sweep (before it there is no backlog to tell), and a pool only for a store that has one.
  let lastSweep: { backlog: ReturnType<MetricBackend['metric']>; seconds: ReturnType<MetricBackend['metric']> } | null = null;
  let pool: ReturnType<MetricBackend['metric']> | null = null;
  let asyncReplication: ReturnType<MetricBackend['metric']> | null = null;

  return {
    contentType: b.contentType,
    observe(o) {
      const route = o.route ?? '';
      m.requests.inc([route, outcomeOf(o.decision)]);
      m.decisions.inc([route, decisionOutcomeOf(o.decision), String(o.status)]);
      const reason = rejectionReasonOf(o.decision);
      if (reason !== null) m.rejections.inc([route, reason]);
      if (o.tool !== undefined) m.toolCalls.inc([route, o.tool, outcomeOf(o.decision)]);
      m.total.observe([route], o.totalMs / 1000);
      if (o.upstreamMs !== undefined) m.upstream.observe([route], o.upstreamMs / 1000);
      // Overhead: everything but the upstream exchange (parsing, store, waits for the serial slot).
      m.overhead.observe([route], Math.max(0, o.totalMs - (o.upstreamMs ?? 0)) / 1000);
    },
    storeCall(op, ms, result) {
      m.store.observe([op], ms / 1000);
      if (result === 'error') m.storeErrors.inc([op]);
      if (result === 'discarded') m.lateFinishes.inc([]);
    },
    storeGroup(size, syncMs) {
      m.groupSize.observe([], size);
      if (syncMs !== null) m.groupSync.observe([], syncMs / 1000);
    },
    swept(r, durationMs) {
      for (const k of SWEEP_KINDS) m.swept.inc([SWEEP_LABELS[k]], r[k]);
      m.sweeps.inc(['ok']);
      lastSweep ??= { backlog: b.metric(SPECS.backlog), seconds: b.metric(SPECS.sweepSeconds) };
      for (const k of SWEEP_KINDS) lastSweep.backlog.set([SWEEP_LABELS[k]], r.backlog[k]);
      lastSweep.seconds.set([], durationMs / 1000);
    },
    sweepFailed() {
      m.sweeps.inc(['failed']);
    },
    reconciled(route, result) {
      reconciles?.inc([route, result]);
    },
    reconcilePass(p) {
      reconcileGauges ??= { unknown: b.metric(SPECS.reconcileUnknown), gaveUp: b.metric(SPECS.reconcileGaveUp) };
      for (const [route, ages] of p.unknown) for (const age of RECONCILE_AGES) reconcileGauges.unknown.set([route, age], ages[age]);
      for (const [route, n] of p.gaveUp) reconcileGauges.gaveUp.set([route], n);
    },
    render(g) {
      m.inflight.set([], g.inflight);
      m.storeUp.set([], g.stats ? 1 : 0);
      if (g.stats) {
        m.rejectionRows.set([], g.stats.rejections);
        m.unknownRecords.set([], g.stats.outcomeUnknown);
      } else {
        m.rejectionRows.reset();
        m.unknownRecords.reset();
      }
      if (g.pool !== undefined) {
        pool ??= b.metric(SPECS.pool);
        for (const state of ['total', 'idle', 'waiting'] as const) pool.set([state], g.pool[state]);
      }
      if (g.asyncReplication !== undefined) {
        asyncReplication ??= b.metric(SPECS.asyncReplication);
        asyncReplication.set([], g.asyncReplication);
      } else asyncReplication?.reset();
      return b.render();
    },
  };
}
