import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { createPromBackend } from '../../src/http/metrics-node.js';
import { SPECS, type MetricSpec } from '../../src/http/metrics-spec.js';

// The Node backend counts its counters and histograms in prom-client's own
// value map, without prom-client's per-call label hashing
// (src/http/metrics-node.ts). Here the same calls go to that backend and to
// prom-client's own metrics, and every series must read the same, as text
// and as the JSON a `serve --workers` group sums.

type Call = { kind: 'inc' | 'observe' | 'set'; values: string[]; n: number };

/** A fixed, mixed sequence: zero series first (as createMetrics makes them), values on and between bucket bounds, above the last. */
function callsFor(spec: MetricSpec): Call[] {
  const label = (i: number) => spec.labels.map((l, k) => `${l}-${(i + k) % 3}`);
  const calls: Call[] = [];
  if (spec.type === 'counter') calls.push({ kind: 'inc', values: label(0), n: 0 });
  const points = spec.type === 'histogram' ? [...spec.buckets!, 0, 1e-9, 0.0031, 42, 1e9] : [1, 2, 5];
  for (let i = 0; i < 60; i++) {
    const n = points[i % points.length]!;
    calls.push({ kind: spec.type === 'histogram' ? 'observe' : spec.type === 'counter' ? 'inc' : 'set', values: label(i), n });
  }
  return calls;
}

function viaProm(spec: MetricSpec, registry: Registry, calls: Call[]): void {
  const common = { name: spec.name, help: spec.help, labelNames: [...spec.labels], registers: [registry] };
  const metric: any =
    spec.type === 'counter' ? new Counter(common) : spec.type === 'gauge' ? new Gauge(common) : new Histogram({ ...common, buckets: [...spec.buckets!] });
  for (const c of calls) {
    const labels = Object.fromEntries(spec.labels.map((l, i) => [l, c.values[i]!]));
    if (c.kind === 'inc') metric.inc(labels, c.n);
    else if (c.kind === 'observe') metric.observe(labels, c.n);
    else metric.set(labels, c.n);
  }
}

async function both(spec: MetricSpec, tamper?: (calls: Call[]) => Call[]) {
  const calls = callsFor(spec);
  const ours = createPromBackend({ processMetrics: false });
  const series = ours.metric(spec);
  for (const c of tamper?.(calls) ?? calls) series[c.kind](c.values, c.n);
  const theirs = new Registry();
  viaProm(spec, theirs, calls);
  // The aggregator is the only field the backend sets that plain prom-client does not.
  const json = async (r: Registry) => (await r.getMetricsAsJSON()).map(({ aggregator: _a, ...rest }) => rest);
  return { text: [await ours.registry.metrics(), await theirs.metrics()], json: [await json(ours.registry), await json(theirs)] };
}

describe('the Node metrics backend counts as prom-client does', () => {
  const specs = Object.values(SPECS).filter((s) => s.type !== 'gauge');
  it.each(specs.map((s) => [s.name, s] as const))('%s', async (_name, spec) => {
    const { text, json } = await both(spec);
    expect(text[0]).toBe(text[1]);
    expect(json[0]).toEqual(json[1]);
    expect(text[0]).toContain(spec.type === 'histogram' ? `${spec.name}_bucket` : spec.name);
  });

  it('control: one observation more on our side is seen', async () => {
    const spec = SPECS.total;
    const { text } = await both(spec, (calls) => [...calls, { kind: 'observe', values: calls[0]!.values, n: 0.003 }]);
    expect(text[0]).not.toBe(text[1]);
  });

  it.each([
    ['a registry reset', (r: Registry) => r.resetMetrics()],
    ['a removal of the series', (r: Registry) => (r.getSingleMetric(SPECS.total.name) as any).remove('r')],
  ] as const)('counts again after %s, as prom-client does', async (_what, disturb) => {
    const spec = SPECS.total;
    const ours = createPromBackend({ processMetrics: false });
    const series = ours.metric(spec);
    const theirs = new Registry();
    const plain = new Histogram({ name: spec.name, help: spec.help, labelNames: [...spec.labels], buckets: [...spec.buckets!], registers: [theirs] });
    for (const [s, r] of [
      [(v: number) => series.observe(['r'], v), ours.registry],
      [(v: number) => plain.observe({ route: 'r' }, v), theirs],
    ] as const) {
      s(0.003);
      disturb(r);
      s(0.2);
      s(0.2);
    }
    const text = await ours.registry.metrics();
    expect(text).toBe(await theirs.metrics());
    expect(text).toContain(`${spec.name}_count{route="r"} 2`);
  });

  it('a counter counts again after a registry reset', async () => {
    const ours = createPromBackend({ processMetrics: false });
    const series = ours.metric(SPECS.requests);
    series.inc(['r', 'accepted']);
    ours.registry.resetMetrics();
    series.inc(['r', 'accepted'], 5);
    expect(await ours.registry.metrics()).toContain(`${SPECS.requests.name}{route="r",outcome="accepted"} 5`);
  });

  it('refuses what prom-client refuses', () => {
    const series = createPromBackend({ processMetrics: false }).metric(SPECS.requests);
    expect(() => series.inc(['r', 'accepted'], -1)).toThrow();
    const h = createPromBackend({ processMetrics: false }).metric(SPECS.total);
    expect(() => h.observe(['r'], Number.NaN)).toThrow();
  });
});
