/**
 * The gateway's metrics in a prom-client Registry (Node only: the Workers
 * bundle never reaches this file). The same names and labels as the text
 * backend (./metrics-spec.ts), plus prom-client's default process metrics
 * (`process_*`, `nodejs_*`), all in one registry that `/metrics` serves.
 */
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { MetricSpec } from './metrics-spec.js';
import type { MetricBackend, Series } from './metrics-text.js';

export interface PromBackendOptions {
  /** Default: a new Registry. */
  registry?: Registry;
  /** Register prom-client's default process metrics in it. Default true. */
  processMetrics?: boolean;
  /** What `render()` serves instead of the registry's own exposition (a `serve --workers` group's sum: ../entry/cluster.ts). */
  render?: () => Promise<string>;
}

/**
 * @example
 * const registry = new Registry();
 * const metrics = createMetrics({ backend: createPromBackend({ registry }), routes: ['payments'] });
 * // registry.metrics() is what /metrics serves; add your own metrics to it.
 */
export function createPromBackend(options: PromBackendOptions = {}): MetricBackend & { registry: Registry } {
  const registry = options.registry ?? new Registry();
  if (options.processMetrics ?? true) {
    collectDefaultMetrics({ register: registry });
    // prom-client names three gauges `*_total`, a suffix the exposition
    // format keeps for counters: `promtool check metrics` fails the whole
    // scrape on them (docs/deploy.md §6). Each is the sum of its
    // per-type gauge, which stays: sum(nodejs_active_handles) is the same number.
    for (const name of NON_COUNTER_TOTALS) registry.removeSingleMetric(name);
  }
  const made = new Map<string, Series>();
  return {
    registry,
    contentType: registry.contentType,
    metric(spec) {
      let s = made.get(spec.name);
      if (s === undefined) made.set(spec.name, (s = series(spec, registry)));
      return s;
    },
    render: options.render ?? (() => registry.metrics()),
  };
}

/**
 * How a `serve --workers` group adds up each series (prom-client's
 * AggregatorRegistry, ../entry/cluster.ts): counters and histograms are
 * summed over the workers, and so are the gauges of what each process holds
 * (its requests in flight, its PostgreSQL pool). Every other gauge says
 * something about the store or the build, the same whichever worker reads
 * it: the scraped worker's value (`first`), not N times it.
 */
const SUMMED_GAUGES: ReadonlySet<string> = new Set(['fencegate_inflight_requests', 'fencegate_store_pool_clients']);
export function aggregatorOf(spec: MetricSpec): 'sum' | 'first' {
  return spec.type !== 'gauge' || SUMMED_GAUGES.has(spec.name) ? 'sum' : 'first';
}

/** prom-client's default gauges whose names end in `_total` (each the sum of the gauge named without it). */
export const NON_COUNTER_TOTALS = ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total'] as const;

function series(spec: MetricSpec, registry: Registry): Series {
  const common = { name: spec.name, help: spec.help, labelNames: [...spec.labels], registers: [registry], aggregator: aggregatorOf(spec) };
  // Children per label values, cached: a label object per call would cost on every request.
  const children = new Map<string, Child>();
  const metric: any =
    spec.type === 'counter' ? new Counter(common) : spec.type === 'gauge' ? new Gauge(common) : new Histogram({ ...common, buckets: [...spec.buckets!] });
  const child = (values: readonly string[]): Child => {
    const k = values.join('\u0000');
    let c = children.get(k);
    if (c === undefined) children.set(k, (c = childOf(spec, metric, values)));
    return c;
  };
  return {
    inc: (values, by = 1) => child(values).inc(by),
    set: (values, value) => child(values).set(value),
    observe: (values, value) => child(values).observe(value),
    reset() {
      metric.reset();
      children.clear();
      // prom-client shows an unlabelled gauge as 0 after a reset: NaN says "not known this scrape" instead.
      if (spec.type === 'gauge' && spec.labels.length === 0) metric.set(Number.NaN);
    },
  };
}

interface Child {
  inc(by: number): void;
  set(value: number): void;
  observe(value: number): void;
}

/**
 * One series of `metric`. Counters and histograms are counted per request
 * (two counters and five histograms a request), and prom-client's own
 * `inc`/`observe`, a child's too, validate and hash the label object on
 * every call (about 0.4 µs an observation here). So the series' entry in the
 * metric's value map is made once, by prom-client itself (an `inc` of 0, a
 * `zero`), and from then on counted in place, as prom-client's own code
 * counts it after the hash; prom-client renders, resets and aggregates it as
 * before, and a reset or a removal from outside is seen on the next call. test/metrics/prom-fast-path.unit.test.ts holds the result to
 * prom-client's own calls, series for series, so an upgrade that changes
 * that value map fails there, not in production.
 */
function childOf(spec: MetricSpec, metric: any, values: readonly string[]): Child {
  if (values.length === 0 && spec.type === 'gauge') return { inc: (by) => metric.inc(by), set: (v) => metric.set(v), observe: () => {} };
  const labels: Record<string, string> = {};
  spec.labels.forEach((name, i) => (labels[name] = values[i]!));
  if (spec.type === 'gauge') {
    const g = metric.labels(labels);
    return { inc: (by) => g.inc(by), set: (v) => g.set(v), observe: () => {} };
  }
  // The entry, and the map and key it was found under: prom-client replaces
  // the map on a reset (`registry.resetMetrics()`, an embedder's own) and
  // deletes the key on `remove`; then the entry is made again, as
  // prom-client's own next call would make it.
  let map: Record<string, any> = {};
  let key = '';
  let entry: any = null;
  const bind = () => {
    if (spec.type === 'counter') key = values.length === 0 ? metric.inc(0).labelHash : metric.inc(labels, 0).labelHash;
    else {
      metric.zero(labels);
      key = Object.keys(metric.hashMap).find((k) => metric.hashMap[k].labels === labels)!;
    }
    map = metric.hashMap;
    entry = map[key];
  };
  const live = () => {
    if (metric.hashMap !== map || map[key] !== entry) bind();
    return entry;
  };
  bind();
  if (spec.type === 'counter') {
    return {
      inc(by) {
        if (!(by >= 0) || !Number.isFinite(by)) return void metric.inc(labels, by); // prom-client's own refusal
        live().value += by;
      },
      set: () => {},
      observe: () => {},
    };
  }
  const bounds: number[] = metric.upperBounds;
  return {
    inc: () => {},
    set: () => {},
    observe(value) {
      if (!Number.isFinite(value)) return void metric.observe(labels, value); // prom-client's own refusal
      const e = live();
      e.sum += value;
      e.count += 1;
      for (let i = 0; i < bounds.length; i++) {
        if (value <= bounds[i]!) {
          e.bucketValues[bounds[i]!]! += 1;
          return;
        }
      }
    },
  };
}
