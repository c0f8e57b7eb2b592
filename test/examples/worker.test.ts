import Database from 'better-sqlite3';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { createSqliteJobStore } from '../../src/lease/index.js';
import { paymentsRoute, startTestGateway, tempDir, type TestGateway } from '../helpers/gateway.js';
import { killAll, ROOT, spawnProc, TS_ARGS } from '../helpers/child.js';

// The worker example of docs/lease.md is examples/worker.ts, and this test keeps it
// honest: the file type-checks against the built package (`fencegate/lease`
// resolves to dist/), and it runs as its own process against a real gateway
// (fence and idempotency required), the demo upstream and a SQLite job file.
// docs/lease.md shows the file verbatim (checked below).

const tmp = tempDir();
let upstream: Server | undefined;
let gw: TestGateway | undefined;
afterAll(async () => {
  await killAll();
  await gw?.close();
  await new Promise((r) => (upstream ? upstream.close(r) : r(undefined)));
  tmp.cleanup();
});

const EXAMPLE = join(ROOT, 'examples', 'worker.ts');

describe('examples/worker.ts', () => {
  it('type-checks (strict, NodeNext) against the built package', () => {
    const tsc = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');
    const r = spawnSync(
      process.execPath,
      [
        tsc,
        '--noEmit',
        '--strict',
        '--noUncheckedIndexedAccess',
        '--target',
        'ES2022',
        '--module',
        'NodeNext',
        '--moduleResolution',
        'NodeNext',
        '--types',
        'node',
        '--skipLibCheck',
        EXAMPLE,
      ],
      { cwd: ROOT, encoding: 'utf8' },
    );
    expect(r.status, r.stdout + r.stderr).toBe(0);
  }, 60_000);

  it('pays once with a receipt; a declined card fails at once (non-retryable); a 503 is retried', async () => {
    const { startDemoUpstream } = (await import(join(ROOT, 'examples', 'demo-upstream.js'))) as { startDemoUpstream: (o: { port: number }) => Promise<Server> };
    upstream = await startDemoUpstream({ port: 0 });
    const upUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
    gw = await startTestGateway({ routes: [paymentsRoute(upUrl, { match: { path: '/payments/*', methods: ['POST'] } })] });

    // Two more orders beside the example's own order-8812: a declined card and a provider hiccup.
    const jobsDb = join(tmp.dir, 'jobs.db');
    const jobs = createSqliteJobStore({ path: jobsDb });
    await jobs.enqueue({
      kind: 'payment',
      idempotencyKey: 'order-declined',
      payload: { orderId: 'order-declined', amount: 500, currency: 'eur', customer: 'cus_declined' },
      maxAttempts: 5,
    });
    await jobs.enqueue({
      kind: 'payment',
      idempotencyKey: 'order-flaky',
      payload: { orderId: 'order-flaky', amount: 700, currency: 'eur', customer: 'cus_flaky' },
      maxAttempts: 5,
    });
    await jobs.close();

    const worker = spawnProc('example-worker', [...TS_ARGS, EXAMPLE], { env: { FENCEGATE_URL: gw.url, JOBS_DB: jobsDb, DATABASE_URL: '' } });
    const committed = new Set<number>();
    const declined = await worker.waitFor((m) => m.type === 'job_failed' && m.terminal === true, 'the declined job fails', 30_000);
    expect(declined).toMatchObject({ errorCode: 'card_declined' });
    await worker.waitFor(
      (m) => {
        if (m.type === 'result_committed') committed.add(m.jobId as number);
        return committed.size === 2;
      },
      'two jobs committed',
      30_000,
    );
    worker.proc.kill('SIGTERM');
    expect(await worker.exited).toEqual({ code: 0, signal: null });

    const up = async (path: string) => (await fetch(`${upUrl}${path}`)).json() as Promise<Record<string, any[]>>;
    const charges = (await up('/charges')).charges!;
    const receipts = (await up('/receipts')).receipts!;
    const declines = (await up('/declines')).declines!;
    // One charge per paid order, one receipt per charge, the decline tried once.
    expect(charges.map((c) => c.amount).sort()).toEqual([1200, 700]);
    expect(receipts.map((r) => r.charge).sort()).toEqual(charges.map((c) => c.id).sort());
    expect(declines).toHaveLength(1);

    const db = new Database(jobsDb, { readonly: true });
    try {
      const rows = db.prepare('SELECT idempotency_key AS k, state, attempt, result FROM tool_jobs ORDER BY id').all() as {
        k: string;
        state: string;
        attempt: number;
        result: string | null;
      }[];
      const byKey = Object.fromEntries(rows.map((r) => [r.k, r]));
      expect(byKey['order-declined']).toMatchObject({ state: 'failed', attempt: 1 });
      // The control: the same observation sees a retry when the answer is transient.
      expect(byKey['order-flaky']).toMatchObject({ state: 'succeeded', attempt: 2 });
      expect(byKey['order-8812']).toMatchObject({ state: 'succeeded', attempt: 1 });
      expect(JSON.parse(byKey['order-8812']!.result!)).toEqual({
        charge: expect.stringMatching(/^ch_/),
        receipt: expect.stringMatching(/^rc_/),
        replayed: false,
      });
    } finally {
      db.close();
    }
  }, 90_000);

  it('docs/lease.md shows the file as it is', () => {
    const file = readFileSync(EXAMPLE, 'utf8');
    // The whole file, from its first import on (the header comment is the file's own).
    const code = file.slice(file.indexOf('import '));
    expect(code.length).toBeGreaterThan(2000);
    for (const doc of [readFileSync(join(ROOT, 'docs', 'lease.md'), 'utf8')]) {
      expect(doc).toContain(code.trim());
      expect(doc).toContain('examples/worker.ts');
    }
  });
});
