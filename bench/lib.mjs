// Shared pieces of the benchmarks: child processes pinned to cores, and the
// load generator (bench/load.mjs: autocannon for throughput, a precise
// sequential latency loop) run in a pinned process of its own.
import { spawn, spawnSync } from 'node:child_process';
import { createServer } from 'node:net';
import { closeSync, fdatasyncSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { once } from 'node:events';
import { cpus } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const HAS_TASKSET = spawnSync('taskset', ['-V']).status === 0;

/**
 * Starts `node script` (pinned to `cpus` when taskset exists) and waits for
 * its JSON port line. With `stdoutFile`, the child's stdout goes to that file
 * instead (a gateway's decision log: the benchmark process, busy generating
 * load, must not be the reader a logging server waits on) and `port` says
 * where it listens.
 */
export async function startNode(script, { env = {}, args = [], cpus, stdoutFile, port: knownPort, nodeFlags = [] } = {}) {
  const argv = [process.execPath, ...nodeFlags, script, ...args];
  const cmd = HAS_TASKSET && cpus !== undefined ? ['taskset', '-c', String(cpus), ...argv] : argv;
  const out = stdoutFile === undefined ? 'pipe' : openSync(stdoutFile, 'a');
  const child = spawn(cmd[0], cmd.slice(1), { env: { ...process.env, ...env }, stdio: ['ignore', out, 'inherit'] });
  if (typeof out === 'number') closeSync(out);
  const port =
    knownPort ??
    (await new Promise((resolve, reject) => {
      child.once('exit', (code) => reject(new Error(`${script} exited with ${code} before listening`)));
      let buf = '';
      const onData = (d) => {
        buf += d;
        const lines = buf.split('\n');
        buf = lines.pop();
        for (const line of lines) {
          try {
            const msg = JSON.parse(line);
            const found = typeof msg.port === 'number' ? msg.port : typeof msg.url === 'string' ? Number(new URL(msg.url).port) : null;
            if (found !== null) {
              // Parsed once: the rest of the output is drained unread.
              child.stdout.off('data', onData);
              child.stdout.resume();
              return resolve(found);
            }
          } catch {}
        }
      };
      child.stdout.on('data', onData);
    }));
  return {
    url: `http://127.0.0.1:${port}`,
    pid: child.pid,
    /** CPU the process has used so far (user + system, all its threads), in ms, from /proc; null where /proc is not there. */
    cpuMs: () => cpuMsOf(child.pid),
    async stop() {
      if (child.exitCode !== null) return;
      child.kill('SIGTERM');
      await once(child, 'exit');
    },
  };
}

export const pinned = HAS_TASKSET;

const TICK_MS = 10; // USER_HZ is 100 on Linux

/** utime + stime of a process (every thread), in ms; null when it cannot be read. */
export function cpuMsOf(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(') ') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) * TICK_MS;
  } catch {
    return null;
  }
}

/**
 * CPU of a process split by thread, in ms from /proc: its main thread (the
 * event loop, whose tid is the pid) and the sum of every other thread (V8's
 * GC and compiler helpers, libuv's pool, worker_threads such as the SQLite
 * checkpoint worker). Node 20 names none of its threads, so the split goes
 * no finer here. Null where /proc is not there. A thread that ended between
 * two readings drops out of the later one: take both while the process runs.
 */
export function threadCpuMsOf(pid) {
  let tasks;
  try {
    tasks = readdirSync(`/proc/${pid}/task`);
  } catch {
    return null;
  }
  let main = 0;
  let other = 0;
  for (const tid of tasks) {
    try {
      const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(') ') + 2).split(' ');
      const ms = (Number(fields[11]) + Number(fields[12])) * TICK_MS;
      if (tid === String(pid)) main += ms;
      else other += ms;
    } catch {
      // ended meanwhile
    }
  }
  return { main, other };
}

/**
 * The median time (µs) of one fdatasync() after a small overwrite (4 KiB,
 * at one of 16 offsets in turn, as SQLite's WAL is rewritten from its start
 * after a checkpoint) of a file in `dir`: what one durable commit costs the
 * disk under the benchmark's databases. `count` syncs after one untimed one;
 * the file is removed after.
 */
export function fsyncMedianUs(dir, count = 50) {
  const file = join(dir, `fsync-probe-${process.pid}`);
  const fd = openSync(file, 'w');
  const page = Buffer.alloc(4096, 7);
  try {
    writeSync(fd, Buffer.alloc(16 * 4096), 0, 16 * 4096, 0);
    fdatasyncSync(fd);
    const samples = [];
    for (let i = 0; i < count; i++) {
      writeSync(fd, page, 0, page.length, (i % 16) * 4096);
      const t0 = process.hrtime.bigint();
      fdatasyncSync(fd);
      samples.push(Number(process.hrtime.bigint() - t0) / 1000);
    }
    samples.sort((a, b) => a - b);
    return samples[Math.floor(samples.length / 2)];
  } finally {
    closeSync(fd);
    rmSync(file, { force: true });
  }
}

// One counter for the whole benchmark: every run against a target continues
// the fences of the runs before it (warm-up, throughput, latency share one
// database), so no request is refused as stale by an earlier phase. Each
// load process starts where the last one ended.
let sequence = 0;

/**
 * The core the load generator is pinned to: the last one (on two cores, the
 * upstream's; the server under test has core 0 to itself). `FENCEGATE_BENCH_LOAD_CPU`
 * overrides it, and bench/http.mjs --pg-core overrides both (placeLoad).
 */
export let loadCpu = Number(process.env.FENCEGATE_BENCH_LOAD_CPU ?? Math.max(0, cpus().length - 1));

/** Moves the load generator to `cpu` (bench/http.mjs --pg-core: off the database's core). */
export function placeLoad(cpu) {
  loadCpu = cpu;
}

/**
 * This machine's PostgreSQL processes (the postmaster, its backends and
 * helpers), from /proc: pid, parent pid, and CPU time so far in clock ticks
 * of 10 ms (utime + stime).
 */
export function postgresProcesses() {
  const found = [];
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      if (!stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')')).startsWith('postgres')) continue;
      const fields = stat.slice(stat.lastIndexOf(') ') + 2).split(' ');
      found.push({ pid, ppid: fields[1], ticks: Number(fields[11]) + Number(fields[12]) });
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

/**
 * Pins every PostgreSQL process of this machine (the postmaster too, so the
 * backends it forks later inherit it) to `core`, as if the database had a
 * host of its own, and returns the function that undoes it: each process
 * pinned gets its own mask back, one forked meanwhile the postmaster's.
 * Needs taskset and the right to change their affinity (root, or the
 * database's user). Only for a PostgreSQL running on this machine.
 */
export function pinPostgres(core) {
  if (!HAS_TASKSET) throw new Error('--pg-core needs taskset');
  const processes = postgresProcesses();
  const pids = processes.map((p) => p.pid);
  // The postmaster: the one whose parent is not a postgres process.
  const postmaster = processes.find((p) => !pids.includes(p.ppid))?.pid;
  const saved = new Map();
  const restore = () => {
    const fallback = saved.get(postmaster);
    // The postmaster first, then the processes alive after it: a backend
    // forked while the others were being restored would keep the pin.
    if (fallback !== undefined) spawnSync('taskset', ['-p', fallback, postmaster]);
    for (const { pid } of postgresProcesses()) {
      const mask = saved.get(pid) ?? fallback;
      if (mask !== undefined) spawnSync('taskset', ['-p', mask, pid]);
    }
  };
  for (const pid of pids) {
    const mask = /mask: ([0-9a-f]+)/.exec(spawnSync('taskset', ['-p', pid], { encoding: 'utf8' }).stdout ?? '')?.[1];
    if (mask === undefined) continue; // gone meanwhile
    const r = spawnSync('taskset', ['-p', '-c', String(core), pid], { encoding: 'utf8' });
    if (r.status !== 0) {
      restore();
      throw new Error(`--pg-core: taskset could not move postgres process ${pid}: ${r.stderr.trim()}`);
    }
    saved.set(pid, mask);
  }
  if (saved.size === 0) throw new Error('--pg-core: no postgres process on this machine');
  return restore;
}

const LOAD = join(dirname(fileURLToPath(import.meta.url)), 'load.mjs');

/** Runs one job of bench/load.mjs in its own process (pinned when taskset exists) and returns its answer. */
export async function load(job) {
  const argv = [process.execPath, LOAD, JSON.stringify({ ...job, start: sequence })];
  const cmd = HAS_TASKSET ? ['taskset', '-c', String(loadCpu), ...argv] : argv;
  const child = spawn(cmd[0], cmd.slice(1), { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  const [code] = await once(child, 'exit');
  if (code !== 0) throw new Error(`bench/load.mjs ${job.kind} exited with ${code}`);
  const result = JSON.parse(out.trim().split('\n').pop());
  if (typeof result.end === 'number') sequence = result.end;
  return result;
}

const list = (url) => (Array.isArray(url) ? url : [url]);

/** Throughput and (whole-millisecond) latency percentiles at `connections`, split over one URL or several (replicas, round robin by connection). */
export function throughput(url, { connections, seconds, prefix, headers }) {
  return load({ kind: 'throughput', urls: list(url), connections, seconds, prefix, headers });
}

/** Sequential requests on one keep-alive connection per URL, in turn, timed with hrtime: sub-millisecond percentiles. */
export function latency(url, { requests, prefix, warmup = 200, headers }) {
  return load({ kind: 'latency', urls: list(url), requests, prefix, warmup, headers });
}

/** A port free on loopback now (the server started next takes it). */
export async function freePort() {
  const s = createServer();
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  const { port } = s.address();
  await new Promise((r) => s.close(r));
  return port;
}

/**
 * The route every HTTP benchmark of fencegate measures: the commands of
 * ./load.mjs (a fence, an entity and a key on each), serial mode. One
 * definition, so that the throughput table, the profiles and the tail
 * analysis measure the same thing.
 */
export function paymentsRoute(upstream, extra = {}) {
  return {
    name: 'payments',
    match: { path: '/payments/*', methods: ['POST'] },
    upstream,
    entity: { header: 'X-Fence-Entity' },
    fence: 'required',
    idempotency: 'required',
    mode: 'serial',
    ...extra,
  };
}

/**
 * A gateway on a free loopback port: its configuration (`store`, `routes`)
 * (and any other top-level members in `config`) written to `<dir>/<name>.json`, then `script` started with `args(file)`
 * (default: `serve --config <file>`, for dist/entry/cli.js) and the other
 * startNode options (pinned to core 0 unless `cpus` says otherwise; the
 * decision log at info into `stdoutFile`).
 */
export async function startGateway(
  script,
  { dir, name, store, routes, config = {}, args = (file) => ['serve', '--config', file], cpus = 0, env = {}, ...rest },
) {
  const port = await freePort();
  const file = join(dir, `${name}.json`);
  writeFileSync(file, JSON.stringify({ listen: { host: '127.0.0.1', port }, store, routes, ...config }));
  return startNode(script, { args: args(file), cpus, env: { FENCEGATE_LOG_LEVEL: 'info', FENCEGATE_WORKERS: '1', ...env }, port, ...rest });
}

/** Waits until `url`'s admin health answers (a gateway, or a server that mimics the path). */
export async function waitReady(url) {
  for (let i = 0; i < 200; i++) {
    try {
      const res = await fetch(`${url}/_fencegate/health`);
      await res.arrayBuffer();
      if (res.status < 500) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${url} never became ready`);
}
