// npm run bench: fencegate beside its control and its peer, in one run.
//
//   direct      autocannon → upstream                       (the physical floor)
//   bare        → node:http + undici proxy → upstream       (the floor of a second hop)
//   control     → stateless Hono + undici proxy → upstream  (the issue's reference, no decisions)
//   fg-full     → fencegate, SQLite synchronous=FULL        (the default)
//   fg-normal   → fencegate, SQLite synchronous=NORMAL
//   fg-auth     → fg-normal with caller auth on: every request carries a
//                 bearer token (HS256) that the gateway verifies
//   fg-postgres → fencegate, PostgreSQL                     (when a database URL is set)
//   fg-postgres-xN → N fencegate replicas on one PostgreSQL schema, the
//                 client's connections split over them (--replicas N, N > 1)
//   pg-ceiling  → no HTTP: two small write transactions per "request" straight
//                 to PostgreSQL at the same concurrency (bench/pg-ceiling.mjs)
//   peer        → express + express-idempotency (in-memory) → upstream
//   fg-normal-wN → fg-normal run as `serve --workers N` (--workers 1,2: one
//                 target per count), every process of the group free to run
//                 on every core, as the upstream and the load are on a small
//                 box: compare the counts with each other, side by side
//                 (CPU µs/req: the whole group's, primary included)
//   fg-nostore  → fencegate with fence, idempotency and serial mode off (only with --only)
//   fg-hono     → fg-normal served through the Hono app for every request, as
//                 before the Node listener (only with --only)
//
// Every request is a new command: a new Idempotency-Key, a rising fence,
// one of 1000 entities, in serial mode. Targets run one at a time; the
// server under test is pinned to core 0 and the upstream to core 1 (when
// taskset exists); the load generator (bench/load.mjs) runs in a process of
// its own, pinned to the last core (FENCEGATE_BENCH_LOAD_CPU overrides);
// replicas are pinned to cores in turn. PostgreSQL itself is not pinned.
// Results are ratios against `bare` (the floor of a second hop) and the
// control measured in the same run; absolute numbers depend on the box.
// Beside throughput, each server's own CPU per request at 50 connections
// (user + system of its process, every thread, from /proc): on a shared
// box the load around a run moves throughput far more than what a request
// costs the server.
//
// Output, after the table of medians: the spread over the rounds (each
// target's CPU µs/req and req/s @50 round by round, max/min of each, and
// the CPU per request split into the server's main thread and its other
// threads: GC helpers, the SQLite checkpoint worker, libuv's pool), then the
// project's speed targets, each the median of its per-round ratios (or
// differences) against its bound: met, not met, or not measured when a row
// is not in the run. fg-full's latency bound counts one fsync of the disk
// under the SQLite files, measured at the start of every round (median of
// 50 fdatasync() after a 4 KiB overwrite). The load average at start and
// end closes it. All of it is in the JSON result too (targets, fsync,
// loadavg, and per row spread, cpu_main_us, cpu_other_us, rounds). Why the
// same build's CPU per request moves between rounds: docs/performance.md,
// "Why the same build's CPU per request varies".
//
// --pg-core N puts PostgreSQL on core N alone (every postgres process of the
// machine is pinned there for the run and given its mask back after; needs
// the right to do so) and everything else on the other cores: the database
// as on a host of its own, the app tier the same for every target. Such a
// run writes bench/results/http.pg-core.json.
//
// Options: --seconds N (default 10) per throughput run, --warmup N (default
// 2) seconds of load before it, --latency N (default
// 3000) sequential requests per latency run, --rounds N (default 3; targets
// interleaved, median per target), --only a,b to pick targets, --base DIR
// to add `base-normal`, `base-full` and `base-auth`: the same SQLite targets served by
// another checkout's build (DIR/dist, e.g. a clone of the previous commit),
// interleaved with this one's so that a refactor is measured in one run
// (and `base-postgres` when a database URL is set). --replicas N adds
// `fg-postgres-xN`. --dist DIR serves this tree's targets from DIR instead
// of dist/; --cpu-prof DIR [--cpu-prof-interval µs] runs every gateway under
// `node --cpu-prof` (bench/profile-summary.mjs splits a profile by part;
// bench/profile-http.mjs profiles the 50-connection run alone).
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { constants, cpus, loadavg, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import {
  cpuMsOf,
  fsyncMedianUs,
  latency,
  load,
  loadCpu,
  paymentsRoute,
  pinPostgres,
  pinned,
  placeLoad,
  startGateway,
  startNode,
  threadCpuMsOf,
  throughput,
  waitReady,
} from './lib.mjs';
import { flag, option as opt } from './args.mjs';
import { AUTH, bearer } from './auth-token.mjs';

const here = dirname(fileURLToPath(import.meta.url));
// --help: the header comment above (targets and options), and nothing run.
if (flag('help')) {
  const { readFileSync } = await import('node:fs');
  const text = readFileSync(fileURLToPath(import.meta.url), 'utf8').split('\nimport ')[0];
  process.stdout.write(`${text.replace(/^\/\/ ?/gm, '')}\n`);
  process.exit(0);
}
const root = join(here, '..');
const seconds = Number(opt('seconds', 10));
const latencyRequests = Number(opt('latency', 3000));
const rounds = Number(opt('rounds', 3));
// --warmup S: seconds of load at 50 connections before each target's
// measured run (JIT, pools, page cache). A time, not a number of requests:
// on a busy box fewer requests fit in it and more of the JIT's work falls
// into the measured run (docs/performance.md, "Why the same build's CPU per
// request varies").
const warmup = Number(opt('warmup', 2));
const only = opt('only', null)?.split(',');
const base = opt('base', null);
const replicas = Number(opt('replicas', 1));
// --workers 1,2: the fg-normal-wN targets (serve --workers N), one per count.
const workerCounts = (opt('workers', null)?.split(',') ?? []).map(Number);
if (workerCounts.some((w) => !Number.isInteger(w) || w < 1)) {
  console.error('--workers takes worker counts, e.g. --workers 1,2');
  process.exit(2);
}
// --dist DIR: serve this tree's fencegate targets from DIR (a build made with
// `tsc -p tsconfig.build.json --outDir DIR`) instead of dist/, so that a
// measurement is not disturbed by a rebuild of dist/ while it runs.
const dist = opt('dist', join(root, 'dist'));
// --cpu-prof DIR: every gateway (fencegate targets, bare, control) runs
// under `node --cpu-prof`, one .cpuprofile per start written into DIR
// (bench/profile-summary.mjs splits one by part).
const cpuProf = opt('cpu-prof', null);
const nodeFlags = cpuProf ? ['--cpu-prof', '--cpu-prof-dir', cpuProf, '--cpu-prof-interval', String(opt('cpu-prof-interval', 100))] : [];
const pgUrl = process.env.FENCEGATE_BENCH_POSTGRES_URL ?? process.env.FENCEGATE_TEST_POSTGRES_URL;
// --pg-core N: the database's core; the app tier (servers, upstream, load) gets the others.
const pgCoreArg = opt('pg-core', null);
const pgCore = pgCoreArg === null ? null : /^\d+$/.test(pgCoreArg ?? '') ? Number(pgCoreArg) : NaN;
const cores = cpus().length;
if (pgCore !== null && (!pgUrl || !pinned || !Number.isInteger(pgCore) || pgCore < 0 || pgCore >= cores || cores < 2)) {
  console.error('--pg-core N needs a database URL, taskset, at least two cores and 0 <= N < cores');
  process.exit(2);
}
const appCores = pgCore === null ? null : [...Array(cores).keys()].filter((c) => c !== pgCore);
/** Where a server runs: core 0 (the upstream: core 1), or with --pg-core the app cores. */
const serverCpu = (i = 0) => (appCores === null ? i % cores : appCores[i % appCores.length]);
const upstreamCpu = appCores === null ? 1 : appCores.join(',');
if (appCores !== null) placeLoad(appCores[appCores.length - 1]);

const tmp = mkdtempSync(join(tmpdir(), 'fencegate-bench-'));
const stops = [];
process.on('exit', () => rmSync(tmp, { recursive: true, force: true }));

async function startFencegate(name, store, upstream, route = {}, server = join(dist, 'entry/cli.js'), cpu = serverCpu(), config = {}) {
  // The decision log (one JSON line per request, as in production) goes to a file.
  const args = server.endsWith('cli.js') ? undefined : (file) => [file];
  return startGateway(server, {
    dir: tmp,
    name,
    store,
    routes: [paymentsRoute(upstream, route)],
    config,
    args,
    cpus: cpu,
    stdoutFile: join(tmp, `${name}.log`),
    nodeFlags,
  });
}

// The auth targets: caller auth with the benchmarks' token (./auth-token.mjs) on every request.
const startAuth = (name, server) => async () => ({
  ...(await startFencegate(name, { sqlite: join(tmp, `${name}-${Date.now()}.db`), synchronous: 'NORMAL' }, upstreamUrl, {}, server, serverCpu(), {
    auth: AUTH,
  })),
  headers: { authorization: bearer },
});
let upstreamUrl = '';

/** CPU (ms) of a process and every process below it (a serve --workers group: the primary and its workers), from /proc. */
function treeCpuMs(pid) {
  let total = cpuMsOf(pid);
  if (total === null) return null;
  for (const task of (() => {
    try {
      return readdirSync(`/proc/${pid}/task`);
    } catch {
      return [];
    }
  })()) {
    let children = '';
    try {
      children = readFileSync(`/proc/${pid}/task/${task}/children`, 'utf8');
    } catch {}
    for (const child of children.split(' ').filter(Boolean)) total += treeCpuMs(Number(child)) ?? 0;
  }
  return total;
}

/** fg-normal as `serve --workers n`, every process of the group on every core. */
async function startWorkers(n) {
  const name = `normal-w${n}`;
  const all = `0-${cores - 1}`;
  const started = await startGateway(join(dist, 'entry/cli.js'), {
    dir: tmp,
    name,
    store: { sqlite: join(tmp, `${name}-${Date.now()}.db`), synchronous: 'NORMAL' },
    routes: [paymentsRoute(upstreamUrl)],
    args: (file) => ['serve', '--config', file, '--workers', String(n)],
    cpus: all,
    env: { FENCEGATE_WORKERS: String(n) },
    stdoutFile: join(tmp, `${name}.log`),
    nodeFlags,
  });
  // The port answers once the first worker listens: wait for the whole group (its /metrics counts them).
  for (let i = 0; i < 200; i++) {
    const text = await fetch(`${started.url}/_fencegate/metrics`).then(
      (r) => r.text(),
      () => '',
    );
    const m = /fencegate_workers\{state="answered"\} (\d+)/.exec(text);
    if (n === 1 ? text.includes('fencegate_requests_total') : m !== null && Number(m[1]) === n) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  // No split by thread: the group is several processes.
  return { ...started, cpuMs: () => treeCpuMs(started.pid), primaryCpuMs: n > 1 ? () => cpuMsOf(started.pid) : null, group: true };
}

const schemas = new Set();
/** A fresh schema for one PostgreSQL target (every round starts empty), and its connection string. */
async function freshSchema(name) {
  const schema = `fg_bench_${name.replace(/[^a-z0-9]/g, '_')}_${process.pid}`;
  schemas.add(schema);
  const c = new pg.Client({ connectionString: pgUrl });
  await c.connect();
  await c.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE; CREATE SCHEMA ${schema}`);
  await c.end();
  const u = new URL(pgUrl);
  u.searchParams.set('options', `-c search_path=${schema}`);
  return u.toString();
}

/** `n` gateways on one fresh schema, pinned to cores in turn: one target whose client splits its connections over them. */
async function startPostgresReplicas(name, n, upstream, server) {
  const url = await freshSchema(name);
  const started = [];
  // The first one migrates the schema alone; the others find it migrated.
  for (let i = 0; i < n; i++) started.push(await startFencegate(`${name}-${i}`, { postgres: url, poolSize: 20 }, upstream, {}, server, serverCpu(i)));
  return { url: started.length === 1 ? started[0].url : started.map((s) => s.url), stop: () => Promise.all(started.map((s) => s.stop())) };
}

async function main() {
  if (pgCore !== null) {
    // The handlers first: a signal that comes while the processes are being
    // pinned is handled after it, and the exit then gives their masks back.
    for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(signal, () => process.exit(128 + constants.signals[signal]));
    process.on('exit', pinPostgres(pgCore));
  }
  const upstream = await startNode(join(here, 'servers/upstream.mjs'), { cpus: upstreamCpu });
  stops.push(upstream);
  upstreamUrl = upstream.url;

  const targets = [
    ['direct', async () => ({ url: upstream.url, stop: async () => {} })],
    ['bare', () => startNode(join(here, 'servers/bare-proxy.mjs'), { cpus: serverCpu(), env: { UPSTREAM: upstream.url }, nodeFlags })],
    ['control', () => startNode(join(here, 'servers/stateless-proxy.mjs'), { cpus: serverCpu(), env: { UPSTREAM: upstream.url }, nodeFlags })],
    ['fg-full', () => startFencegate('full', { sqlite: join(tmp, `full-${Date.now()}.db`), synchronous: 'FULL' }, upstream.url)],
    ['fg-normal', () => startFencegate('normal', { sqlite: join(tmp, `normal-${Date.now()}.db`), synchronous: 'NORMAL' }, upstream.url)],
    ['fg-auth', startAuth('auth')],
    ...(pgUrl
      ? [
          ['fg-postgres', () => startPostgresReplicas('postgres', 1, upstream.url)],
          ...(replicas > 1 ? [[`fg-postgres-x${replicas}`, () => startPostgresReplicas(`postgres-x${replicas}`, replicas, upstream.url)]] : []),
          ['pg-ceiling', async () => ({ ceiling: true, stop: async () => {} })],
        ]
      : []),
    // Diagnostic, only with --only fg-nostore: the same gateway with fencing,
    // idempotency and serial mode off, so that no decision touches a row:
    // fencegate's HTTP path against the control's.
    [
      'fg-nostore',
      () =>
        startFencegate('nostore', { sqlite: join(tmp, `nostore-${Date.now()}.db`), synchronous: 'NORMAL' }, upstream.url, {
          fence: 'off',
          idempotency: 'off',
          mode: 'concurrent',
        }),
    ],
    ...(base
      ? [
          [
            'base-full',
            () =>
              startFencegate(
                'base-full',
                { sqlite: join(tmp, `base-full-${Date.now()}.db`), synchronous: 'FULL' },
                upstream.url,
                {},
                join(base, 'dist/entry/cli.js'),
              ),
          ],
          [
            'base-normal',
            () =>
              startFencegate(
                'base-normal',
                { sqlite: join(tmp, `base-normal-${Date.now()}.db`), synchronous: 'NORMAL' },
                upstream.url,
                {},
                join(base, 'dist/entry/cli.js'),
              ),
          ],
          ['base-auth', startAuth('base-auth', join(base, 'dist/entry/cli.js'))],
          ...(pgUrl ? [['base-postgres', () => startPostgresReplicas('base-postgres', 1, upstream.url, join(base, 'dist/entry/cli.js'))]] : []),
        ]
      : []),
    [
      'fg-hono',
      () =>
        startFencegate(
          'hono',
          { sqlite: join(tmp, `hono-${Date.now()}.db`), synchronous: 'NORMAL' },
          upstream.url,
          {},
          join(here, 'servers/fencegate-hono.mjs'),
        ),
    ],
    ['peer', () => startNode(join(here, 'servers/idempotency-peer.mjs'), { cpus: serverCpu(), env: { UPSTREAM: upstream.url } })],
    ...workerCounts.map((w) => [`fg-normal-w${w}`, () => startWorkers(w)]),
  ].filter(([name]) => (only ? only.includes(name) || /^fg-normal-w\d+$/.test(name) : name !== 'fg-nostore' && name !== 'fg-hono'));

  // Rounds interleave the targets, so that a load change on the box hits
  // every target alike; each target's row is the median of its rounds.
  const runs = new Map(targets.map(([name]) => [name, []]));
  const loadAtStart = loadavg();
  // One fsync of the disk under the SQLite files, measured in every round
  // (nothing under test running): fg-full's latency bound is bare's plus it.
  const fsyncs = [];
  for (let round = 1; round <= rounds; round++) {
    fsyncs.push(fsyncMedianUs(tmp));
    process.stderr.write(`round ${round}: fsync (fdatasync of a 4 KiB overwrite, median of 50) ${fsyncs[fsyncs.length - 1].toFixed(0)} µs\n`);
    for (const [name, start] of targets) {
      const target = await start();
      if (target.ceiling) {
        const c = await load({ kind: 'pg-ceiling', url: pgUrl, connections: 50, seconds, pool: 20 });
        runs.get(name).push({ rps50: c.rps, cpu_us: null, p50_50c: null, p99_50c: null, p50_1c: null, p99_1c: null, errors: c.errors, statuses: {} });
        process.stderr.write(`round ${round}: ${name} ${c.rps.toFixed(0)} pairs/s\n`);
        continue;
      }
      for (const u of [target.url].flat()) await waitReady(u);
      // Warm-up: JIT, connection pools, SQLite page cache.
      const { headers } = target;
      if (warmup > 0) await throughput(target.url, { connections: 50, seconds: warmup, prefix: `${name}-warm-${round}`, headers });
      // The serving process's own CPU over the run (user + system, every
      // thread, from /proc), per request: what a request costs the server,
      // which the box's other load moves far less than its throughput.
      // The same split by thread (one process only): the main thread (the
      // event loop) and every other thread of it (GC helpers, the SQLite
      // checkpoint worker, libuv's pool).
      const threadsOf = () => (target.pid !== undefined && !target.group ? threadCpuMsOf(target.pid) : null);
      const cpuBefore = target.cpuMs?.() ?? null;
      const primaryBefore = target.primaryCpuMs?.() ?? null;
      const threadsBefore = threadsOf();
      const t50 = await throughput(target.url, { connections: 50, seconds, prefix: `${name}-t50-${round}`, headers });
      const cpuAfter = target.cpuMs?.() ?? null;
      const primaryAfter = target.primaryCpuMs?.() ?? null;
      const threadsAfter = threadsOf();
      const cpuUs = cpuBefore !== null && cpuAfter !== null && t50.total > 0 ? ((cpuAfter - cpuBefore) * 1000) / t50.total : null;
      const perThread =
        threadsBefore !== null && threadsAfter !== null && t50.total > 0
          ? {
              cpu_main_us: ((threadsAfter.main - threadsBefore.main) * 1000) / t50.total,
              cpu_other_us: ((threadsAfter.other - threadsBefore.other) * 1000) / t50.total,
            }
          : {};
      // A serve --workers group: the primary's share of it (accepting connections, relaying log lines, summing /metrics).
      const primaryUs = primaryBefore !== null && primaryAfter !== null && t50.total > 0 ? ((primaryAfter - primaryBefore) * 1000) / t50.total : null;
      const l1 = await latency(target.url, { requests: latencyRequests, prefix: `${name}-l1-${round}`, headers });
      runs.get(name).push({
        rps50: t50.rps,
        cpu_us: cpuUs,
        p50_50c: t50.p50,
        p99_50c: t50.p99,
        p50_1c: l1.p50,
        p99_1c: l1.p99,
        errors: t50.errors + l1.errors,
        statuses: t50.statuses,
        ...(primaryUs !== null ? { cpu_primary_us: primaryUs } : {}),
        ...perThread,
      });
      await target.stop();
      process.stderr.write(
        `round ${round}: ${name} ${t50.rps.toFixed(0)} req/s, ${cpuUs === null ? '-' : cpuUs.toFixed(0)} µs CPU/req${primaryUs === null ? '' : ` (primary ${primaryUs.toFixed(0)})`}${perThread.cpu_main_us === undefined ? '' : ` (main thread ${perThread.cpu_main_us.toFixed(0)}, other threads ${perThread.cpu_other_us.toFixed(0)})`}, p50@1 ${l1.p50.toFixed(3)} ms\n`,
      );
    }
  }
  const median = (xs) => {
    if (xs.length === 0 || xs.some((x) => x === null || x === undefined)) return null;
    const v = [...xs].sort((a, b) => a - b);
    return v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
  };
  /** min, max and max/min of the per-round values (null when one is missing). */
  const spread = (xs) => {
    if (xs.length === 0 || xs.some((x) => x === null || x === undefined)) return null;
    const min = Math.min(...xs);
    const max = Math.max(...xs);
    return { min, max, max_over_min: min > 0 ? max / min : null };
  };
  const rows = [...runs].map(([name, rs]) => ({
    target: name,
    rps50: median(rs.map((r) => r.rps50)),
    cpu_us: median(rs.map((r) => r.cpu_us)),
    p50_50c: median(rs.map((r) => r.p50_50c)),
    p99_50c: median(rs.map((r) => r.p99_50c)),
    p50_1c: median(rs.map((r) => r.p50_1c)),
    p99_1c: median(rs.map((r) => r.p99_1c)),
    errors: rs.reduce((n, r) => n + r.errors, 0),
    statuses: rs.map((r) => r.statuses),
    cpu_main_us: median(rs.map((r) => r.cpu_main_us ?? null)),
    cpu_other_us: median(rs.map((r) => r.cpu_other_us ?? null)),
    // The spread over the rounds: the same build's CPU per request moves by
    // a lot between rounds and runs (docs/performance.md, "Why the same
    // build's CPU per request varies").
    spread: { cpu_us: spread(rs.map((r) => r.cpu_us)), rps50: spread(rs.map((r) => r.rps50)) },
    rounds: rs,
  }));
  await upstream.stop();
  await dropSchemas();

  // Ratios are paired by round (each target against the control and the
  // floor measured minutes apart, in the same round) and then the median is
  // taken: the box's speed drifts between rounds by more than the effects
  // measured here, and a ratio of medians would mix rounds.
  const control = runs.get('control');
  const bare = runs.get('bare');
  const direct = runs.get('direct');
  const ceiling = runs.get('pg-ceiling');
  for (const r of rows) {
    const mine = runs.get(r.target);
    r.vs_bare = bare ? median(mine.map((m, i) => m.rps50 / bare[i].rps50)) : null;
    r.cpu_vs_bare = bare && mine.every((m, i) => m.cpu_us !== null && bare[i].cpu_us) ? median(mine.map((m, i) => m.cpu_us / bare[i].cpu_us)) : null;
    r.vs_control = control ? median(mine.map((m, i) => m.rps50 / control[i].rps50)) : null;
    r.vs_pg_ceiling = ceiling && r.target.includes('postgres') ? median(mine.map((m, i) => m.rps50 / ceiling[i].rps50)) : null;
    r.added_p50_1c_ms = direct && mine[0].p50_1c !== null ? median(mine.map((m, i) => m.p50_1c - direct[i].p50_1c)) : null;
  }
  const fsync = { median_us: median(fsyncs), rounds_us: fsyncs };
  const goals = targetChecks(runs, fsyncs, median, spread);
  const loadAtEnd = loadavg();
  const machine = { cpus: cpus().length, model: cpus()[0]?.model, node: process.version, pinned, loadCpu: pinned ? loadCpu : null, pgCore, replicas };
  const out = {
    date: new Date().toISOString(),
    machine,
    seconds,
    warmup,
    latencyRequests,
    rounds,
    loadavg: { start: loadAtStart, end: loadAtEnd },
    fsync,
    targets: goals,
    rows,
  };
  mkdirSync(join(here, 'results'), { recursive: true });
  // A partial run (--only) or a comparison (--base) never replaces the committed full table.
  const written = only || base || workerCounts.length > 0 ? 'http.local.json' : pgCore !== null ? 'http.pg-core.json' : 'http.json';
  writeFileSync(join(here, 'results', written), JSON.stringify(out, null, 2) + '\n');

  const fmt = (v, d = 2) => (v === null || v === undefined ? '-' : typeof v === 'number' ? v.toFixed(d) : String(v));
  console.log(
    `\nfencegate HTTP benchmark — ${machine.cpus} cores, ${machine.model}, node ${machine.node}, pinned=${pinned} (load on core ${machine.loadCpu ?? '-'}${pgCore === null ? '' : `, PostgreSQL alone on core ${pgCore}`}), ${seconds}s per run after ${warmup}s of warm-up, median of ${rounds} interleaved rounds (ratios and added latency: medians of the per-round ratios and differences)`,
  );
  console.log(
    '| target | req/s @50 | × bare | × control | × pg-ceiling | CPU µs/req @50 | CPU × bare | p50 @50 (ms) | p99 @50 (ms) | p50 @1 (ms) | p99 @1 (ms) | added p50 @1 vs direct (ms) | errors |',
  );
  console.log('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const r of rows) {
    if (r.errors > 0) process.stderr.write(`${r.target}: statuses ${JSON.stringify(r.statuses)}\n`);
    console.log(
      `| ${r.target} | ${fmt(r.rps50, 0)} | ${fmt(r.vs_bare)} | ${fmt(r.vs_control)} | ${fmt(r.vs_pg_ceiling)} | ${fmt(r.cpu_us, 0)} | ${fmt(r.cpu_vs_bare)} | ${fmt(r.p50_50c, 0)} | ${fmt(r.p99_50c, 0)} | ${fmt(r.p50_1c, 3)} | ${fmt(r.p99_1c, 3)} | ${fmt(r.added_p50_1c_ms, 3)} | ${r.errors} |`,
    );
  }
  console.log(`\nSpread over the ${rounds} rounds (min–max, and max/min), and the CPU per request by thread (medians)`);
  console.log('| target | CPU µs/req by round | CPU max/min | req/s @50 by round | req/s max/min | main thread µs/req | other threads µs/req |');
  console.log('|---|---|---:|---|---:|---:|---:|');
  const byRound = (rs, key, d) => rs.map((x) => fmt(x[key], d)).join(', ');
  for (const r of rows) {
    if (r.rps50 === null) continue;
    console.log(
      `| ${r.target} | ${byRound(r.rounds, 'cpu_us', 0)} | ${fmt(r.spread.cpu_us?.max_over_min)} | ${byRound(r.rounds, 'rps50', 0)} | ${fmt(r.spread.rps50?.max_over_min)} | ${fmt(r.cpu_main_us, 0)} | ${fmt(r.cpu_other_us, 0)} |`,
    );
  }
  console.log(
    `\nTargets (each a median of the per-round ratios or differences, both sides measured in the same round; fsync: ${fmt(fsync.median_us, 0)} µs, median of the rounds' medians, rounds ${fsyncs.map((f) => f.toFixed(0)).join(', ')})`,
  );
  console.log('| target | measured | rounds (min–max) | bound | |');
  console.log('|---|---:|---:|---:|---|');
  for (const g of goals) {
    const d = g.unit === 'ms' ? 3 : 2;
    const range = g.spread ? `${fmt(g.spread.min, d)}–${fmt(g.spread.max, d)}` : '-';
    console.log(`| ${g.name} | ${fmt(g.value, d)} | ${range} | ${g.op} ${fmt(g.bound, d)}${g.unit === 'ms' ? ' ms' : ''} | ${g.status} |`);
  }
  const la = (l) => l.map((x) => x.toFixed(2)).join(' ');
  console.log(`\n(load average at start ${la(loadAtStart)}, at end ${la(loadAtEnd)})`);
  console.log(
    "\n(CPU µs/req: the serving process's user + system CPU over the 50-connection run, every thread, read from /proc, divided by the requests answered; PostgreSQL's own CPU is not in it)",
  );
  console.log(
    '\n(pg-ceiling: two small write transactions per request straight to PostgreSQL, 50 at a time on a pool of 20, in pairs/s; × pg-ceiling: a PostgreSQL row against it)',
  );
  console.log(`\n(written to bench/results/${written}; p50/p99 @50 are autocannon's whole milliseconds, @1 are hrtime-precise)`);
}

/**
 * The project's speed targets (docs/performance.md), each checked on the
 * rounds of this run: a ratio (or a difference) of two targets measured in
 * the same round, the median over the rounds against the bound. A target
 * whose rows are not in the run is "not measured".
 */
function targetChecks(runs, fsyncs, median, spread) {
  const ratio = (key) => (a, b) => (a[key] !== null && b[key] ? a[key] / b[key] : null);
  const checks = [
    { name: 'CPU/req @50: fg-normal ÷ bare', a: 'fg-normal', b: 'bare', per: ratio('cpu_us'), op: '≤', bound: 1.8 },
    { name: 'CPU/req @50: fg-full ÷ bare', a: 'fg-full', b: 'bare', per: ratio('cpu_us'), op: '≤', bound: 2.0 },
    { name: 'req/s @50: fg-normal ÷ bare', a: 'fg-normal', b: 'bare', per: ratio('rps50'), op: '≥', bound: 0.6 },
    { name: 'req/s @50: fg-full ÷ bare', a: 'fg-full', b: 'bare', per: ratio('rps50'), op: '≥', bound: 0.5 },
    { name: 'req/s @50: fg-postgres ÷ fg-normal', a: 'fg-postgres', b: 'fg-normal', per: ratio('rps50'), op: '≥', bound: 0.65 },
    { name: 'req/s @50: fg-normal ÷ peer', a: 'fg-normal', b: 'peer', per: ratio('rps50'), op: '≥', bound: 3 },
    { name: 'req/s @50: fg-postgres ÷ peer', a: 'fg-postgres', b: 'peer', per: ratio('rps50'), op: '≥', bound: 3 },
    { name: 'req/s @50: fg-auth ÷ fg-normal', a: 'fg-auth', b: 'fg-normal', per: ratio('rps50'), op: '≥', bound: 0.9 },
    { name: 'p50 @1 added over bare: fg-normal', a: 'fg-normal', b: 'bare', per: (a, b) => a.p50_1c - b.p50_1c, op: '≤', bound: 0.5, unit: 'ms' },
    {
      // fg-full syncs the disk once per commit: its bound is bare's plus one
      // fsync of the same disk, measured in the same round.
      name: 'p50 @1 added over bare, less one fsync: fg-full',
      a: 'fg-full',
      b: 'bare',
      per: (a, b, round) => a.p50_1c - b.p50_1c - fsyncs[round] / 1000,
      op: '≤',
      bound: 0.5,
      unit: 'ms',
    },
    {
      // What a request waits for at FULL: two fsyncs, the admission's before
      // the upstream sees the request and the finish's before the caller
      // hears the answer (docs/performance.md, the speed targets).
      name: 'p50 @1 added over bare, less two fsyncs: fg-full',
      a: 'fg-full',
      b: 'bare',
      per: (a, b, round) => a.p50_1c - b.p50_1c - (2 * fsyncs[round]) / 1000,
      op: '≤',
      bound: 0.5,
      unit: 'ms',
    },
  ];
  // Every fencegate target of the run (and the four of the targets, measured or not).
  const fencegate = new Set(['fg-full', 'fg-normal', 'fg-auth', 'fg-postgres', ...[...runs.keys()].filter((n) => n.startsWith('fg-'))]);
  for (const name of fencegate)
    checks.push({
      name: `p99/p50 @1: ${name} ÷ bare's`,
      a: name,
      b: 'bare',
      per: (a, b) => (a.p50_1c && b.p50_1c && b.p99_1c ? a.p99_1c / a.p50_1c / (b.p99_1c / b.p50_1c) : null),
      op: '≤',
      bound: 1.5,
    });
  return checks.map(({ name, a, b, per, op, bound, unit = 'ratio' }) => {
    const mine = runs.get(a);
    const theirs = runs.get(b);
    const values = mine && theirs ? mine.map((m, i) => per(m, theirs[i], i)) : [];
    const value = median(values);
    const status = value === null ? 'not measured' : (op === '≤' ? value <= bound : value >= bound) ? 'met' : 'not met';
    return { name, value, op, bound, unit, status, spread: spread(values), rounds: values };
  });
}

/** Drops the PostgreSQL targets' schemas: after the run, and after a failed one too. */
async function dropSchemas() {
  if (schemas.size === 0) return;
  const c = new pg.Client({ connectionString: pgUrl });
  await c.connect();
  for (const schema of schemas) await c.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  schemas.clear();
  await c.end();
}

main().catch(async (err) => {
  console.error(err);
  for (const s of stops) await s.stop().catch(() => {});
  await dropSchemas().catch((e) => console.error(`the benchmark's schemas were not dropped: ${e.message}`));
  process.exit(1);
});
