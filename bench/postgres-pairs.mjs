// The PostgreSQL gateway store alone, through its public interface, as
// bench/store-pairs.mjs does for SQLite: one admission and one finish per
// request (new key, rising fence, one of 1000 entities, serial mode) at
// --concurrency C, on a fresh schema dropped afterwards. Reports the wall
// time, this process's CPU and PostgreSQL's (every `postgres` process of
// the machine, from /proc: run it on a quiet box) per request.
//
//   npm run build && FENCEGATE_TEST_POSTGRES_URL=postgres://… node bench/postgres-pairs.mjs [--concurrency 50] [--requests 10000] [--no-listen]
import pg from 'pg';
import { createPostgresStore } from '../dist/store/postgres/index.js';
import { flag, option } from './args.mjs';
import { postgresProcesses } from './lib.mjs';
import { pairRunner } from './store-pair.mjs';

const url = process.env.FENCEGATE_BENCH_POSTGRES_URL ?? process.env.FENCEGATE_TEST_POSTGRES_URL;
if (!url) throw new Error('set FENCEGATE_TEST_POSTGRES_URL (or FENCEGATE_BENCH_POSTGRES_URL)');
const concurrency = Number(option('concurrency', 50));
const requests = Number(option('requests', 10000));
const schema = `fg_bench_pairs_${process.pid}`;

/** CPU time (µs) of every PostgreSQL process alive now. */
const postgresCpuUs = () => postgresProcesses().reduce((us, p) => us + p.ticks * 10_000, 0);

const store = await createPostgresStore({ connectionString: url, schema, listen: !flag('no-listen') });
const run = pairRunner(store, concurrency);

try {
  await run(2000); // warm-up
  const t0 = process.hrtime.bigint();
  const cpu0 = process.cpuUsage();
  const pg0 = postgresCpuUs();
  await run(requests);
  const wallUs = Number(process.hrtime.bigint() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const pgUs = postgresCpuUs() - pg0;
  console.log(
    `concurrency ${concurrency}${flag('no-listen') ? ', no LISTEN' : ''}: ${((requests / wallUs) * 1e6).toFixed(0)} pairs/s; per pair ` +
      `${(wallUs / requests).toFixed(1)} µs wall, ${((cpu.user + cpu.system) / requests).toFixed(1)} µs CPU here, ${(pgUs / requests).toFixed(1)} µs PostgreSQL CPU`,
  );
} finally {
  await store.close();
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  await c.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  await c.end();
}
