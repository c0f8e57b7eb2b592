#!/usr/bin/env node
// The long randomized soak, for humans (docs/faults.md). The CI version is
// test/faults/soak.test.ts; both run test/faults/soak/engine.ts.
//
//   npm run build && node bench/soak.mjs --minutes 10 [--seed N] [--workers 4]
//       [--jobs 100000] [--postgres URL] [--checks-off fence] [--keep]
//
// --postgres URL (or FENCEGATE_TEST_POSTGRES_URL) runs it on PostgreSQL in a
// fresh schema, with database cuts; otherwise (or with --sqlite) on SQLite. --checks-off fence is the negative control: the gateway
// runs without its fence check and the soak must REPORT violations.
// Prints a status line every 30 s and one summary line at the end; exits 1
// when an invariant was violated or the harness failed.
import '../test/lease/helpers/ts-register.mjs';
// The test helpers' "PostgreSQL suites are skipped" notice is not for this program.
process.env.FENCEGATE_PG_SKIP_NOTICE = '1';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: {
    minutes: { type: 'string' },
    seconds: { type: 'string' },
    seed: { type: 'string' },
    workers: { type: 'string', default: '4' },
    jobs: { type: 'string', default: '100000' },
    postgres: { type: 'string' },
    sqlite: { type: 'boolean', default: false },
    'checks-off': { type: 'string' },
    keep: { type: 'boolean', default: false },
    help: { type: 'boolean', default: false },
  },
});
if (values.help) {
  console.log(
    'usage: node bench/soak.mjs [--minutes N | --seconds N] [--seed N] [--workers N] [--jobs N] [--postgres URL | --sqlite] [--checks-off fence] [--keep]',
  );
  process.exit(0);
}
const seconds = values.seconds !== undefined ? Number(values.seconds) : Number(values.minutes ?? '1') * 60;
const postgresUrl = values.sqlite ? undefined : (values.postgres ?? process.env.FENCEGATE_TEST_POSTGRES_URL);
const seed = values.seed !== undefined ? Number(values.seed) : Math.floor(Math.random() * 2 ** 31);
if (!(seconds > 0) || !Number.isSafeInteger(seed)) throw new Error('--minutes/--seconds must be positive, --seed an integer');
if (values['checks-off'] !== undefined && values['checks-off'] !== 'fence') throw new Error('--checks-off takes "fence"');

const { runSoak } = await import('../test/faults/soak/engine.ts');
const started = new Date();
const report = await runSoak({
  seed,
  durationMs: seconds * 1000,
  workers: Number(values.workers),
  maxJobs: Number(values.jobs),
  backend: postgresUrl ? 'postgres' : 'sqlite',
  postgresUrl,
  checksOff: values['checks-off'],
  drainMs: 180_000,
  keep: values.keep,
  log: (line) => console.log(`[${new Date().toISOString()}] ${line}`),
});
console.log(`\nstarted ${started.toISOString()}, replay with --seed ${seed}${report.dir ? `; files kept in ${report.dir}` : ''}`);
for (const v of report.violations) console.log(`VIOLATION ${v}`);
for (const e of report.harnessErrors) console.log(`HARNESS ERROR ${e}`);
console.log(report.summary);
process.exit(report.violations.length > 0 || report.harnessErrors.length > 0 ? 1 : 0);
