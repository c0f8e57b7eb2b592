import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { createSqliteStore } from '../../src/store/sqlite/index.js';
import { tempDir } from '../helpers/gateway.js';
import { CLI, killAll as killChildren, spawnNode, startGatewayChild, writeJson } from '../helpers/child.js';

// The claim: "an export of 1,000,000 rejection rows streams with flat memory".
// The gateway runs as a CHILD process (`fencegate serve`, the compiled
// package: `npm run build` first); this process pulls the NDJSON export over
// HTTP at its own pace and reads the child's peak RSS (VmHWM) from /proc.
// If the export were built in memory, the child would hold the whole
// ~300 MB body (and its JavaScript objects, several times that).

// FENCEGATE_EXPORT_ROWS=100000 runs it smaller, to compare: the growth is the
// same (about 50 MB of V8 heap headroom here) for 100,000 and 1,000,000 rows.
const ROWS = Number(process.env.FENCEGATE_EXPORT_ROWS ?? 1_000_000);
/** Generous: a Node process with the gateway loaded sits around 60-90 MB. */
const PEAK_RSS_BOUND_MB = 200;

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  await killChildren();
  for (const c of cleanups.splice(0).reverse()) await c();
});

function vm(pid: number, field: 'VmHWM' | 'VmRSS'): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB$`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`no ${field} in /proc/${pid}/status`);
  return Number(m[1]) / 1024;
}

describe('streaming export of 1,000,000 rejections', () => {
  it('keeps the gateway process flat (peak RSS, measured in the child)', { timeout: 600_000 }, async () => {
    const tmp = tempDir();
    cleanups.push(() => tmp.cleanup());
    const dbPath = join(tmp.dir, 'gateway.db');

    // Seed in one statement (a recursive CTE), not a million inserts.
    const seedStart = Date.now();
    const store = createSqliteStore({ path: dbPath, synchronous: 'NORMAL' });
    store.db.exec(`INSERT INTO rejections (at, reason, entity, presented_fence, current_fence, idempotency_key, caller, method, path, payload_sha256, request_id, detail)
      WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ${ROWS})
      SELECT 1700000000000 + i, CASE i % 3 WHEN 0 THEN 'stale-fence' WHEN 1 THEN 'idempotency-key-reused' ELSE 'unauthorized' END,
        'tool-job:' || (i % 5000), i, i + 1, 'pay-' || i || '-step', 'caller-' || (i % 7), 'POST', '/payments/charges/' || i,
        '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08', 'req-' || i, NULL FROM n`);
    await store.close();
    const seedMs = Date.now() - seedStart;

    const config = writeJson(join(tmp.dir, 'config.json'), {
      listen: { host: '127.0.0.1', port: 0 },
      store: { sqlite: dbPath, synchronous: 'NORMAL' },
      routes: [{ name: 'payments', match: { path: '/payments/*' }, upstream: 'http://127.0.0.1:9' }],
    });
    const child = await startGatewayChild([CLI, 'serve', '--config', config], { FENCEGATE_LOG_LEVEL: 'info' });
    const url = `${child.url}/_fencegate/v1/rejections`;
    // Warm up the admin path (JSON page of 1000 rows), then take the baseline.
    expect((await fetch(`${url}?limit=1000`)).status).toBe(200);
    const baseline = vm(child.pid, 'VmHWM');

    const started = Date.now();
    const res = await fetch(url, { headers: { accept: 'application/x-ndjson' } });
    expect(res.status).toBe(200);
    let lines = 0;
    let bytes = 0;
    let first = '';
    let peakSeen = baseline;
    let chunks = 0;
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      bytes += chunk.byteLength;
      if (first.length < 1000) first += new TextDecoder().decode(chunk.subarray(0, 1000));
      for (let i = 0; i < chunk.length; i++) if (chunk[i] === 10) lines++;
      if (++chunks % 200 === 0) peakSeen = Math.max(peakSeen, vm(child.pid, 'VmRSS'));
    }
    const exportMs = Date.now() - started;
    const peak = vm(child.pid, 'VmHWM');

    console.log(
      `[export-memory] ${ROWS} rows, ${(bytes / 1e6).toFixed(1)} MB NDJSON in ${(exportMs / 1000).toFixed(1)} s (seed ${(seedMs / 1000).toFixed(1)} s); ` +
        `gateway child peak RSS (VmHWM) ${peak.toFixed(1)} MB, before the export ${baseline.toFixed(1)} MB, growth ${(peak - baseline).toFixed(1)} MB`,
    );
    expect(lines).toBe(ROWS);
    expect(JSON.parse(first.split('\n')[0]!)).toMatchObject({ id: String(ROWS), entity: `tool-job:${ROWS % 5000}`, presented_fence: String(ROWS) });
    expect(bytes).toBeGreaterThan(ROWS * 300);
    expect(peak).toBeLessThan(PEAK_RSS_BOUND_MB);
    // Flat: the export adds a bounded, size-independent amount (heap headroom), far below the body's size.
    expect(peak - baseline).toBeLessThan(100);
    expect(peakSeen).toBeLessThanOrEqual(peak + 1);

    // The CLI straight against the store streams the same rows.
    const cli = spawnNode([CLI, 'audit', '--db', dbPath, '--format', 'ndjson', '--limit', '5', '--reason', 'stale-fence']);
    const { code } = await cli.exited;
    expect(code).toBe(0);
    const top = ROWS - (ROWS % 3);
    expect(
      cli
        .stdout()
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l).id),
    ).toEqual([0, 3, 6, 9, 12].map((d) => String(top - d)));
  });
});
