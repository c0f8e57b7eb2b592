// The pg-boss 10 row: `workers` async loops of boss.fetch(queue) →
// boss.complete(queue, id) (its documented pull API), in its own fresh
// schema. Seeds its partition with one INSERT … SELECT generate_series:
// `queued` ready jobs after `finished` completed ones (kept in the job
// table until its archive/retention timers move them, 12 h by default).
import { performance } from 'node:perf_hooks';
import PgBoss from 'pg-boss';
import { admin, childConfig, cpuProbe, dropSchema, newSchemaName, PG_URL, report, timedLoops, withAppName } from './common.mjs';

const { workers, jobs, maxSeconds, queued, finished = 0, poolMax } = childConfig();
const schema = newSchemaName('pgboss_lease_bench');
const QUEUE = 'noop';

const boss = new PgBoss({ connectionString: withAppName(PG_URL, schema), schema, ...(poolMax ? { max: poolMax } : {}) });
boss.on('error', (err) => process.stderr.write(`pg-boss: ${err.message}\n`));
let out;
try {
  await boss.start();
  await boss.createQueue(QUEUE);
  const t0 = performance.now();
  await admin(async (c) => {
    await c.query(
      `INSERT INTO ${schema}.job (name, data, state, started_on, completed_on, output)
       SELECT $1, '{}'::jsonb,
              CASE WHEN g <= $3 THEN 'completed' ELSE 'created' END::${schema}.job_state,
              CASE WHEN g <= $3 THEN now() END,
              CASE WHEN g <= $3 THEN now() END,
              CASE WHEN g <= $3 THEN 'null'::jsonb END
         FROM generate_series(1, $2::bigint + $3::bigint) g`,
      [QUEUE, queued, finished],
    );
    await c.query(`ANALYZE ${schema}.job`);
  });
  const seedMs = Math.round(performance.now() - t0);
  // start_after defaults to now() of the seed, and fetch wants start_after < now().
  await new Promise((r) => setTimeout(r, 20));

  const probe = await cpuProbe(schema);
  const result = await timedLoops({
    workers,
    jobs,
    maxSeconds,
    async cycle() {
      const [job] = await boss.fetch(QUEUE);
      if (!job) return false;
      const res = await boss.complete(QUEUE, job.id);
      if (res.affected !== 1) throw new Error(`complete affected ${res.affected}`);
      return true;
    },
  });
  const cpu = await probe.stop();
  await boss.stop({ graceful: false, wait: true });
  out = { system: 'pg-boss', mode: 'fetch-complete', workers, poolMax: poolMax ?? 10, queued, finished, seedMs, ...result, ...cpu };
} finally {
  await dropSchema(schema);
}
report(out);
