#!/usr/bin/env node
// The load generator, in a process of its own (pinned to a core by
// bench/lib.mjs when taskset exists), so that its busy event loop shares
// nothing with the benchmark's bookkeeping and its core is known.
//
//   node bench/load.mjs '<job as JSON>'
//
// Jobs (one per process; the answer is the last line of stdout, as JSON):
//   {kind:'throughput', urls, connections, seconds, prefix, start, headers?}
//       autocannon against each URL with connections/urls.length each
//       (several gateway replicas behind a round-robin client): the
//       aggregate req/s, the worst p50/p99 of the clients.
//   {kind:'latency', urls, requests, prefix, start, warmup}
//       sequential requests on one keep-alive connection per URL, taken in
//       turn, timed with hrtime.
//   {kind:'pg-ceiling', url, connections, seconds, pool}
//       PostgreSQL's own ceiling (bench/pg-ceiling.mjs).
// `start` continues the fence sequence of the jobs before (see commandFactory);
// `headers` are sent with every request (an Authorization for an auth target).
import autocannon from 'autocannon';
import { Pool } from 'undici';
import { pgCeiling } from './pg-ceiling.mjs';

const job = JSON.parse(process.argv[2]);
let sequence = job.start ?? 0;

/** A fresh, unique command for each request: new key, rising fence, 1000 entities. */
function commandFactory(prefix, extra = {}) {
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
        ...extra,
      },
      body: '{"amount":1200,"currency":"usd"}',
    };
  };
}

async function throughput({ urls, connections, seconds, prefix, headers }) {
  const next = commandFactory(prefix, headers);
  const each = Math.max(1, Math.round(connections / urls.length));
  const results = await Promise.all(
    urls.map((url) => autocannon({ url, connections: each, duration: seconds, requests: [{ setupRequest: (req) => ({ ...req, ...next() }) }] })),
  );
  const statuses = {};
  for (const r of results) for (const [code, v] of Object.entries(r.statusCodeStats ?? {})) statuses[code] = (statuses[code] ?? 0) + v.count;
  return {
    rps: results.reduce((s, r) => s + r.requests.average, 0),
    p50: Math.max(...results.map((r) => r.latency.p50)),
    p99: Math.max(...results.map((r) => r.latency.p99)),
    errors: results.reduce((s, r) => s + r.errors + r.timeouts + r.non2xx, 0),
    statuses,
    total: results.reduce((s, r) => s + r.requests.total, 0),
  };
}

async function latency({ urls, requests, prefix, warmup = 200, headers }) {
  const pools = urls.map((url) => new Pool(url, { connections: 1 }));
  const next = commandFactory(prefix, headers);
  const samples = [];
  let errors = 0;
  for (let i = 0; i < warmup + requests; i++) {
    const cmd = next();
    const t0 = process.hrtime.bigint();
    const res = await pools[i % pools.length].request(cmd);
    await res.body.arrayBuffer();
    const us = Number(process.hrtime.bigint() - t0) / 1000;
    if (res.statusCode >= 300) errors++;
    if (i >= warmup) samples.push(us);
  }
  await Promise.all(pools.map((p) => p.close()));
  samples.sort((a, b) => a - b);
  const pct = (p) => samples[Math.min(samples.length - 1, Math.floor((p / 100) * samples.length))] / 1000;
  return { p50: pct(50), p99: pct(99), errors };
}

const run = { throughput, latency, 'pg-ceiling': pgCeiling }[job.kind];
const result = await run(job);
process.stdout.write(`${JSON.stringify({ ...result, end: sequence })}\n`);
