// npm run bench:mcp: MCP `tools/call` through fencegate's mcp route against
// the same MCP server direct, in one run, interleaved.
//
//   direct     autocannon → MCP server (SDK, stateless, JSON answers)
//   fg-normal  → fencegate, SQLite synchronous=NORMAL, protocol "mcp" → the same server
//   fg-full    → the same, synchronous=FULL
//
// Every call is a new command: a new io.fencegate/idempotency-key, a rising
// fence, one of 1000 entities, in `_meta`. The direct server ignores `_meta`.
// Reported: req/s at 50 connections and its ratio to direct (median of the
// per-round ratios), and p50 at one connection with what fencegate adds.
// Options: --seconds N (default 6), --latency N (default 2000), --rounds N (default 3).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import { Pool } from 'undici';
import { freePort, startNode, waitReady } from './lib.mjs';
import { option as opt } from './args.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..');
const seconds = Number(opt('seconds', 6));
const latencyRequests = Number(opt('latency', 2000));
const rounds = Number(opt('rounds', 3));
const tmp = mkdtempSync(join(tmpdir(), 'fencegate-bench-mcp-'));
process.on('exit', () => rmSync(tmp, { recursive: true, force: true }));

let sequence = 0;
function call() {
  const n = ++sequence;
  return JSON.stringify({
    jsonrpc: '2.0',
    id: n,
    method: 'tools/call',
    params: {
      name: 'create_ticket',
      arguments: { title: `ticket ${n}` },
      _meta: { 'io.fencegate/fence': String(n), 'io.fencegate/entity': `bench:${n % 1000}`, 'io.fencegate/idempotency-key': `bench-${process.pid}-${n}` },
    },
  });
}
const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };


async function startFencegate(name, synchronous, upstream) {
  const port = await freePort();
  const file = join(tmp, `${name}.json`);
  writeFileSync(
    file,
    JSON.stringify({
      listen: { host: '127.0.0.1', port },
      store: { sqlite: join(tmp, `${name}-${Date.now()}.db`), synchronous },
      routes: [{ name: 'tickets', protocol: 'mcp', match: { path: '/mcp' }, upstream }],
    }),
  );
  return startNode(join(root, 'dist/entry/cli.js'), { args: ['serve', '--config', file], cpus: 0, env: { FENCEGATE_LOG_LEVEL: 'info' }, stdoutFile: join(tmp, `${name}.log`), port });
}


async function throughput(url, connections, duration) {
  // A refusal is a 200 with a JSON-RPC error: counted as an error too.
  let refused = 0;
  const r = await autocannon({
    url: `${url}/mcp`,
    connections,
    duration,
    requests: [{ method: 'POST', headers: HEADERS, setupRequest: (req) => ({ ...req, body: call() }), onResponse: (status, body) => void (status === 200 && body.includes('"error"') && refused++) }],
  });
  return { rps: r.requests.average, errors: r.errors + r.timeouts + r.non2xx + refused };
}

async function latency(url, requests) {
  const pool = new Pool(url, { connections: 1 });
  const times = [];
  let errors = 0;
  for (let i = 0; i < requests + 200; i++) {
    const t = process.hrtime.bigint();
    const res = await pool.request({ method: 'POST', path: '/mcp', headers: HEADERS, body: call() });
    const text = await res.body.text();
    if (res.statusCode !== 200 || text.includes('"error"')) errors++;
    if (i >= 200) times.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  await pool.close();
  times.sort((a, b) => a - b);
  return { p50: times[Math.floor(times.length / 2)], errors };
}

const median = (xs) => {
  const v = [...xs].sort((a, b) => a - b);
  return v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
};

async function main() {
  const upstream = await startNode(join(here, 'servers/mcp-upstream.mjs'), { cpus: 1 });
  const targets = [
    ['direct', async () => ({ url: upstream.url, stop: async () => {} })],
    ['fg-normal', () => startFencegate('normal', 'NORMAL', `${upstream.url}`)],
    ['fg-full', () => startFencegate('full', 'FULL', `${upstream.url}`)],
  ];
  const runs = new Map(targets.map(([n]) => [n, []]));
  for (let round = 1; round <= rounds; round++) {
    for (const [name, start] of targets) {
      const t = await start();
      await waitReady(t.url);
      await throughput(t.url, 50, 2);
      const t50 = await throughput(t.url, 50, seconds);
      const l1 = await latency(t.url, latencyRequests);
      runs.get(name).push({ rps: t50.rps, p50_1c: l1.p50, errors: t50.errors + l1.errors });
      await t.stop();
      process.stderr.write(`round ${round}: ${name} ${t50.rps.toFixed(0)} req/s, p50@1 ${l1.p50.toFixed(3)} ms, errors ${t50.errors + l1.errors}\n`);
    }
  }
  await upstream.stop();
  const direct = runs.get('direct');
  console.log(`\nfencegate MCP benchmark — tools/call, ${seconds}s per run, median of ${rounds} interleaved rounds (ratios: median of per-round ratios)`);
  console.log('| target | req/s @50 | × direct | p50 @1 (ms) | added p50 @1 (ms) | errors |');
  console.log('|---|---:|---:|---:|---:|---:|');
  for (const [name, rs] of runs) {
    const ratio = median(rs.map((r, i) => r.rps / direct[i].rps));
    const added = median(rs.map((r, i) => r.p50_1c - direct[i].p50_1c));
    console.log(`| ${name} | ${median(rs.map((r) => r.rps)).toFixed(0)} | ${ratio.toFixed(2)} | ${median(rs.map((r) => r.p50_1c)).toFixed(3)} | ${added.toFixed(3)} | ${rs.reduce((n, r) => n + r.errors, 0)} |`);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
