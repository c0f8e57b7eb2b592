/**
 * docs/metrics.md and examples/grafana-dashboard.json name only metrics
 * that exist, and the reference lists every metric there is.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, test } from 'vitest';
import { WORKERS_GAUGE } from '../../src/entry/cluster.js';
import { SPECS } from '../../src/http/metrics-spec.js';
import { leaseMetricsRegistry } from '../../src/lease/prometheus.js';

const read = (path: string) => readFileSync(new URL(`../../${path}`, import.meta.url), 'utf8');
const gateway = Object.values(SPECS).map((s) => s.name);
const lease = leaseMetricsRegistry({ metrics: () => ({ counters: {}, gauges: {} }) })
  .getMetricsAsArray()
  .map((m) => m.name);
// The primary of a `serve --workers` group adds one series of its own to the group's scrape.
const known = new Set([...gateway, ...lease, WORKERS_GAUGE]);
/** `fencegate_x` as used in text, with a histogram's `_bucket`/`_sum`/`_count` taken off. */
const mentioned = (text: string) => new Set([...text.matchAll(/\bfencegate_[a-z_]+/g)].map((m) => m[0].replace(/_(bucket|sum|count)$/, '')));

describe('the metrics reference', () => {
  test('docs/metrics.md lists every gateway and worker metric, and no other', () => {
    const docs = mentioned(read('docs/metrics.md'));
    for (const name of known) expect(docs.has(name), name).toBe(true);
    for (const name of docs) expect(known.has(name), name).toBe(true);
  });

  test('every metric the dashboard queries exists', () => {
    const exprs = JSON.parse(read('examples/grafana-dashboard.json')).panels.flatMap((p: any) => p.targets.map((t: any) => t.expr as string));
    expect(exprs.length).toBeGreaterThan(10);
    for (const name of mentioned(exprs.join('\n'))) expect(known.has(name), name).toBe(true);
  });

  test('control: a name that does not exist is caught', () => {
    expect(known.has('fencegate_requests_totl')).toBe(false);
    expect(mentioned('rate(fencegate_request_duration_seconds_bucket[5m])')).toEqual(new Set(['fencegate_request_duration_seconds']));
  });
});
