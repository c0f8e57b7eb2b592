import { AggregatorRegistry, Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { createMetrics } from '../../src/http/metrics.js';
import { aggregatorOf, createPromBackend } from '../../src/http/metrics-node.js';
import { SPECS } from '../../src/http/metrics-spec.js';
import { defaultWorkers, MAX_DEFAULT_WORKERS, workersFrom } from '../../src/entry/cluster.js';

// How a `serve --workers` group adds up its workers' series
// (src/entry/cluster.ts sums prom-client's JSON of each worker, the scraped
// worker's first): counters and histograms summed, per-process gauges
// summed, store-wide gauges read once.

async function worker(requests: number, inflight: number, unknown: number) {
  const registry = new Registry();
  const m = createMetrics({ backend: createPromBackend({ registry, processMetrics: false }), routes: ['payments'] });
  for (let i = 0; i < requests; i++) m.observe({ route: 'payments', decision: 'forwarded', status: 201, totalMs: 3, upstreamMs: 2 });
  await m.render({ inflight, stats: { rejections: 7, outcomeUnknown: unknown } });
  return registry.getMetricsAsJSON();
}

function value(text: string, series: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? Number.NaN : Number(line.split(' ').pop());
}

describe('a group of workers: /metrics', () => {
  it('sums counters, histograms and per-process gauges; store-wide gauges and build info come from the first (the scraped) worker', async () => {
    const a = await worker(3, 1, 2);
    const b = await worker(5, 2, 9);
    const text = await AggregatorRegistry.aggregate([a, b] as never).metrics();
    expect(value(text, 'fencegate_requests_total{route="payments",outcome="accepted"}')).toBe(8);
    expect(value(text, 'fencegate_request_duration_seconds_count{route="payments"}')).toBe(8);
    expect(value(text, 'fencegate_inflight_requests')).toBe(3);
    expect(value(text, 'fencegate_rejection_log_rows')).toBe(7);
    expect(value(text, 'fencegate_outcome_unknown_records')).toBe(2);
    expect(value(text, 'fencegate_store_up')).toBe(1);
    expect(text.split('\n').filter((l) => l.startsWith('fencegate_build_info{'))).toHaveLength(1);
    expect(text).toMatch(/^fencegate_build_info\{[^}]*\} 1$/m);
  });

  it('negative control: summed as prom-client does by default, the store-wide gauges would count the store twice', async () => {
    const strip = (ms: unknown[]) => (ms as { aggregator?: string }[]).map((m) => ({ ...m, aggregator: 'sum' }));
    const text = await AggregatorRegistry.aggregate([strip(await worker(1, 0, 4)), strip(await worker(1, 0, 4))] as never).metrics();
    expect(value(text, 'fencegate_rejection_log_rows')).toBe(14);
    expect(value(text, 'fencegate_store_up')).toBe(2);
  });

  it('every gauge but the per-process ones is read once', () => {
    for (const spec of Object.values(SPECS)) {
      const expected = spec.type !== 'gauge' || spec.name === 'fencegate_inflight_requests' || spec.name === 'fencegate_store_pool_clients' ? 'sum' : 'first';
      expect(aggregatorOf(spec), spec.name).toBe(expected);
    }
  });
});

describe('--workers and FENCEGATE_WORKERS', () => {
  it('default: one per core, at most 8; "auto" the same; the flag wins over the variable', () => {
    expect(defaultWorkers()).toBeGreaterThanOrEqual(1);
    expect(defaultWorkers()).toBeLessThanOrEqual(MAX_DEFAULT_WORKERS);
    expect(workersFrom(undefined, undefined)).toBe(defaultWorkers());
    expect(workersFrom(undefined, '')).toBe(defaultWorkers());
    expect(workersFrom('auto', undefined)).toBe(defaultWorkers());
    expect(workersFrom('3', '5')).toBe(3);
    expect(workersFrom(undefined, '5')).toBe(5);
    expect(workersFrom('1', undefined)).toBe(1);
  });

  it('anything else is refused with the name that carried it', () => {
    expect(workersFrom('0', undefined)).toMatch(/^--workers must be a number from 1 to 256/);
    expect(workersFrom('257', undefined)).toMatch(/^--workers must be/);
    expect(workersFrom('2.5', undefined)).toMatch(/^--workers must be/);
    expect(workersFrom(undefined, 'x')).toMatch(/^FENCEGATE_WORKERS must be/);
  });
});
