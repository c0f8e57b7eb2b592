// Why the same build's CPU per request varies (docs/performance.md, "Why
// the same build's CPU per request varies"): one server process at a time,
// loaded at 50 connections in consecutive windows with no warm-up of its
// own, each window measured apart:
//
//   req/s, CPU µs/req of the whole process, split by thread (the main
//   thread; the SQLite checkpoint worker, the thread with an event loop of
//   its own created after the platform's; every other thread: V8's GC and
//   compiler helpers, libuv's pool), the database's size (file + WAL), and
//   with --trace-gc the young-generation scavenges and full mark-compacts
//   per 1000 requests (counted in the server's --trace-gc lines), and the
//   box's steal and other load over the window (from /proc/stat), the
//   main thread's involuntary context switches per 1000 requests, and at
//   the end the database's rows per table, pages and deepest B-tree.
//
// Variants run interleaved, round after round, each in a fresh process:
//   --variants 'name=target[:node flags],...'  target: bare, fg-normal,
//   fg-full, or fg-normal-prefilled / fg-full-prefilled (a copy of a
//   database that --prefill S seconds of load filled once at the start).
//   Default: 'bare=bare,fg-normal=fg-normal'.
// Options: --windows N (default 6), --seconds S per window (default 3),
// --rounds N (default 2), --idle S (default 0: S seconds with no load
// before the windows, the process's own CPU per second), --prefill S (default 60, only when a prefilled
// variant is asked for), --trace-gc (adds --trace-gc to every variant).
// Pinned as bench/http.mjs: the server on core 0, the upstream on core 1,
// the load generator on the last core. Prints one markdown table per
// variant (window by window, rounds side by side), then a summary.
import { copyFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import { flag, option as opt } from './args.mjs';
import { paymentsRoute, startGateway, startNode, throughput, waitReady } from './lib.mjs';

const here = dirname(fileURLToPath(import.meta.url));
if (flag('help')) {
  const text = readFileSync(fileURLToPath(import.meta.url), 'utf8').split('\nimport ')[0];
  process.stdout.write(`${text.replace(/^\/\/ ?/gm, '')}\n`);
  process.exit(0);
}
const windows = Number(opt('windows', 6));
const seconds = Number(opt('seconds', 3));
const rounds = Number(opt('rounds', 2));
const prefillSeconds = Number(opt('prefill', 60));
const traceGc = flag('trace-gc');
const idleSeconds = Number(opt('idle', 0));
const variants = opt('variants', 'bare=bare,fg-normal=fg-normal')
  .split(',')
  .map((v) => {
    const name = v.slice(0, v.indexOf('='));
    const rest = v.slice(v.indexOf('=') + 1);
    const [target, ...flags] = rest.split(':');
    return { name, target, flags: [...flags.join(':').split(' ').filter(Boolean), ...(traceGc ? ['--trace-gc'] : [])] };
  });
const tmp = mkdtempSync(join(tmpdir(), 'fencegate-cpu-variance-'));
process.on('exit', () => rmSync(tmp, { recursive: true, force: true }));
const dist = join(here, '..', 'dist', 'entry', 'cli.js');

/** Per-thread CPU ms of a process: tid → ms, in the order of creation. */
function threads(pid) {
  const out = new Map();
  for (const tid of readdirSync(`/proc/${pid}/task`).sort((a, b) => Number(a) - Number(b))) {
    try {
      const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
      const f = stat.slice(stat.lastIndexOf(') ') + 2).split(' ');
      out.set(tid, (Number(f[11]) + Number(f[12])) * 10);
    } catch {}
  }
  return out;
}

/** The threads other than main waiting in epoll, past the platform's first one: a worker_threads Worker (the checkpoint worker). */
function workerThreads(pid) {
  const tids = readdirSync(`/proc/${pid}/task`).sort((a, b) => Number(a) - Number(b));
  return tids.filter((tid, i) => i > 1 && readFileSync(`/proc/${pid}/task/${tid}/wchan`, 'utf8').includes('epoll'));
}

/** The box's jiffies: busy (everything but idle and iowait) and steal. */
function box() {
  const f = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
  const [user, nice, system, , , irq, softirq, steal] = f;
  return { busy: user + nice + system + irq + softirq, steal, total: f.slice(0, 8).reduce((a, b) => a + b, 0) };
}

const countGc = (log) => {
  if (!existsSync(log)) return { scavenge: 0, markCompact: 0 };
  const text = readFileSync(log, 'utf8');
  return { scavenge: (text.match(/: Scavenge/g) ?? []).length, markCompact: (text.match(/: Mark-Compact/g) ?? []).length };
};

/** The main thread's involuntary context switches so far (preempted: another task took its core). */
function preempted(pid) {
  try {
    return Number(/nonvoluntary_ctxt_switches:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/task/${pid}/status`, 'utf8'))[1]);
  } catch {
    return 0;
  }
}

/** Rows per table, pages, and the deepest B-tree (levels, from the dbstat table) of a database, read after its server stopped. */
function dbShape(file) {
  const db = new Database(file, { readonly: true });
  try {
    const tables = db.prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'").all();
    const rows = Object.fromEntries(tables.map(({ name }) => [name, db.prepare(`SELECT count(*) AS n FROM "${name}"`).get().n]));
    const depth = db
      .prepare("SELECT name, max(length(path) - length(replace(path, '/', ''))) AS levels FROM dbstat GROUP BY name ORDER BY levels DESC LIMIT 1")
      .get();
    return { rows, pages: db.pragma('page_count', { simple: true }), deepest: depth };
  } finally {
    db.close();
  }
}

const dbSize = (file) => (file ? [file, `${file}-wal`].reduce((s, f) => s + (existsSync(f) ? statSync(f).size : 0), 0) : 0);

let upstreamUrl;
let n = 0;
async function start(variant) {
  const id = `${variant.name}-${++n}`;
  if (variant.target === 'bare') {
    // bare-proxy prints its port on stdout, read by startNode: no log file (and no GC count) for it.
    return {
      ...(await startNode(join(here, 'servers/bare-proxy.mjs'), { cpus: 0, env: { UPSTREAM: upstreamUrl }, nodeFlags: variant.flags })),
      log: null,
      db: null,
    };
  }
  const sync = variant.target.startsWith('fg-full') ? 'FULL' : 'NORMAL';
  const db = join(tmp, `${id}.db`);
  if (variant.target.endsWith('-prefilled')) copyFileSync(prefilled, db);
  const log = join(tmp, `${id}.log`);
  const s = await startGateway(dist, {
    dir: tmp,
    name: id,
    store: { sqlite: db, synchronous: sync },
    routes: [paymentsRoute(upstreamUrl)],
    stdoutFile: log,
    nodeFlags: variant.flags,
  });
  return { ...s, log, db };
}

let prefilled = null;
async function prefill() {
  const db = join(tmp, 'prefilled.db');
  const s = await startGateway(dist, {
    dir: tmp,
    name: 'prefill',
    store: { sqlite: db, synchronous: 'NORMAL' },
    routes: [paymentsRoute(upstreamUrl)],
    stdoutFile: join(tmp, 'prefill.log'),
  });
  await waitReady(s.url);
  const t = await throughput(s.url, { connections: 50, seconds: prefillSeconds, prefix: 'prefill' });
  await s.stop();
  prefilled = db;
  process.stderr.write(`prefilled: ${t.total} requests, ${(dbSize(db) / 1e6).toFixed(1)} MB\n`);
}

const upstream = await startNode(join(here, 'servers/upstream.mjs'), { cpus: 1 });
upstreamUrl = upstream.url;
const loadStart = loadavg();
if (variants.some((v) => v.target.endsWith('-prefilled'))) await prefill();
const results = new Map(variants.map((v) => [v.name, []]));
for (let round = 1; round <= rounds; round++) {
  for (const variant of variants) {
    const s = await start(variant);
    await waitReady(s.url);
    // Read between windows, the server idle (a thread just started or busy shows no wait channel).
    const worker = new Set();
    const rows = [];
    if (idleSeconds > 0) {
      // Before any load: what the process spends per second on its own (timers, the checkpoint worker's polls).
      const i0 = threads(s.pid);
      await new Promise((r) => setTimeout(r, idleSeconds * 1000));
      const i1 = threads(s.pid);
      const spent = [...i1.keys()].reduce((sum, tid) => sum + (i1.get(tid) - (i0.get(tid) ?? 0)), 0);
      rows.idleMsPerS = spent / idleSeconds;
    }
    for (let w = 1; w <= windows; w++) {
      const t0 = threads(s.pid);
      const b0 = box();
      const g0 = s.log ? countGc(s.log) : null;
      const p0 = preempted(s.pid);
      const t = await throughput(s.url, { connections: 50, seconds, prefix: `${variant.name}-${round}-${w}` });
      const t1 = threads(s.pid);
      await new Promise((r) => setTimeout(r, 100));
      for (const tid of workerThreads(s.pid)) worker.add(tid);
      const b1 = box();
      const g1 = s.log ? countGc(s.log) : null;
      const p1 = preempted(s.pid);
      const d = (tid) => (t1.get(tid) ?? 0) - (t0.get(tid) ?? 0);
      let total = 0;
      let other = 0;
      for (const tid of t1.keys()) {
        total += d(tid);
        if (tid !== String(s.pid) && !worker.has(tid)) other += d(tid);
      }
      const per = (ms) => (ms * 1000) / t.total;
      const boxTotal = b1.total - b0.total;
      rows.push({
        window: w,
        rps: t.rps,
        cpu: per(total),
        main: per(d(String(s.pid))),
        worker: per([...worker].reduce((sum, tid) => sum + d(tid), 0)),
        other: per(other),
        scavengesPer1k: g1 && traceGc ? ((g1.scavenge - g0.scavenge) * 1000) / t.total : null,
        markCompactsPer1k: g1 && traceGc ? ((g1.markCompact - g0.markCompact) * 1000) / t.total : null,
        dbMB: dbSize(s.db) / 1e6,
        preemptedPer1k: ((p1 - p0) * 1000) / t.total,
        stealPct: (100 * (b1.steal - b0.steal)) / boxTotal,
        boxBusyPct: (100 * (b1.busy - b0.busy)) / boxTotal,
      });
    }
    await s.stop();
    if (s.db) rows.shape = dbShape(s.db);
    results.get(variant.name).push(rows);
    process.stderr.write(`round ${round}: ${variant.name} CPU µs/req by window ${rows.map((r) => r.cpu.toFixed(0)).join(' ')}\n`);
  }
}
await upstream.stop();

const f = (v, d = 0) => (v === null || v === undefined || Number.isNaN(v) ? '-' : v.toFixed(d));
console.log(
  `\nCPU per request window by window — ${cpus().length} cores, node ${process.version}, ${windows} windows of ${seconds}s at 50 connections, ${rounds} rounds, no warm-up`,
);
for (const v of variants) {
  console.log(`\n${v.name} (${v.target}${v.flags.length ? ` ${v.flags.join(' ')}` : ''})`);
  console.log(
    '| round | window | req/s | CPU µs/req | main | checkpoint worker | other threads | scavenges /1k req | mark-compacts /1k req | db+WAL MB | main thread preempted /1k req | box busy % | steal % |',
  );
  console.log('|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  results.get(v.name).forEach((rows, i) => {
    for (const r of rows)
      console.log(
        `| ${i + 1} | ${r.window} | ${f(r.rps)} | ${f(r.cpu)} | ${f(r.main)} | ${f(r.worker)} | ${f(r.other)} | ${f(r.scavengesPer1k, 2)} | ${f(r.markCompactsPer1k, 2)} | ${f(r.dbMB, 1)} | ${f(r.preemptedPer1k, 1)} | ${f(r.boxBusyPct)} | ${f(r.stealPct, 1)} |`,
      );
  });
}
for (const v of variants)
  results.get(v.name).forEach((rows, i) => {
    if (rows.shape) console.log(`${v.name} round ${i + 1}, database at the end: ${JSON.stringify(rows.shape)}`);
    if (rows.idleMsPerS !== undefined) console.log(`${v.name} round ${i + 1}, idle before the load: ${rows.idleMsPerS.toFixed(1)} ms of CPU per second`);
  });
const median = (xs) => {
  const v = [...xs].sort((a, b) => a - b);
  return v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
};
console.log('\nSummary: CPU µs/req, window 1 and the median of windows 2.., per round; and over all windows after the first, min–max');
console.log('| variant | window 1 by round | median of windows 2.. by round | windows 2.. min–max | max/min | scavenges /1k req (median) |');
console.log('|---|---|---|---|---:|---:|');
for (const v of variants) {
  const rs = results.get(v.name);
  const later = rs.flatMap((rows) => rows.slice(1).map((r) => r.cpu));
  const sc = rs.flatMap((rows) => rows.slice(1).map((r) => r.scavengesPer1k)).filter((x) => x !== null);
  console.log(
    `| ${v.name} | ${rs.map((rows) => f(rows[0].cpu)).join(', ')} | ${rs.map((rows) => f(median(rows.slice(1).map((r) => r.cpu)))).join(', ')} | ${f(Math.min(...later))}–${f(Math.max(...later))} | ${f(Math.max(...later) / Math.min(...later), 2)} | ${sc.length ? f(median(sc), 2) : '-'} |`,
  );
}
const la = (l) => l.map((x) => x.toFixed(2)).join(' ');
console.log(`\n(load average at start ${la(loadStart)}, at end ${la(loadavg())})`);
