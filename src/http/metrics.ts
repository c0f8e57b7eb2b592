/**
 * Prometheus metrics, hand-written text exposition (format 0.0.4): no
 * dependency, and the same code runs on Node and Workers. Every label set is
 * bounded: route names come from the config, outcomes from the table below.
 */
import { SWEEP_BACKLOG_CAP } from '../store/sweep.js';
import { SWEEP_KINDS, type SweepKind, type SweepResult } from '../store/types.js';

/** The `outcome` label, per proxy decision (the decision codes of the log line). */
const OUTCOMES: Record<string, string> = {
  forwarded: 'accepted',
  'forwarded-released': 'accepted',
  replayed: 'replayed',
  'stale-fence': 'stale',
  'idempotency-key-reused': 'mismatch',
  'idempotency-in-progress': 'in_progress',
  'entity-busy': 'busy',
  'outcome-unknown': 'unknown',
  'upstream-unavailable': 'upstream_error',
  'upstream-timeout': 'upstream_error',
  'upstream-response-too-large': 'upstream_error',
  'upstream-response-too-large-released': 'upstream_error',
  unauthorized: 'unauthorized',
  forbidden: 'forbidden',
  'invalid-fence-signature': 'invalid_signature',
  'fence-expired': 'fence_expired',
  'store-unavailable': 'store_error',
  'admission-expired': 'admission_expired',
  'no-route': 'no_route',
  'internal-error': 'internal_error',
};

/** The sweeper's kinds of row → the `kind` label of its metrics. */
const SWEEP_LABELS: Record<SweepKind, string> = {
  expiredRecords: 'expired_records',
  unknownRecords: 'dead_records',
  oldRejections: 'rejections',
  oldEntities: 'fence_entities',
  oldFenceHistory: 'fence_history',
  oldOperatorActions: 'operator_actions',
};

/** Decision code → `outcome` label; 400s and 413 are `invalid`. */
export function outcomeOf(decision: string): string {
  return OUTCOMES[decision.replace(/-after-takeover$/, '')] ?? 'invalid';
}

const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
const OVERHEAD_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5];

class Histogram {
  readonly counts: number[];
  sum = 0;
  count = 0;
  constructor(readonly buckets: number[]) {
    this.counts = new Array(buckets.length).fill(0);
  }
  observe(v: number): void {
    this.sum += v;
    this.count++;
    for (let i = 0; i < this.buckets.length; i++) if (v <= this.buckets[i]!) this.counts[i]!++;
  }
}

export interface RequestObservation {
  route: string | null;
  decision: string;
  status: number;
  totalMs: number;
  upstreamMs: number | undefined;
}

export interface Gauges {
  inflight: number;
  /** From the store; absent when the store could not answer (then `fencegate_store_up 0`). */
  stats?: { rejections: number; outcomeUnknown: number } | null;
}

export interface Metrics {
  observe(o: RequestObservation): void;
  /** One sweep's result (rows swept, backlog left) and how long it took. */
  swept(r: SweepResult, durationMs: number): void;
  /** A sweep that failed (its batches before the fault are committed). */
  sweepFailed(): void;
  render(gauges: Gauges): string;
}

/**
 * @example
 * const metrics = createMetrics();
 * metrics.observe({ route: 'payments', decision: 'forwarded', status: 201, totalMs: 12, upstreamMs: 10 });
 * metrics.render({ inflight: 0, stats: { rejections: 3, outcomeUnknown: 0 } });
 */
export function createMetrics(): Metrics {
  const requests = new Map<string, number>();
  const upstream = new Map<string, Histogram>();
  const overhead = new Map<string, Histogram>();
  const swept = new Map<SweepKind, number>(SWEEP_KINDS.map((k) => [k, 0]));
  const sweeps = { ok: 0, failed: 0 };
  let lastSweep: { backlog: SweepResult['backlog']; seconds: number } | null = null;
  const hist = (m: Map<string, Histogram>, route: string, buckets: number[]) => {
    let h = m.get(route);
    if (h === undefined) m.set(route, (h = new Histogram(buckets)));
    return h;
  };
  return {
    observe(o) {
      const route = o.route ?? '';
      const k = `${route}\u0000${outcomeOf(o.decision)}`;
      requests.set(k, (requests.get(k) ?? 0) + 1);
      if (o.upstreamMs !== undefined) hist(upstream, route, LATENCY_BUCKETS).observe(o.upstreamMs / 1000);
      // Overhead: everything but the upstream exchange (parsing, store, waits for the serial slot).
      hist(overhead, route, OVERHEAD_BUCKETS).observe(Math.max(0, o.totalMs - (o.upstreamMs ?? 0)) / 1000);
    },
    swept(r, durationMs) {
      for (const k of SWEEP_KINDS) swept.set(k, swept.get(k)! + r[k]);
      sweeps.ok++;
      lastSweep = { backlog: { ...r.backlog }, seconds: durationMs / 1000 };
    },
    sweepFailed() {
      sweeps.failed++;
    },
    render(g) {
      const out: string[] = [];
      out.push('# HELP fencegate_requests_total Proxied requests by route and outcome.', '# TYPE fencegate_requests_total counter');
      for (const [k, n] of [...requests].sort()) {
        const [route, outcome] = k.split('\u0000') as [string, string];
        out.push(`fencegate_requests_total{route="${esc(route)}",outcome="${outcome}"} ${n}`);
      }
      renderHistogram(out, 'fencegate_upstream_duration_seconds', 'Upstream exchange time, response body included.', upstream);
      renderHistogram(out, 'fencegate_overhead_duration_seconds', 'Time the gateway adds: total minus the upstream exchange.', overhead);
      out.push('# HELP fencegate_inflight_requests Proxied requests being handled now.', '# TYPE fencegate_inflight_requests gauge', `fencegate_inflight_requests ${g.inflight}`);
      out.push('# HELP fencegate_store_up Whether the store answered this scrape.', '# TYPE fencegate_store_up gauge', `fencegate_store_up ${g.stats ? 1 : 0}`);
      if (g.stats) {
        out.push('# HELP fencegate_rejection_log_rows Rows in the rejection log.', '# TYPE fencegate_rejection_log_rows gauge', `fencegate_rejection_log_rows ${g.stats.rejections}`);
        out.push(
          '# HELP fencegate_outcome_unknown_records Idempotency records waiting for an operator.',
          '# TYPE fencegate_outcome_unknown_records gauge',
          `fencegate_outcome_unknown_records ${g.stats.outcomeUnknown}`,
        );
      }
      out.push('# HELP fencegate_sweeps_total Sweeps run, by result.', '# TYPE fencegate_sweeps_total counter');
      out.push(`fencegate_sweeps_total{result="ok"} ${sweeps.ok}`, `fencegate_sweeps_total{result="failed"} ${sweeps.failed}`);
      out.push(
        '# HELP fencegate_swept_rows_total Rows the sweeper deleted (dead_records: in-progress records whose lock expired, marked outcome_unknown).',
        '# TYPE fencegate_swept_rows_total counter',
      );
      for (const k of SWEEP_KINDS) out.push(`fencegate_swept_rows_total{kind="${SWEEP_LABELS[k]}"} ${swept.get(k)}`);
      if (lastSweep !== null) {
        const last: { backlog: SweepResult['backlog']; seconds: number } = lastSweep;
        out.push(
          `# HELP fencegate_sweep_backlog_rows Rows still past their retention when the last sweep stopped (0: it caught up; counted up to ${SWEEP_BACKLOG_CAP}).`,
          '# TYPE fencegate_sweep_backlog_rows gauge',
        );
        for (const k of SWEEP_KINDS) out.push(`fencegate_sweep_backlog_rows{kind="${SWEEP_LABELS[k]}"} ${last.backlog[k]}`);
        out.push('# HELP fencegate_sweep_duration_seconds How long the last sweep took.', '# TYPE fencegate_sweep_duration_seconds gauge', `fencegate_sweep_duration_seconds ${last.seconds}`);
      }
      return out.join('\n') + '\n';
    },
  };
}

function renderHistogram(out: string[], name: string, help: string, m: Map<string, Histogram>): void {
  out.push(`# HELP ${name} ${help}`, `# TYPE ${name} histogram`);
  for (const [route, h] of [...m].sort(([a], [b]) => (a < b ? -1 : 1))) {
    const r = `route="${esc(route)}"`;
    h.buckets.forEach((le, i) => out.push(`${name}_bucket{${r},le="${le}"} ${h.counts[i]}`));
    out.push(`${name}_bucket{${r},le="+Inf"} ${h.count}`, `${name}_sum{${r}} ${h.sum}`, `${name}_count{${r}} ${h.count}`);
  }
}

function esc(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}
