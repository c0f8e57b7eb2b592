/**
 * The SQLite group committer's metrics: how many decisions each committed
 * group held (fencegate_store_group_size) and, at synchronous=FULL, the WAL
 * sync each group's callers waited for (fencegate_store_sync_duration_seconds),
 * read from a real gateway on a real SQLite file under concurrent commands
 * and compared with the committer's own counts.
 */
import { afterEach, describe, expect, test } from 'vitest';
import type { GatewayStore } from '../../src/store/types.js';
import { command, paymentsRoute, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

function series(text: string, name: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  return line === undefined ? Number.NaN : Number(line.split(' ')[1]);
}

let upstream: FakeUpstream | null = null;
let gw: TestGateway | null = null;
afterEach(async () => {
  await gw?.close();
  await upstream?.close();
  gw = null;
  upstream = null;
});

async function burst(wrapStore?: (s: GatewayStore) => GatewayStore) {
  upstream = await startUpstream();
  gw = await startTestGateway({ routes: [paymentsRoute(upstream.url)], sqliteOptions: { synchronous: 'FULL' }, ...(wrapStore ? { wrapStore } : {}) });
  const answers = await Promise.all(Array.from({ length: 40 }, (_, i) => command(gw!.url, '/payments/charges', { fence: 1, entity: `e-${i}`, key: `k-${i}` })));
  expect(answers.every((r) => r.status === 201)).toBe(true);
  return (await fetch(`${gw.url}/_fencegate/metrics`)).text();
}

describe('group commit metrics (SQLite, synchronous=FULL)', () => {
  test('every committed group is observed: the sizes add up to the decisions committed, one sync observed per group', async () => {
    const text = await burst();
    const stats = gw!.sqlite.group!.stats;
    expect(stats.fallbacks).toBe(0);
    // 40 admissions and 40 finishes, in however many groups the event loop made.
    expect(series(text, 'fencegate_store_group_size_sum')).toBe(stats.decisions);
    expect(stats.decisions).toBeGreaterThanOrEqual(80);
    expect(series(text, 'fencegate_store_group_size_count')).toBe(stats.groups);
    expect(series(text, 'fencegate_store_sync_duration_seconds_count')).toBe(stats.syncs);
    expect(series(text, 'fencegate_store_sync_duration_seconds_sum')).toBeGreaterThan(0);
  });

  test('control: a store that does not report its groups leaves both histograms empty', async () => {
    // The same store behind a wrapper without observeGroups: what the first test reads comes from the committer's reports.
    const text = await burst((s) => {
      const hidden = Object.create(s) as GatewayStore;
      Object.defineProperty(hidden, 'observeGroups', { value: undefined });
      return hidden;
    });
    expect(gw!.sqlite.group!.stats.groups).toBeGreaterThan(0);
    expect(series(text, 'fencegate_store_group_size_count')).toBe(0);
    expect(series(text, 'fencegate_store_sync_duration_seconds_count')).toBe(0);
  });
});
