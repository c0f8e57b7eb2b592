// Shared pieces of the benchmarks: child processes pinned to cores, a
// precise sequential latency loop, and autocannon for throughput.
import { spawn, spawnSync } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { once } from 'node:events';
import autocannon from 'autocannon';
import { Pool } from 'undici';

const HAS_TASKSET = spawnSync('taskset', ['-V']).status === 0;

/**
 * Starts `node script` (pinned to `cpus` when taskset exists) and waits for
 * its JSON port line. With `stdoutFile`, the child's stdout goes to that file
 * instead (a gateway's decision log: the benchmark process, busy generating
 * load, must not be the reader a logging server waits on) and `port` says
 * where it listens.
 */
export async function startNode(script, { env = {}, args = [], cpus, stdoutFile, port: knownPort } = {}) {
  const argv = [process.execPath, script, ...args];
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
    async stop() {
      if (child.exitCode !== null) return;
      child.kill('SIGTERM');
      await once(child, 'exit');
    },
  };
}

export const pinned = HAS_TASKSET;

// One counter for the whole process: every run against a target continues
// the fences of the runs before it (warm-up, throughput, latency share one
// database), so no request is refused as stale by an earlier phase.
let sequence = 0;

/** A fresh, unique command for each request: new key, rising fence, 1000 entities. */
export function commandFactory(prefix) {
  return () => {
    const n = ++sequence;
    return {
      method: 'POST',
      path: '/payments/charges',
      headers: {
        'content-type': 'application/json',
        'idempotency-key': `${prefix}-${n}`,
        'x-execution-fence': String(n),
        'x-fence-entity': `bench:${n % 1000}`,
      },
      body: '{"amount":1200,"currency":"usd"}',
    };
  };
}

/** Throughput and (whole-millisecond) latency percentiles at `connections`. */
export async function throughput(url, { connections, seconds, prefix }) {
  const next = commandFactory(prefix);
  const result = await autocannon({
    url,
    connections,
    duration: seconds,
    requests: [{ setupRequest: (req) => ({ ...req, ...next() }) }],
  });
  const errors = result.errors + result.timeouts + result.non2xx;
  const statuses = Object.fromEntries(Object.entries(result.statusCodeStats ?? {}).map(([code, v]) => [code, v.count]));
  return { rps: result.requests.average, p50: result.latency.p50, p99: result.latency.p99, errors, statuses, total: result.requests.total };
}

/** Sequential requests on one keep-alive connection, timed with hrtime: sub-millisecond percentiles. */
export async function latency(url, { requests, prefix, warmup = 200 }) {
  const pool = new Pool(url, { connections: 1 });
  const next = commandFactory(prefix);
  const samples = [];
  let errors = 0;
  for (let i = 0; i < warmup + requests; i++) {
    const cmd = next();
    const t0 = process.hrtime.bigint();
    const res = await pool.request(cmd);
    await res.body.arrayBuffer();
    const us = Number(process.hrtime.bigint() - t0) / 1000;
    if (res.statusCode >= 300) errors++;
    if (i >= warmup) samples.push(us);
  }
  await pool.close();
  samples.sort((a, b) => a - b);
  const pct = (p) => samples[Math.min(samples.length - 1, Math.floor((p / 100) * samples.length))] / 1000;
  return { p50: pct(50), p99: pct(99), errors };
}
