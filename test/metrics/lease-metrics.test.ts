/**
 * `leaseMetricsRegistry(worker)`: worker.metrics() as a prom-client
 * Registry, by kind plus the user's labels, read from a real worker on a
 * real SQLite job store while a job runs and after it committed.
 */
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { LeaseConfigError } from '../../src/lease/errors.js';
import type { KindCounters, LeaseMetrics } from '../../src/lease/metrics.js';
import { leaseMetricsRegistry } from '../../src/lease/prometheus.js';
import { runWorker } from '../../src/lease/runner/run-worker.js';
import type { JobStore } from '../../src/lease/types.js';
import { TS_EXEC_ARGV } from '../lease/helpers/node.js';
import { sqliteDatabase, type TestDatabase } from '../lease/helpers/stores.js';

function value(text: string, name: string, labels: Record<string, string>): number | undefined {
  for (const line of text.split('\n')) {
    const m = /^([a-z_:][a-z0-9_:]*)\{(.*)\} (\S+)$/i.exec(line);
    if (!m || m[1] !== name) continue;
    const got = Object.fromEntries([...m[2]!.matchAll(/([a-z_]+)="((?:[^"\\]|\\.)*)"/gi)].map((x) => [x[1], x[2]]));
    if (Object.keys(got).length === Object.keys(labels).length && Object.entries(labels).every(([k, v]) => got[k] === v)) return Number(m[3]);
  }
  return undefined;
}

const user = { model: 'gpt-x', provider: 'acme' };

describe('leaseMetricsRegistry on a running worker', () => {
  let db: TestDatabase;
  let store: JobStore;
  beforeAll(async () => {
    db = await sqliteDatabase();
    store = await db.open();
  });
  afterAll(async () => {
    await db?.dispose();
  });

  test('while a job runs: running, heartbeat age and lease time left; after it committed: the counters, and no time left', async () => {
    let open!: () => void;
    const gate = new Promise<void>((r) => (open = r));
    const worker = await runWorker({
      store,
      workerId: 'metrics-w',
      // Long enough that a stalled disk does not end the lease while the job
      // is held open (a re-claim would count, and the gauges below would
      // read the new lease); nothing here waits for it to run out.
      leaseMs: 5_000,
      heartbeatMs: 100,
      maxMissedHeartbeats: 3,
      jitterMs: 50,
      pollIntervalMs: 25,
      threadExecArgv: TS_EXEC_ARGV,
      kinds: { pay: { maxRunMs: 10_000 }, other: { maxRunMs: 10_000 } },
      handlers: { pay: async () => (await gate, { ok: true }), other: async () => null },
    });
    try {
      const registry = leaseMetricsRegistry(worker, { labels: user, kinds: ['pay', 'other'] });
      const before = await registry.metrics();
      expect(value(before, 'fencegate_lease_claims_total', { kind: 'other', ...user })).toBe(0);
      expect(value(before, 'fencegate_lease_running', { kind: 'pay', ...user })).toBe(0);

      const { job } = await store.enqueue({ kind: 'pay', idempotencyKey: 'm-1', payload: {} });
      await worker.events.waitFor('job_claimed', (e) => e.jobId === job.id);
      await worker.events.waitFor('heartbeat_ok', (e) => e.jobId === job.id);
      const running = await registry.metrics();
      expect(value(running, 'fencegate_lease_running', { kind: 'pay', ...user })).toBe(1);
      expect(value(running, 'fencegate_lease_claims_total', { kind: 'pay', ...user })).toBe(1);
      expect(value(running, 'fencegate_lease_reclaims_total', { kind: 'pay', ...user })).toBe(0);
      expect(value(running, 'fencegate_lease_heartbeats_total', { kind: 'pay', ...user })).toBeGreaterThanOrEqual(1);
      const age = value(running, 'fencegate_lease_heartbeat_age_seconds', { kind: 'pay', ...user })!;
      expect(age).toBeGreaterThanOrEqual(0);
      // Bounded by the lease, not by how fast the box is: a heartbeat older
      // than the lease would mean the lease was no longer confirmed.
      expect(age).toBeLessThan(5);
      const left = value(running, 'fencegate_lease_time_left_seconds', { kind: 'pay', ...user })!;
      expect(left).toBeGreaterThan(0);
      expect(left).toBeLessThanOrEqual(5);

      const committed = worker.events.waitFor('result_committed', (e) => e.jobId === job.id);
      open();
      await committed;
      await new Promise((r) => setTimeout(r, 60)); // past the registry's 50 ms snapshot
      const after = await registry.metrics();
      expect(value(after, 'fencegate_lease_attempts_total', { kind: 'pay', result: 'committed', ...user })).toBe(1);
      expect(value(after, 'fencegate_lease_running', { kind: 'pay', ...user })).toBe(0);
      expect(value(after, 'fencegate_lease_time_left_seconds', { kind: 'pay', ...user })).toBeUndefined();
      expect(after).toMatch(/^# TYPE fencegate_lease_claims_total counter$/m);
    } finally {
      await worker.stop({ release: true });
    }
  });
});

describe('leaseMetricsRegistry: what each counter reads', () => {
  const counters = (over: Partial<KindCounters>): KindCounters => ({
    claimed: 0,
    reclaimed: 0,
    heartbeatsOk: 0,
    extendsFailed: 0,
    leasesLost: 0,
    ownershipUnknown: 0,
    toolRequests: 0,
    committed: 0,
    rejected: 0,
    failed: 0,
    stageTimeouts: 0,
    lostByCause: { zero_rows: 0, unconfirmed: 0, stalled: 0, stale_fence: 0, thread_exit: 0 },
    ...over,
  });

  test('re-claims, failed extends and lost leases by cause', async () => {
    const snapshot: LeaseMetrics = {
      counters: {
        pay: counters({
          claimed: 3,
          reclaimed: 2,
          extendsFailed: 4,
          leasesLost: 2,
          lostByCause: { zero_rows: 1, unconfirmed: 1, stalled: 0, stale_fence: 0, thread_exit: 0 },
        }),
      },
      gauges: {},
    };
    const text = await leaseMetricsRegistry({ metrics: () => snapshot }).metrics();
    expect(value(text, 'fencegate_lease_reclaims_total', { kind: 'pay' })).toBe(2);
    expect(value(text, 'fencegate_lease_extend_failures_total', { kind: 'pay' })).toBe(4);
    expect(value(text, 'fencegate_lease_lost_total', { kind: 'pay', cause: 'unconfirmed' })).toBe(1);
    expect(value(text, 'fencegate_lease_lost_total', { kind: 'pay', cause: 'stale_fence' })).toBe(0);
  });

  test('a label name that would clash or is not a Prometheus name is refused at the call', () => {
    expect(() => leaseMetricsRegistry({ metrics: () => ({ counters: {}, gauges: {} }) }, { labels: { kind: 'x' } })).toThrow(LeaseConfigError);
    expect(() => leaseMetricsRegistry({ metrics: () => ({ counters: {}, gauges: {} }) }, { labels: { 'bad-name': 'x' } })).toThrow(/label name/);
  });
});
