// npm run bench:lease: the lease module's claim → complete cycles on
// PostgreSQL, beside graphile-worker and pg-boss, in one run.
//
// Part 1, cycles per second at 1, 4, 16 and 32 concurrent workers, each row
// in its own child process and fresh schema, `--jobs` ready jobs seeded
// with one INSERT … SELECT generate_series (graphile-worker: its add_jobs),
// then ANALYZE:
//   fg-runner    fencegate runWorker({ concurrency }): the real runner, its
//                heartbeat thread at the default period (5 s), a no-op
//                handler; timed by its events, first job_claimed → last
//                result_committed
//   fg-loop      fencegate, N async loops of store.claim → store.complete
//   graphile     graphile-worker run({ concurrency, taskList }), a no-op
//                task; first job:start → last job:complete
//   pg-boss      pg-boss 10, N async loops of boss.fetch → boss.complete
// Part 2, claim cost against the table's history: the store loop at 16
// workers on a table holding only the jobs it claims ("empty"), on one with
// 200,000 queued jobs and no history, and on one holding 1,000,000 finished
// (succeeded, every 10th failed) before 200,000 queued jobs; pg-boss the
// same (its completed jobs stay in its job table until archived, 12 h).
//
// Every pool has the same size (--pool, default 10: node-postgres' default,
// which graphile-worker and pg-boss use unless told). A row stops after
// --jobs completions or --max-seconds, whichever comes first; cycles/s is
// completions over the time they took. Beside each row: CPU per cycle of
// the client process and of its database backends (from /proc), which a
// busy machine inflates far less than it slows the wall clock.
//
// Options: --quick (small counts, workers 1,16), --workers 1,4,16,32,
// --jobs N (default 20000), --max-seconds N (default 15), --pool N,
// --rounds N (repeat part 1, report the median), --skip-history.
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { PG_URL, runChild } from './lease/common.mjs';
import { flag, option as opt } from './args.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const quick = flag('quick');
const workersList = opt('workers', quick ? '1,16' : '1,4,16,32')
  .split(',')
  .map(Number);
const jobs = Number(opt('jobs', quick ? 2000 : 20000));
const maxSeconds = Number(opt('max-seconds', quick ? 5 : 15));
const pool = Number(opt('pool', 10));
const rounds = Number(opt('rounds', 1));
const history = { finished: quick ? 50_000 : 1_000_000, queued: quick ? 20_000 : 200_000 };
const skipHistory = flag('skip-history');

if (!['127.0.0.1', 'localhost', '[::1]'].includes(new URL(PG_URL).hostname)) {
  console.error(`the benchmark talks to loopback only; ${new URL(PG_URL).hostname} is not`);
  process.exit(2);
}

const CHILD = {
  fencegate: join(here, 'lease/fencegate.mjs'),
  graphile: join(here, 'lease/graphile.mjs'),
  pgboss: join(here, 'lease/pgboss.mjs'),
};
const PART1 = [
  ['fg-runner', CHILD.fencegate, { mode: 'runner' }],
  ['fg-loop', CHILD.fencegate, { mode: 'raw' }],
  ['graphile', CHILD.graphile, {}],
  ['pg-boss', CHILD.pgboss, {}],
];

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const perCycle = (r) => ({ clientMs: r.clientCpuMs / r.completed, serverMs: r.serverCpuMs / r.completed });

async function run(name, script, config) {
  const t0 = Date.now();
  const r = await runChild(script, { jobs, maxSeconds, poolMax: pool, ...config });
  process.stderr.write(
    `${name} w=${config.workers}${config.finished ? ` history` : ''}: ${r.cyclesPerSecond.toFixed(0)}/s ` +
      `(${r.completed} in ${r.seconds.toFixed(1)} s${r.capped ? ', capped' : ''}; ${((Date.now() - t0) / 1000).toFixed(0)} s with setup) ` +
      `load ${loadavg()[0].toFixed(1)}\n`,
  );
  return { name, ...r, cpuPerCycle: perCycle(r), loadavg1: loadavg()[0] };
}

async function part1() {
  const rows = [];
  for (const workers of workersList) {
    const samples = Object.fromEntries(PART1.map(([name]) => [name, []]));
    for (let round = 0; round < rounds; round++) {
      for (const [name, script, extra] of PART1) {
        samples[name].push(await run(name, script, { ...extra, workers, queued: jobs }));
      }
    }
    const row = { workers };
    for (const [name] of PART1) {
      const s = samples[name];
      row[name] = {
        cyclesPerSecond: median(s.map((r) => r.cyclesPerSecond)),
        completed: s.map((r) => r.completed),
        capped: s.some((r) => r.capped),
        clientCpuMsPerCycle: median(s.map((r) => r.cpuPerCycle.clientMs)),
        serverCpuMsPerCycle: median(s.map((r) => r.cpuPerCycle.serverMs)),
        errors: s.reduce((n, r) => n + (r.rejected ?? 0), 0),
        samples: s.map((r) => r.cyclesPerSecond),
      };
    }
    const fg = row['fg-runner'].cyclesPerSecond;
    row.ratios = {
      runnerVsGraphile: fg / row.graphile.cyclesPerSecond,
      runnerVsPgBoss: fg / row['pg-boss'].cyclesPerSecond,
      loopVsGraphile: row['fg-loop'].cyclesPerSecond / row.graphile.cyclesPerSecond,
      loopVsPgBoss: row['fg-loop'].cyclesPerSecond / row['pg-boss'].cyclesPerSecond,
    };
    rows.push(row);
  }
  return rows;
}

async function part2() {
  const workers = 16;
  const cases = [
    ['fencegate', CHILD.fencegate, { mode: 'raw' }],
    ['pg-boss', CHILD.pgboss, {}],
  ];
  const rows = [];
  for (const [name, script, extra] of cases) {
    const empty = await run(name, script, { ...extra, workers, queued: jobs, finished: 0 });
    // The backlog alone, to tell a queue's size from its history.
    const backlog = await run(name, script, { ...extra, workers, queued: history.queued, finished: 0 });
    const full = await run(name, script, { ...extra, workers, ...history });
    rows.push({
      system: name,
      workers,
      empty: pick(empty),
      backlog: pick(backlog),
      history: pick(full),
      ratio: full.cyclesPerSecond / empty.cyclesPerSecond,
    });
  }
  return rows;
}

const pick = (r) => ({
  queued: r.queued,
  finished: r.finished,
  seedMs: r.seedMs,
  cyclesPerSecond: r.cyclesPerSecond,
  completed: r.completed,
  capped: r.capped,
  clientCpuMsPerCycle: r.cpuPerCycle.clientMs,
  serverCpuMsPerCycle: r.cpuPerCycle.serverMs,
});

async function main() {
  const load0 = loadavg();
  const machine = { cpus: cpus().length, model: cpus()[0]?.model, node: process.version };
  const serverVersion = await (await import('./lease/common.mjs')).admin(async (c) => (await c.query('SHOW server_version')).rows[0].server_version);
  const cycles = await part1();
  const historyRows = skipHistory ? [] : await part2();
  const load1 = loadavg();
  let commit = null;
  try {
    commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: here, encoding: 'utf8' }).trim();
  } catch {}
  const out = {
    date: new Date().toISOString(),
    commit,
    machine: { ...machine, postgres: serverVersion },
    loadavg: { start: load0, end: load1 },
    options: { workers: workersList, jobs, maxSeconds, pool, rounds, history, quick },
    cycles,
    history: historyRows,
  };
  mkdirSync(join(here, 'results'), { recursive: true });
  writeFileSync(join(here, 'results', quick ? 'lease.local.json' : 'lease.json'), JSON.stringify(out, null, 2) + '\n');

  const f0 = (v) => (v === undefined || Number.isNaN(v) ? '-' : v.toFixed(0));
  const f2 = (v) => (v === undefined || Number.isNaN(v) ? '-' : v.toFixed(2));
  const cap = (c) => (c.capped ? '*' : '');
  const la = (l) => l.map((x) => x.toFixed(2)).join(' ');
  console.log(
    `\nfencegate lease benchmark — ${machine.cpus} cores, ${machine.model}, node ${machine.node}, PostgreSQL ${serverVersion}, ` +
      `pool ${pool} each, ${jobs} jobs or ${maxSeconds} s per row${rounds > 1 ? `, median of ${rounds}` : ''}; load average ${la(load0)} → ${la(load1)}`,
  );
  console.log('\nclaim → complete cycles/s (* = stopped at --max-seconds before all jobs were done)');
  console.log(
    '| workers | fencegate runWorker | fencegate store loop | graphile-worker | pg-boss | runWorker ÷ graphile | runWorker ÷ pg-boss | store loop ÷ graphile |',
  );
  console.log('|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const r of cycles) {
    console.log(
      `| ${r.workers} | ${f0(r['fg-runner'].cyclesPerSecond)}${cap(r['fg-runner'])} | ${f0(r['fg-loop'].cyclesPerSecond)}${cap(r['fg-loop'])} | ` +
        `${f0(r.graphile.cyclesPerSecond)}${cap(r.graphile)} | ${f0(r['pg-boss'].cyclesPerSecond)}${cap(r['pg-boss'])} | ` +
        `${f2(r.ratios.runnerVsGraphile)} | ${f2(r.ratios.runnerVsPgBoss)} | ${f2(r.ratios.loopVsGraphile)} |`,
    );
  }
  console.log('\nCPU per cycle, ms: client process / its database backends');
  console.log('| workers | fencegate runWorker | fencegate store loop | graphile-worker | pg-boss |');
  console.log('|---:|---:|---:|---:|---:|');
  for (const r of cycles) {
    const c = (x) => `${f2(x.clientCpuMsPerCycle)} / ${f2(x.serverCpuMsPerCycle)}`;
    console.log(`| ${r.workers} | ${c(r['fg-runner'])} | ${c(r['fg-loop'])} | ${c(r.graphile)} | ${c(r['pg-boss'])} |`);
  }
  if (historyRows.length) {
    console.log(
      `\nclaim cost against history: 16 workers, claim → complete loop; "empty" holds only the ${jobs} jobs to claim, ` +
        `"history" ${history.finished.toLocaleString('en')} finished + ${history.queued.toLocaleString('en')} queued`,
    );
    console.log(
      `| system | empty cycles/s | ${history.queued.toLocaleString('en')} queued only | history cycles/s | history ÷ empty | ` +
        'server CPU ms/cycle: empty / queued only / history | seed of history (s) |',
    );
    console.log('|---|---:|---:|---:|---:|---:|---:|');
    for (const r of historyRows) {
      console.log(
        `| ${r.system} | ${f0(r.empty.cyclesPerSecond)}${cap(r.empty)} | ${f0(r.backlog.cyclesPerSecond)}${cap(r.backlog)} | ` +
          `${f0(r.history.cyclesPerSecond)}${cap(r.history)} | ${f2(r.ratio)} | ` +
          `${f2(r.empty.serverCpuMsPerCycle)} / ${f2(r.backlog.serverCpuMsPerCycle)} / ${f2(r.history.serverCpuMsPerCycle)} | ` +
          `${(r.history.seedMs / 1000).toFixed(1)} |`,
      );
    }
  }
  console.log(`\n(written to bench/results/${quick ? 'lease.local.json' : 'lease.json'})`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
