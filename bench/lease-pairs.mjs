// Interleaved rounds of the lease benchmark's part 1 rows, for a before/after
// comparison on a busy machine: in each round, at each concurrency, the rows
// run back to back (the runner of another build with --base, this build's
// runner, this build's store loop, graphile-worker), so a neighbour's load
// hits them alike. Prints every row with the load average when it ended,
// the per-round ratios to graphile-worker, and their medians.
//
//   npm run build && node bench/lease-pairs.mjs --workers 16,32 --rounds 5 [--base DIR] [--jobs N] [--max-seconds N] [--pool N]
//
// --base DIR: a checkout of another commit with its own `npm run build`
// (dist/ and bench/lease/ are run from there, node_modules resolved from
// there too). Without it the "before" row is skipped.
import { loadavg } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { flag, option as opt } from './args.mjs';
import { PG_URL, runChild } from './lease/common.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const workersList = opt('workers', '16,32').split(',').map(Number);
const rounds = Number(opt('rounds', 5));
const jobs = Number(opt('jobs', 20000));
const maxSeconds = Number(opt('max-seconds', 15));
const pool = Number(opt('pool', 10));
const base = opt('base', null);
const skipGraphile = flag('skip-graphile');

if (!['127.0.0.1', 'localhost', '[::1]'].includes(new URL(PG_URL).hostname)) {
  console.error(`the benchmark talks to loopback only; ${new URL(PG_URL).hostname} is not`);
  process.exit(2);
}

const ROWS = [
  ...(base ? [['before runner', join(resolve(base), 'bench/lease/fencegate.mjs'), { mode: 'runner' }]] : []),
  ['runner', join(here, 'lease/fencegate.mjs'), { mode: 'runner' }],
  ['store loop', join(here, 'lease/fencegate.mjs'), { mode: 'raw' }],
  ...(skipGraphile ? [] : [['graphile', join(here, 'lease/graphile.mjs'), {}]]),
];

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const f2 = (x) => x.toFixed(2);

const results = {}; // results[workers][row] = [{ cps, client, server, load }]
const loadStart = loadavg();
for (let round = 0; round < rounds; round++) {
  for (const workers of workersList) {
    for (const [name, script, extra] of ROWS) {
      const r = await runChild(script, { jobs, maxSeconds, poolMax: pool, workers, queued: jobs, ...extra });
      const sample = {
        cps: r.cyclesPerSecond,
        client: r.clientCpuMs / r.completed,
        server: r.serverCpuMs / r.completed,
        capped: r.capped,
        load: loadavg()[0],
        // Statements on tool_jobs per completed job (fencegate rows; absent for a --base too old to count them).
        statements: r.statements && Object.fromEntries(Object.entries(r.statements).map(([k, n]) => [k, n / r.completed])),
      };
      ((results[workers] ??= {})[name] ??= []).push(sample);
      process.stderr.write(
        `round ${round + 1} w=${workers} ${name}: ${sample.cps.toFixed(0)}/s${r.capped ? '*' : ''} ` +
          `cpu/cycle ${f2(sample.client)} / ${f2(sample.server)} ms, load ${sample.load.toFixed(1)}\n`,
      );
    }
  }
}
const loadEnd = loadavg();

console.log(`load average at the start ${loadStart.map(f2).join(' ')}, at the end ${loadEnd.map(f2).join(' ')}`);
const names = ROWS.map(([n]) => n);
console.log(
  `\n| workers | ${names.map((n) => `${n} cycles/s`).join(' | ')} | ${names
    .filter((n) => n !== 'graphile')
    .map((n) => `${n} ÷ graphile`)
    .join(' | ')} |`,
);
console.log(
  `|---:|${names.map(() => '---:').join('|')}|${names
    .filter((n) => n !== 'graphile')
    .map(() => '---:')
    .join('|')}|`,
);
for (const workers of workersList) {
  const row = results[workers];
  const cells = names.map((n) => median(row[n].map((s) => s.cps)).toFixed(0) + (row[n].some((s) => s.capped) ? '*' : ''));
  // Per-round ratios (each against the graphile row of the same round), then their median.
  const ratios = skipGraphile ? [] : names.filter((n) => n !== 'graphile').map((n) => f2(median(row[n].map((s, i) => s.cps / row.graphile[i].cps))));
  console.log(`| ${workers} | ${cells.join(' | ')} | ${ratios.join(' | ')} |`);
}
console.log(`\nCPU per cycle, ms, medians: client process / its database backends`);
console.log(`| workers | ${names.join(' | ')} |`);
console.log(`|---:|${names.map(() => '---:').join('|')}|`);
for (const workers of workersList) {
  const row = results[workers];
  console.log(`| ${workers} | ${names.map((n) => `${f2(median(row[n].map((s) => s.client)))} / ${f2(median(row[n].map((s) => s.server)))}`).join(' | ')} |`);
}
const counted = names.filter((n) => workersList.every((w) => results[w][n].every((s) => s.statements)));
if (counted.length > 0) {
  console.log(`\nStatements on tool_jobs per job, medians: all (claim + complete + complete-and-claim)`);
  console.log(`| workers | ${counted.join(' | ')} |`);
  console.log(`|---:|${counted.map(() => '---:').join('|')}|`);
  const per = (row, key) => median(row.map((s) => (key ? s.statements[key] : Object.values(s.statements).reduce((a, b) => a + b, 0))));
  for (const workers of workersList) {
    const cells = counted.map((n) => {
      const row = results[workers][n];
      return `${per(row).toFixed(3)} (${per(row, 'claim').toFixed(3)} + ${per(row, 'complete').toFixed(3)} + ${per(row, 'completeAndClaim').toFixed(3)})`;
    });
    console.log(`| ${workers} | ${cells.join(' | ')} |`);
  }
}
console.log(`\nper-round cycles/s:`);
for (const workers of workersList) {
  for (const n of names) console.log(`w=${workers} ${n}: ${results[workers][n].map((s) => s.cps.toFixed(0)).join(', ')}`);
}
