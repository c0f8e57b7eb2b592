// Where the slow requests of a one-connection run go: fencegate served by
// bench/servers/fencegate-traced.mjs (timestamps around every part of each
// request, GC pauses, the checkpoint worker's runs, the event-loop delay),
// the same requests as `npm run bench`'s latency run, then the tail
// classified by what overlapped it.
//
//   node bench/tail.mjs [--synchronous NORMAL|FULL] [--requests 3000]
//     [--rounds 1] [--dist DIR] [--connections 1] [--seconds 10] [--json FILE]
//
// --connections N > 1 runs autocannon for --seconds instead of the
// sequential loop (the per-part means then say where CPU goes under load).
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { latency, paymentsRoute, startGateway, startNode, throughput, waitReady } from './lib.mjs';
import { option as opt } from './args.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const synchronous = opt('synchronous', 'NORMAL');
const requests = Number(opt('requests', 3000));
const rounds = Number(opt('rounds', 1));
const dist = opt('dist', join(here, '..', 'dist'));
const connections = Number(opt('connections', 1));
const seconds = Number(opt('seconds', 10));
const jsonOut = opt('json', null);
// --node-flags '--a --b': flags for the gateway's node (e.g. GC options).
const nodeFlags = opt('node-flags', '').split(' ').filter(Boolean);
const tmp = mkdtempSync(join(tmpdir(), 'fencegate-tail-'));
process.on('exit', () => rmSync(tmp, { recursive: true, force: true }));

const pct = (xs, p) => {
  const v = xs.filter((x) => x !== null).sort((a, b) => a - b);
  return v.length === 0 ? null : v[Math.min(v.length - 1, Math.floor((p / 100) * v.length))];
};
const mean = (xs) => {
  const v = xs.filter((x) => x !== null);
  return v.length === 0 ? null : v.reduce((a, b) => a + b, 0) / v.length;
};
const f = (x, d = 3) => (x === null || x === undefined ? '-' : x.toFixed(d));

const PARTS = [
  'beforeAdmit',
  'admitQueue',
  'admitFn',
  'admitAfter',
  'betweenAdmitForward',
  'forward',
  'betweenForwardFinish',
  'finishQueue',
  'finishFn',
  'finishAfter',
  'respond',
];

async function once(round) {
  const upstream = await startNode(join(here, 'servers/upstream.mjs'), { cpus: 1 });
  const out = join(tmp, `trace-${round}.json`);
  const gw = await startGateway(join(here, 'servers/fencegate-traced.mjs'), {
    dir: tmp,
    name: `tail-${round}`,
    store: { sqlite: join(tmp, `tail-${round}.db`), synchronous },
    routes: [paymentsRoute(upstream.url)],
    args: (file) => [dist, file],
    env: { TRACE_OUT: out },
    stdoutFile: opt('log', join(tmp, 'gw.log')),
    nodeFlags,
  });
  let client;
  try {
    await waitReady(gw.url);
    await throughput(gw.url, { connections: 50, seconds: 2, prefix: `tail-warm-${round}` });
    client =
      connections === 1
        ? await latency(gw.url, { requests, prefix: `tail-l1-${round}` })
        : await throughput(gw.url, { connections, seconds, prefix: `tail-t-${round}` });
  } finally {
    // A failed run leaves no server behind.
    await gw.stop();
    await upstream.stop();
  }
  const trace = JSON.parse(readFileSync(out, 'utf8'));
  // The latency run's requests: the last `requests` (+ its warm-up of 200) of the trace.
  if (connections === 1) trace.requests = trace.requests.slice(-requests);
  else trace.requests = trace.requests.filter((r) => r.t0 > trace.requests[0].t0 + 2500);
  return { client, trace };
}

function overlaps(list, t0, t1, startOf = (e) => e[0], durOf = (e) => e[1]) {
  return list.filter((e) => startOf(e) < t1 && startOf(e) + durOf(e) > t0);
}

function report({ client, trace }, round) {
  const rs = trace.requests;
  const totals = rs.map((r) => r.total);
  const p50 = pct(totals, 50);
  const p99 = pct(totals, 99);
  console.log(
    `\nround ${round}: client p50 ${f(client.p50)} p99 ${f(client.p99)} ms (rps ${client.rps?.toFixed(0) ?? '-'}); server-side total p50 ${f(p50)} p99 ${f(p99)} ms over ${rs.length} requests`,
  );
  console.log(
    `event-loop delay: p50 ${f(trace.loopDelay.p50)} p99 ${f(trace.loopDelay.p99)} max ${f(trace.loopDelay.max)} ms; GC ${trace.gc.length} pauses (${f(
      trace.gc.reduce((a, g) => a + g[1], 0),
      1,
    )} ms); checkpoints: ${trace.ckpt.filter((c) => c[2] === 'PASSIVE').length} PASSIVE, ${trace.ckpt.filter((c) => c[2] === 'RESTART').length} RESTART`,
  );
  console.log('| part | mean (ms) | p50 | p99 | mean over the slowest 1% |');
  console.log('|---|---:|---:|---:|---:|');
  const slow = rs.filter((r) => r.total >= p99);
  for (const part of PARTS) {
    const xs = rs.map((r) => r[part]);
    console.log(`| ${part} | ${f(mean(xs))} | ${f(pct(xs, 50))} | ${f(pct(xs, 99))} | ${f(mean(slow.map((r) => r[part])))} |`);
  }
  // Classify the slowest 1%: what overlapped each one.
  const cls = {};
  const examples = [];
  for (const r of slow) {
    const t1 = r.t0 + r.total;
    const gc = overlaps(trace.gc, r.t0, t1);
    const ck = overlaps(
      trace.ckpt.filter((c) => c[2] === 'PASSIVE' || c[2] === 'RESTART'),
      r.t0,
      t1,
    );
    const part = PARTS.reduce((best, p) => ((r[p] ?? 0) > (r[best] ?? 0) ? p : best), PARTS[0]);
    const tags = [];
    if (gc.length > 0) tags.push(`gc(${gc.map((g) => `${g[2]}:${g[1].toFixed(2)}`).join(',')})`);
    if (ck.length > 0) tags.push(`ckpt(${ck.map((c) => `${c[2]}:${c[1].toFixed(2)}`).join(',')})`);
    const key = `${part}${gc.length ? '+gc' : ''}${ck.length ? '+ckpt' : ''}`;
    cls[key] = (cls[key] ?? 0) + 1;
    if (examples.length < 12) examples.push(`${f(r.total)} ms: ${PARTS.map((p) => `${p}=${f(r[p], 2)}`).join(' ')} ${tags.join(' ')}`);
  }
  console.log(`slowest 1% (${slow.length}, ≥ ${f(p99)} ms) by largest part and overlap: ${JSON.stringify(cls)}`);
  for (const e of examples) console.log(`  ${e}`);
  // How many requests overlapped a checkpoint at all, and their median.
  const withCk = rs.filter((r) => overlaps(trace.ckpt, r.t0, r.t0 + r.total).length > 0);
  const withGc = rs.filter((r) => overlaps(trace.gc, r.t0, r.t0 + r.total).length > 0);
  console.log(
    `requests overlapping a checkpoint: ${withCk.length} (p50 ${f(
      pct(
        withCk.map((r) => r.total),
        50,
      ),
    )} ms); a GC pause: ${withGc.length} (p50 ${f(
      pct(
        withGc.map((r) => r.total),
        50,
      ),
    )} ms)`,
  );
  const passive = trace.ckpt.filter((c) => c[2] === 'PASSIVE').map((c) => c[1]);
  console.log(`PASSIVE checkpoint ms: p50 ${f(pct(passive, 50))} p99 ${f(pct(passive, 99))} max ${f(Math.max(0, ...passive))}`);
  const gcs = trace.gc.map((g) => g[1]);
  console.log(`GC pause ms: p50 ${f(pct(gcs, 50))} p99 ${f(pct(gcs, 99))} max ${f(Math.max(0, ...gcs))}`);
  return { client, p50, p99, loopDelay: trace.loopDelay };
}

const all = [];
for (let round = 1; round <= rounds; round++) {
  const r = await once(round);
  all.push(report(r, round));
  if (jsonOut) writeFileSync(`${jsonOut}.${round}`, JSON.stringify(r));
}
