// npm run bench:mcp: MCP `tools/call` through fencegate's mcp route against
// the same MCP server direct, in one run, interleaved.
//
//   direct     autocannon → MCP server (SDK, stateless, JSON answers)
//   direct-spaced  the same server at one connection, a pause (--spacing) before each call
//   fg-normal  → fencegate, SQLite synchronous=NORMAL, protocol "mcp" → the same server
//   fg-full    → the same, synchronous=FULL
//
// Every call is a new command: a new io.fencegate/idempotency-key, a rising
// fence, one of 1000 entities, in `_meta`. The direct server ignores `_meta`.
// Reported: req/s at 50 connections and its ratio to direct (median of the
// per-round ratios), and p50 at one connection with what fencegate adds:
// against the direct run of the round, and (paired) against direct calls
// alternated with the gateway's in the same loop, which the box's load
// drift between runs does not move.
// --base DIR adds base-normal and base-full: the same gateway targets served
// by another checkout's build (DIR/dist), interleaved with this one's, so
// that a refactor is measured in one run.
// Options: --seconds N (default 6), --latency N (default 2000), --rounds N (default 3),
// --targets direct,fg-normal (a subset, in that order; default all four:
// direct, direct-spaced, fg-normal, fg-full), --spacing MS (default 0.7: the
// pause before each call of direct-spaced, about the gateway's own share),
// --cpu-prof-dir DIR (each gateway process writes a V8 CPU profile there on
// exit: `node --cpu-prof`), --help.
// After the table, per gateway target: the median of the decision log's
// total_ms (the gateway's time from routing to the answer) and upstream_ms
// (the forward), for the one-connection runs: what the rest costs; and
// upstream_ms against the direct p50: how much slower the same server answers
// the gateway than the benchmark's back-to-back direct calls.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import { Pool } from 'undici';
import { startGateway, startNode, waitReady } from './lib.mjs';
import { flag, option as opt } from './args.mjs';

if (flag('help')) {
  console.log(
    'node bench/mcp.mjs [--seconds 6] [--latency 2000] [--rounds 3] [--targets direct,direct-spaced,fg-normal,fg-full] [--spacing 0.7] [--base DIR] [--cpu-prof-dir DIR]',
  );
  process.exit(0);
}

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..');
const seconds = Number(opt('seconds', 6));
const latencyRequests = Number(opt('latency', 2000));
const rounds = Number(opt('rounds', 3));
const only = opt('targets', null)?.split(',') ?? null;
const cpuProfDir = opt('cpu-prof-dir', null);
const spacing = Number(opt('spacing', 0.7));
const base = opt('base', null);
const sleeper = new Int32Array(new SharedArrayBuffer(4));
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

async function startFencegate(name, synchronous, upstream, server = join(root, 'dist/entry/cli.js')) {
  const store = { sqlite: join(tmp, `${name}-${Date.now()}.db`), synchronous };
  const log = join(tmp, `${name}-${Date.now()}.log`);
  // Node refuses --cpu-prof in NODE_OPTIONS: the flags go before the script in node's own argv.
  const nodeFlags = cpuProfDir !== null ? ['--cpu-prof', `--cpu-prof-dir=${cpuProfDir}`] : [];
  const routes = [{ name: 'tickets', protocol: 'mcp', match: { path: '/mcp' }, upstream }];
  const gateway = await startGateway(server, { dir: tmp, name, store, routes, stdoutFile: log, nodeFlags });
  started.add(gateway);
  return { ...gateway, log };
}

/** Medians of the last `n` decision lines' total_ms and upstream_ms (the one-connection run's). */
function breakdown(log, n) {
  const lines = readFileSync(log, 'utf8')
    .split('\n')
    .filter((l) => l.includes('"decision"') && l.includes('total_ms'));
  const rows = lines.slice(-n).map((l) => JSON.parse(l));
  return { total: median(rows.map((r) => r.total_ms)), upstream: median(rows.map((r) => r.upstream_ms ?? 0)) };
}

/** Every child still running: stopped on a failure too, so that none outlives the benchmark. */
const started = new Set();

async function throughput(url, connections, duration) {
  // A refusal is a 200 with a JSON-RPC error: counted as an error too.
  let refused = 0;
  const r = await autocannon({
    url: `${url}/mcp`,
    connections,
    duration,
    requests: [
      {
        method: 'POST',
        headers: HEADERS,
        setupRequest: (req) => ({ ...req, body: call() }),
        onResponse: (status, body) => void (status === 200 && body.includes('"error"') && refused++),
      },
    ],
  });
  return { rps: r.requests.average, errors: r.errors + r.timeouts + r.non2xx + refused };
}

/**
 * Sequential calls on one keep-alive connection. With `pairedUrl` (the
 * direct server), each call alternates with one there: on a shared, noisy
 * box both see the same moment's load, so the difference of their p50s is
 * what the gateway adds, without the drift between runs.
 */
async function latency(url, requests, pairedUrl = null, spacingMs = 0) {
  const urls = pairedUrl === null ? [url] : [url, pairedUrl];
  const pools = urls.map((u) => new Pool(u, { connections: 1 }));
  const times = urls.map(() => []);
  let errors = 0;
  for (let i = 0; i < requests + 200; i++) {
    for (let k = 0; k < pools.length; k++) {
      // A blocking sleep, not a timer (a timer's granularity is a millisecond) nor a busy wait (the benchmark
      // is not pinned: spinning, it could keep the server's core awake): both cores idle meanwhile.
      // Only before the measured call: the paired call right after it finds the server just busy, as back to back.
      if (spacingMs > 0 && k === 0) Atomics.wait(sleeper, 0, 0, spacingMs);
      const t = process.hrtime.bigint();
      const res = await pools[k].request({ method: 'POST', path: '/mcp', headers: HEADERS, body: call() });
      const text = await res.body.text();
      if (res.statusCode !== 200 || text.includes('"error"')) errors++;
      if (i >= 200) times[k].push(Number(process.hrtime.bigint() - t) / 1e6);
    }
  }
  await Promise.all(pools.map((p) => p.close()));
  const p50 = (xs) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  return { p50: p50(times[0]), pairedP50: pairedUrl === null ? null : p50(times[1]), errors };
}

const median = (xs) => {
  const v = [...xs].sort((a, b) => a - b);
  return v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
};

async function main() {
  const upstream = await startNode(join(here, 'servers/mcp-upstream.mjs'), { cpus: 1 });
  started.add(upstream);
  const targets = [
    ['direct', async () => ({ url: upstream.url, stop: async () => {} })],
    // The same server, at one connection only, with a pause before each call as a gateway's own work makes one,
    // paired with a call right after it: its paired column says what the pause alone costs the server
    // (a core that idled between calls: caches, a woken core), apart from the gateway.
    ['direct-spaced', async () => ({ url: upstream.url, stop: async () => {}, spacingMs: spacing })],
    ['fg-normal', () => startFencegate('normal', 'NORMAL', `${upstream.url}`)],
    ['fg-full', () => startFencegate('full', 'FULL', `${upstream.url}`)],
    ...(base
      ? [
          ['base-normal', () => startFencegate('base-normal', 'NORMAL', `${upstream.url}`, join(base, 'dist/entry/cli.js'))],
          ['base-full', () => startFencegate('base-full', 'FULL', `${upstream.url}`, join(base, 'dist/entry/cli.js'))],
        ]
      : []),
  ];
  const chosen = only === null ? targets : targets.filter(([n]) => only.includes(n));
  const runs = new Map(chosen.map(([n]) => [n, []]));
  for (let round = 1; round <= rounds; round++) {
    for (const [name, start] of chosen) {
      const t = await start();
      await waitReady(t.url);
      // --seconds 0: the one-connection run alone (a profile of the latency path).
      const loaded = seconds > 0 && t.spacingMs === undefined;
      if (loaded) await throughput(t.url, 50, 2);
      const t50 = loaded ? await throughput(t.url, 50, seconds) : { rps: NaN, errors: 0 };
      const l1 = await latency(t.url, latencyRequests, t.log === undefined && t.spacingMs === undefined ? null : upstream.url, t.spacingMs ?? 0);
      await t.stop();
      const parts = t.log === undefined ? null : breakdown(t.log, latencyRequests);
      const paired = l1.pairedP50 === null ? 0 : l1.p50 - l1.pairedP50;
      runs.get(name).push({ rps: t50.rps, p50_1c: l1.p50, paired, errors: t50.errors + l1.errors, parts });
      process.stderr.write(
        `round ${round}: ${name} ${t50.rps.toFixed(0)} req/s, p50@1 ${l1.p50.toFixed(3)} ms${l1.pairedP50 === null ? '' : ` (direct alongside ${l1.pairedP50.toFixed(3)})`}, errors ${t50.errors + l1.errors}\n`,
      );
    }
  }
  await upstream.stop();
  const direct = runs.get('direct') ?? null;
  console.log(`\nfencegate MCP benchmark — tools/call, ${seconds}s per run, median of ${rounds} interleaved rounds (ratios: median of per-round ratios)`);
  console.log('| target | req/s @50 | × direct | p50 @1 (ms) | added p50 @1 (ms) | added p50 @1, paired (ms) | errors |');
  console.log('|---|---:|---:|---:|---:|---:|---:|');
  for (const [name, rs] of runs) {
    const ratio = direct === null ? NaN : median(rs.map((r, i) => r.rps / direct[i].rps));
    const added = direct === null ? NaN : median(rs.map((r, i) => r.p50_1c - direct[i].p50_1c));
    const rps = median(rs.map((r) => r.rps));
    // direct-spaced runs at one connection only.
    const [rpsText, ratioText] = Number.isNaN(rps) ? ['–', '–'] : [rps.toFixed(0), ratio.toFixed(2)];
    console.log(
      `| ${name} | ${rpsText} | ${ratioText} | ${median(rs.map((r) => r.p50_1c)).toFixed(3)} | ${added.toFixed(3)} | ${median(rs.map((r) => r.paired)).toFixed(3)} | ${rs.reduce((n, r) => n + r.errors, 0)} |`,
    );
  }
  // upstream_ms against the direct run's p50: the same server, called back to back by the
  // benchmark, answers faster than it answers the gateway, whose own work comes between its calls
  // on the shared cores; that difference is spent in the upstream, not in the gateway's code.
  console.log('\n| target @1 | total_ms (median) | upstream_ms (median) | total − upstream | upstream_ms − direct p50 |');
  console.log('|---|---:|---:|---:|---:|');
  for (const [name, rs] of runs) {
    if (rs[0].parts === null) continue;
    const total = median(rs.map((r) => r.parts.total));
    const up = median(rs.map((r) => r.parts.upstream));
    const slower = direct === null ? NaN : median(rs.map((r, i) => r.parts.upstream - direct[i].p50_1c));
    console.log(`| ${name} | ${total.toFixed(3)} | ${up.toFixed(3)} | ${(total - up).toFixed(3)} | ${slower.toFixed(3)} |`);
  }
}

main().catch(async (err) => {
  console.error(err);
  await Promise.all([...started].map((c) => c.stop()));
  process.exit(1);
});
