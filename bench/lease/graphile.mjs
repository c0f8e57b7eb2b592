// The graphile-worker row: its own runner, `run({ concurrency, taskList })`
// with a no-op task, in its own fresh schema, timed by its own events from
// the first job:start to the last job:complete (emitted after the job row
// is deleted, i.e. after the completion committed).
import { performance } from 'node:perf_hooks';
import { Logger, run, runMigrations } from 'graphile-worker';
import { admin, childConfig, cpuProbe, dropSchema, newSchemaName, PG_URL, report, withAppName } from './common.mjs';
import { EventEmitter } from 'node:events';

const { workers, jobs, maxSeconds, queued, poolMax } = childConfig();
const schema = newSchemaName('gw_lease_bench');
// Its per-job info log would be the only thing this row does that the others do not.
const logger = new Logger(() => () => {});
const options = { connectionString: withAppName(PG_URL, schema), schema, logger, ...(poolMax ? { maxPoolSize: poolMax } : {}) };

let out;
try {
  await runMigrations(options);
  const t0 = performance.now();
  await admin(async (c) => {
    // add_jobs is graphile-worker's own bulk enqueue (one statement).
    await c.query(
      `SELECT count(*) FROM ${schema}.add_jobs(array(
         SELECT ROW('noop', '{}'::json, NULL, NULL, NULL, NULL, NULL, NULL)::${schema}.job_spec
           FROM generate_series(1, $1::int)))`,
      [queued],
    );
    await c.query(`ANALYZE ${schema}._private_jobs`);
  });
  const seedMs = Math.round(performance.now() - t0);

  const events = new EventEmitter();
  let first = 0;
  let last = 0;
  let done = 0;
  let failed = 0;
  let finish;
  const over = new Promise((r) => (finish = r));
  events.on('job:start', () => (first ||= performance.now()));
  events.on('job:complete', ({ error }) => {
    if (error) failed++;
    done++;
    last = performance.now();
    if (done >= jobs) finish();
  });
  const probe = await cpuProbe(schema);
  const runner = await run({ ...options, concurrency: workers, noHandleSignals: true, events, taskList: { noop: async () => {} } });
  const timer = setTimeout(finish, maxSeconds * 1000);
  await over;
  clearTimeout(timer);
  const cpu = await probe.stop();
  await runner.stop();
  const seconds = (last - first) / 1000;
  out = {
    system: 'graphile-worker',
    mode: 'runner',
    workers,
    poolMax: poolMax ?? 10,
    queued,
    finished: 0,
    seedMs,
    completed: done,
    seconds,
    cyclesPerSecond: done / seconds,
    capped: done < jobs,
    rejected: failed,
    ...cpu,
  };
} finally {
  await dropSchema(schema);
}
report(out);
