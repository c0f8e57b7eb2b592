/**
 * `worker.metrics()` in Prometheus form: a prom-client Registry whose values
 * are read from the worker at each scrape, by job kind plus labels of the
 * user's own (model, provider, …). Counters come from the runner's events
 * (./metrics.ts), gauges from the attempts running at scrape time.
 */
import { Counter, Gauge, Registry } from 'prom-client';
import { LeaseConfigError } from './errors.js';
import { LOSS_CAUSES, type KindCounters, type LeaseMetrics } from './metrics.js';

export interface LeaseMetricsRegistryOptions {
  /** Labels added to every series, e.g. `{ model: 'gpt-x', provider: 'acme' }`: a fixed, small set per worker. */
  labels?: Record<string, string>;
  /** Kinds whose counters start at zero before their first event (an alert on `increase()` then sees the first one). */
  kinds?: readonly string[];
  /** Register into this registry (e.g. the one your server already serves). Default: a new one. */
  registry?: Registry;
}

const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const RESERVED = new Set(['kind', 'cause', 'result', 'le']);

type CounterKey = Exclude<keyof KindCounters, 'lostByCause' | 'leasesLost' | 'committed' | 'rejected' | 'failed'>;

const COUNTERS: [name: string, key: CounterKey, help: string][] = [
  ['fencegate_lease_claims_total', 'claimed', 'Jobs this worker claimed.'],
  ['fencegate_lease_reclaims_total', 'reclaimed', "Claims that took over a lease which had expired in another owner's hands."],
  ['fencegate_lease_heartbeats_total', 'heartbeatsOk', 'Heartbeats (lease extends) that succeeded.'],
  ['fencegate_lease_extend_failures_total', 'extendsFailed', 'Lease extends that failed with an error (not zero rows).'],
  [
    'fencegate_lease_ownership_unknown_total',
    'ownershipUnknown',
    'Times a lease could not be confirmed for another heartbeat interval (no new external action may start).',
  ],
  ['fencegate_lease_tool_requests_total', 'toolRequests', 'External actions started (fencedFetch, step).'],
  ['fencegate_lease_stage_timeouts_total', 'stageTimeouts', "Attempts that ran past their kind's maxRunMs."],
];

/**
 * @example
 * const registry = leaseMetricsRegistry(worker, { labels: { model: 'gpt-x', provider: 'acme' }, kinds: ['payment'] });
 * http.createServer(async (_req, res) => res.end(await registry.metrics())).listen(9464, '127.0.0.1');
 */
export function leaseMetricsRegistry(worker: { metrics(): LeaseMetrics }, options: LeaseMetricsRegistryOptions = {}): Registry {
  const user = options.labels ?? {};
  for (const name of Object.keys(user)) {
    if (!LABEL_NAME.test(name) || name.startsWith('__') || RESERVED.has(name)) {
      throw new LeaseConfigError(`labels.${name}: a label name must match ${LABEL_NAME}, not start with __, and not be one of ${[...RESERVED].join(', ')}`);
    }
  }
  const userNames = Object.keys(user);
  const registry = options.registry ?? new Registry();
  const kinds = options.kinds ?? [];
  // One snapshot per scrape, shared by every metric's collect.
  let snap: { at: number; m: LeaseMetrics } | null = null;
  const read = (): LeaseMetrics => {
    const now = performance.now();
    if (snap === null || now - snap.at > 50) snap = { at: now, m: worker.metrics() };
    return snap.m;
  };
  const counters = (): [string, KindCounters | undefined][] => {
    const m = read().counters;
    return [...new Set([...kinds, ...Object.keys(m)])].map((k) => [k, m[k]]);
  };
  const counter = (name: string, help: string, extra: string[], fill: (set: (labels: Record<string, string>, n: number) => void) => void) =>
    new Counter({
      name,
      help,
      labelNames: ['kind', ...extra, ...userNames],
      registers: [registry],
      collect() {
        this.reset();
        fill((labels, n) => this.inc({ ...labels, ...user }, n));
      },
    });
  for (const [name, key, help] of COUNTERS) {
    counter(name, help, [], (set) => {
      for (const [kind, c] of counters()) set({ kind }, c?.[key] ?? 0);
    });
  }
  counter(
    'fencegate_lease_lost_total',
    'Leases this worker lost, by cause (zero_rows, unconfirmed: the lease ran out or a newer owner took it; stalled; stale_fence; thread_exit).',
    ['cause'],
    (set) => {
      for (const [kind, c] of counters()) for (const cause of LOSS_CAUSES) set({ kind, cause }, c?.lostByCause[cause] ?? 0);
    },
  );
  counter(
    'fencegate_lease_attempts_total',
    'Attempts ended, by result: committed, rejected (not stored: lease lost, timed out, store error), failed (retried or terminal).',
    ['result'],
    (set) => {
      for (const [kind, c] of counters()) {
        set({ kind, result: 'committed' }, c?.committed ?? 0);
        set({ kind, result: 'rejected' }, c?.rejected ?? 0);
        set({ kind, result: 'failed' }, c?.failed ?? 0);
      }
    },
  );
  const gauge = (name: string, help: string, value: (g: LeaseMetrics['gauges'][string]) => number | null) =>
    new Gauge({
      name,
      help,
      labelNames: ['kind', ...userNames],
      registers: [registry],
      collect() {
        this.reset();
        const g = read().gauges;
        for (const kind of new Set([...kinds, ...Object.keys(g)])) {
          const v = g[kind] === undefined ? (name === 'fencegate_lease_running' ? 0 : null) : value(g[kind]);
          if (v !== null) this.set({ kind, ...user }, v);
        }
      },
    });
  gauge('fencegate_lease_running', 'Attempts running now.', (g) => g.running);
  gauge(
    'fencegate_lease_heartbeat_age_seconds',
    'Age of the oldest last good heartbeat among running attempts (absent when none runs).',
    (g) => g.maxHeartbeatAgeMs / 1000,
  );
  gauge(
    'fencegate_lease_time_left_seconds',
    'Shortest confirmed lease time left among running attempts (absent when none runs; negative: past the conservative deadline).',
    (g) => (g.minLeaseLeftMs === null ? null : g.minLeaseLeftMs / 1000),
  );
  return registry;
}
