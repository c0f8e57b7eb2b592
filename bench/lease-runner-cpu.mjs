// The runner's own CPU per job, without a database: runWorker against an
// in-memory store whose claim and complete answer on the next turn of the
// event loop, beside N async loops of claim → complete on the same store.
// The difference is what runWorker adds per job (attempt, events, heartbeat
// hand-off, claim lanes); the database's share is what bench/lease.mjs adds.
//
//   npm run build && node bench/lease-runner-cpu.mjs [--workers 16] [--jobs 50000] [--rounds 3] [--dist DIR]
//
// --dist DIR: another build's dist/ (a before/after comparison); default ./dist.
// The heartbeat thread opens a SQLite file it never writes to (no-op jobs end
// long before their first beat).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { option as opt } from './args.mjs';

const workers = Number(opt('workers', 16));
const jobs = Number(opt('jobs', 50000));
const rounds = Number(opt('rounds', 3));
const dist = resolve(opt('dist', new URL('../dist', import.meta.url).pathname));
const { runWorker, LeaseEvents, createSqliteJobStore } = await import(pathToFileURL(join(dist, 'lease/index.js')).href);

const dir = mkdtempSync(join(tmpdir(), 'fg-runner-cpu-'));
const file = join(dir, 'thread.db');
// Migrated once, so the thread's store opens an existing database.
await (await createSqliteJobStore({ path: file })).close();

/** Answers on the next macrotask, as a socket read would. */
const later = (value) => new Promise((r) => setImmediate(() => r(value)));

function memoryStore() {
  let next = 1;
  let left = 0;
  const now = new Date();
  return {
    dialect: 'sqlite',
    storeId: '0'.repeat(32),
    descriptor: { sqlite: file },
    fill(n) {
      left = n;
    },
    claim({ workerId }) {
      if (left <= 0) return later({ lease: null, failed: [] });
      left--;
      const id = next++;
      return later({
        lease: {
          id,
          kind: 'noop',
          ownerId: workerId,
          fencingToken: 1,
          leaseUntil: now,
          leaseMs: 30_000,
          attempt: 1,
          maxAttempts: 3,
          idempotencyKey: `k${id}`,
          jobKey: `job:${id}`,
          fenceKey: `tool-job:${id}`,
          payload: {},
          payloadSha256: 'x',
          deadlineAt: null,
          previousOwnerId: null,
        },
        failed: [],
      });
    },
    complete: () => later({ ok: true }),
    fail: () => later({ ok: true, state: 'queued', runAfter: now }),
    release: () => later({ ok: true }),
    extend: () => later({ ok: true, leaseUntil: now }),
    close: async () => {},
  };
}

async function runnerRow() {
  const store = memoryStore();
  store.fill(jobs);
  const events = new LeaseEvents();
  let done = 0;
  let finish;
  const over = new Promise((r) => (finish = r));
  events.on('result_committed', () => ++done >= jobs && finish());
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  const worker = await runWorker({ store, workerId: 'cpu-bench', concurrency: workers, handlers: { noop: async () => null }, events });
  await over;
  const cpu = process.cpuUsage(c0);
  const ms = performance.now() - t0;
  await worker.stop();
  return { usPerJob: (cpu.user + cpu.system) / jobs, jobsPerSecond: (jobs / ms) * 1000 };
}

async function loopRow() {
  const store = memoryStore();
  store.fill(jobs);
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: workers }, async () => {
      for (;;) {
        const { lease } = await store.claim({ workerId: 'cpu-bench' });
        if (!lease) return;
        await store.complete(lease, null);
      }
    }),
  );
  const cpu = process.cpuUsage(c0);
  return { usPerJob: (cpu.user + cpu.system) / jobs, jobsPerSecond: (jobs / (performance.now() - t0)) * 1000 };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const r = { runner: [], loop: [] };
for (let i = 0; i < rounds; i++) {
  r.runner.push(await runnerRow());
  r.loop.push(await loopRow());
}
rmSync(dir, { recursive: true, force: true });
const m = (rows, k) => median(rows.map((x) => x[k]));
console.log(
  JSON.stringify({
    dist,
    workers,
    jobs,
    runnerUsPerJob: +m(r.runner, 'usPerJob').toFixed(1),
    loopUsPerJob: +m(r.loop, 'usPerJob').toFixed(1),
    runnerOwnUsPerJob: +(m(r.runner, 'usPerJob') - m(r.loop, 'usPerJob')).toFixed(1),
    runnerJobsPerSecond: Math.round(m(r.runner, 'jobsPerSecond')),
    samples: r.runner.map((x) => +x.usPerJob.toFixed(1)),
  }),
);
process.exit(0);
