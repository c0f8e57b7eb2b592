// Shared pieces of the lease benchmark: fresh schemas on the benchmark
// database, the child-process protocol (one JSON config in argv, one JSON
// result line out), and the timed loop every peer's row is measured with.
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import pg from 'pg';

/** The benchmark database; the default is the local server CI and the dev box use. */
export const PG_URL = process.env.FENCEGATE_BENCH_POSTGRES_URL ?? process.env.FENCEGATE_TEST_POSTGRES_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/** Adds `options=-c search_path=<schema>` to a connection string (as test/helpers/postgres.ts does). */
export function withSearchPath(url, schema) {
  const u = new URL(url);
  u.searchParams.set('options', `-c search_path=${schema}`);
  return u.toString();
}

export const newSchemaName = (prefix) => `${prefix}_${randomBytes(5).toString('hex')}`;

/** Runs `fn(client)` on a short-lived admin connection to the benchmark database. */
export async function admin(fn) {
  const c = new pg.Client({ connectionString: PG_URL });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

export const createSchema = (schema) => admin((c) => c.query(`CREATE SCHEMA ${schema}`));
export const dropSchema = (schema) => admin((c) => c.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`));

/**
 * Parent side: runs `node script` with `config` as its JSON argument and
 * returns the last JSON line it printed. Each run gets its own process, so
 * no pool, timer or JIT state leaks from one peer into the next.
 */
export function runChild(script, config, { env = {} } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [script, JSON.stringify(config)], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.once('error', reject);
    child.once('exit', (code) => {
      const last = out.trim().split('\n').filter(Boolean).pop();
      if (code !== 0 || !last) return reject(new Error(`${script} ${JSON.stringify(config)} exited with ${code}`));
      try {
        resolve(JSON.parse(last));
      } catch (err) {
        reject(new Error(`${script}: not JSON: ${last}`, { cause: err }));
      }
    });
  });
}

/** Child side: the config the parent passed. */
export const childConfig = () => JSON.parse(process.argv[2] ?? '{}');

/** Child side: report and exit (pools and timers of a peer may keep the loop alive). */
export function report(result) {
  process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0));
}

/**
 * `workers` async loops, each running `cycle()` (claim → complete; it
 * resolves false when the queue is empty) until `jobs` cycles are done in
 * total or `maxSeconds` have passed. Timed from the first claim sent to the
 * last completion answered.
 */
export async function timedLoops({ workers, jobs, maxSeconds, cycle }) {
  let started = 0;
  let done = 0;
  let empty = 0;
  const deadline = performance.now() + maxSeconds * 1000;
  let last = 0;
  const t0 = performance.now();
  async function loop() {
    while (started < jobs && performance.now() < deadline) {
      started++;
      if (await cycle()) {
        done++;
        last = performance.now();
      } else {
        started--;
        empty++;
        if (empty > 1000) return; // nothing left to claim
        await new Promise((r) => setTimeout(r, 1));
      }
    }
  }
  await Promise.all(Array.from({ length: workers }, loop));
  const seconds = (last - t0) / 1000;
  return { completed: done, seconds, cyclesPerSecond: done / seconds, capped: done < jobs };
}

/** Adds `application_name` to a connection string, so the probe below finds this run's backends. */
export function withAppName(url, name) {
  const u = new URL(url);
  u.searchParams.set('application_name', name);
  return u.toString();
}

const CLK_TCK = Number(spawnSync('getconf', ['CLK_TCK']).stdout?.toString().trim()) || 100;

/** CPU ms used so far by each server backend whose application_name is `appName` (read from /proc: same host). */
async function backendCpu(appName) {
  const { rows } = await admin((c) => c.query('SELECT pid FROM pg_stat_activity WHERE application_name = $1', [appName]));
  const out = new Map();
  for (const { pid } of rows) {
    try {
      // Fields after the ")" of comm: utime and stime are the 12th and 13th.
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      out.set(pid, ((Number(f[11]) + Number(f[12])) * 1000) / CLK_TCK);
    } catch {
      // The backend exited between the query and the read, or /proc is not the server's.
    }
  }
  return out;
}

/**
 * CPU spent per run, on both sides: this process (all its threads) and the
 * database backends of its connections. Busy neighbours slow a run down but
 * do not add CPU to it, so these stay comparable on a loaded machine where
 * cycles/s do not. Call `stop()` before the pools close.
 */
export async function cpuProbe(appName) {
  const server0 = await backendCpu(appName);
  const client0 = process.cpuUsage();
  return {
    async stop() {
      const client = process.cpuUsage(client0);
      const server1 = await backendCpu(appName);
      let serverMs = 0;
      for (const [pid, ms] of server1) serverMs += ms - (server0.get(pid) ?? 0);
      return { clientCpuMs: (client.user + client.system) / 1000, serverCpuMs: serverMs, backends: server1.size };
    },
  };
}

/**
 * Counts the statements on `tool_jobs` this process sends through `pg` from
 * `start()` on, by kind (the store's hot-path texts). The heartbeat thread
 * has its own `pg` and is not counted; with no-op handlers it sends no beat.
 */
export function statementCounter() {
  const counts = { claim: 0, complete: 0, completeAndClaim: 0, other: 0 };
  let on = false;
  const kind = (text) =>
    text.includes('WITH done AS')
      ? 'completeAndClaim'
      : text.trimStart().startsWith('WITH expired AS')
        ? 'claim'
        : text.includes("SET state = 'succeeded'")
          ? 'complete'
          : 'other';
  const query = pg.Client.prototype.query;
  pg.Client.prototype.query = function (config, ...rest) {
    const text = typeof config === 'string' ? config : (config?.text ?? '');
    if (on && text.includes('tool_jobs')) counts[kind(text)]++;
    return query.call(this, config, ...rest);
  };
  return {
    start: () => (on = true),
    stop() {
      on = false;
      return { ...counts };
    },
  };
}
