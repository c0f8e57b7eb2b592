// One fencegate row of the lease benchmark, in its own process and schema.
//
//   mode 'runner': the real runWorker (heartbeat thread at its default
//                  period, default poll interval), a no-op handler, timed by
//                  its own events from the first job_claimed to the last
//                  result_committed;
//   mode 'raw':    `workers` async loops of store.claim → store.complete.
//
// Seeds (one INSERT … SELECT generate_series each, then ANALYZE):
//   { queued: N }                         N ready jobs, nothing else;
//   { queued: N, finished: M }            M finished (succeeded, every 10th
//                                         failed) before N queued ones.
import { performance } from 'node:perf_hooks';
import { createPostgresJobStore, LeaseEvents, runWorker } from '../../dist/lease/index.js';
import { sha256Json } from '../../dist/lease/store-common.js';
import {
  admin,
  childConfig,
  cpuProbe,
  statementCounter,
  createSchema,
  dropSchema,
  newSchemaName,
  PG_URL,
  report,
  timedLoops,
  withAppName,
  withSearchPath,
} from './common.mjs';

/** The payload every job carries (its hash is stored as enqueue would). */
const PAYLOAD = {};
const cfg = childConfig();
const { mode, workers, jobs, maxSeconds, queued, finished = 0, poolMax } = cfg;
const schema = newSchemaName('fg_lease_bench');
await createSchema(schema);
const url = withAppName(withSearchPath(PG_URL, schema), schema);

const statements = statementCounter();
let out;
try {
  const store = await createPostgresJobStore({ connectionString: url, ...(poolMax ? { poolMax } : {}) });
  const seedMs = await seed(queued, finished);
  const cpu = await cpuProbe(schema);
  statements.start();
  // Statements are counted over the same span as the CPU.
  const probe = { stop: async () => ({ ...(await cpu.stop()), statements: statements.stop() }) };
  const result = mode === 'runner' ? await runner(store, probe) : await raw(store, probe);
  await store.close();
  out = { system: 'fencegate', mode, workers, poolMax: poolMax ?? 4, queued, finished, seedMs, ...result };
} finally {
  await dropSchema(schema);
}
report(out);

async function seed(queuedCount, finishedCount) {
  const t0 = performance.now();
  await admin(async (c) => {
    await c.query(`SET search_path = ${schema}`);
    // Finished rows first (lower ids, older), as a table's history would be.
    await c.query(
      `INSERT INTO tool_jobs (kind, state, owner_id, fencing_token, attempt, max_attempts, idempotency_key,
                              payload, payload_sha256, result, reason, finished_at, first_claimed_at)
       SELECT 'noop',
              CASE WHEN g <= $2 THEN (CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'succeeded' END) ELSE 'queued' END,
              CASE WHEN g <= $2 THEN 'seed-worker' END,
              CASE WHEN g <= $2 THEN 1 ELSE 0 END,
              CASE WHEN g <= $2 THEN 1 ELSE 0 END,
              3, 'bench-' || g, $3::jsonb, $4,
              CASE WHEN g <= $2 AND g % 10 <> 0 THEN 'null'::jsonb END,
              CASE WHEN g <= $2 AND g % 10 = 0 THEN 'handler_error' END,
              CASE WHEN g <= $2 THEN now() END,
              CASE WHEN g <= $2 THEN now() END
         FROM generate_series(1, $1::bigint + $2::bigint) g`,
      [queuedCount, finishedCount, JSON.stringify(PAYLOAD), sha256Json(PAYLOAD)],
    );
    // What autovacuum would have done by the time a real table got this big.
    await c.query('ANALYZE tool_jobs');
  });
  return Math.round(performance.now() - t0);
}

async function raw(store, probe) {
  const claim = { workerId: `bench-raw-${process.pid}`, kinds: ['noop'] };
  const result = await timedLoops({
    workers,
    jobs,
    maxSeconds,
    async cycle() {
      const { lease } = await store.claim(claim);
      if (!lease) return false;
      const res = await store.complete(lease, null);
      if (!res.ok) throw new Error(`complete refused: ${res.reason}`);
      return true;
    },
  });
  return { ...result, ...(await probe.stop()) };
}

async function runner(store, probe) {
  const events = new LeaseEvents();
  let first = 0;
  let last = 0;
  let done = 0;
  let rejected = 0;
  let finish;
  const over = new Promise((r) => (finish = r));
  events.on('job_claimed', () => (first ||= performance.now()));
  events.on('result_committed', () => {
    done++;
    last = performance.now();
    if (done >= jobs) finish();
  });
  events.on('result_rejected', () => rejected++);
  events.on('job_failed', () => rejected++);
  const worker = await runWorker({
    store,
    workerId: `bench-runner-${process.pid}`,
    concurrency: workers,
    handlers: { noop: async () => null },
    events,
  });
  const timer = setTimeout(finish, maxSeconds * 1000);
  await over;
  clearTimeout(timer);
  const cpu = await probe.stop();
  await worker.stop({ release: true });
  const seconds = (last - first) / 1000;
  return { completed: done, seconds, cyclesPerSecond: done / seconds, capped: done < jobs, rejected, ...cpu };
}
