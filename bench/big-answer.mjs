#!/usr/bin/env node
// Memory and storage of one big upstream answer through a gateway process.
//
//   node bench/big-answer.mjs [--root DIR] [--mb 300] [--framing chunked|length] [--max-response-bytes N]
//
// Starts, on 127.0.0.1 only: an upstream (in this process) that answers one
// POST with `--mb` MiB (64 KiB writes, backpressure honoured), and
// `node DIR/dist/entry/cli.js serve` (DIR: a build of fencegate, this
// repository by default, so that an older commit's build can be measured
// side by side) on a fresh SQLite file. Sends the command once, then its
// retry with the same key, reading each answer as a stream (this process
// keeps none of it). Prints one JSON line: the gateway's peak RSS (VmHWM
// from /proc, Linux) after each, the status and size of each answer, and the
// database and WAL sizes. Everything is bounded by `--timeout-s` (default 300).
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer, request } from 'node:http';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { option } from './args.mjs';

const root = resolve(option('root', join(dirname(fileURLToPath(import.meta.url)), '..')));
const mib = Number(option('mb', '300'));
const framing = option('framing', 'chunked');
const maxResponseBytes = option('max-response-bytes');
const timeoutS = Number(option('timeout-s', '300'));
const total = mib * 1024 * 1024;

const dir = mkdtempSync(join(tmpdir(), 'fencegate-big-answer-'));
let gateway = null;
let upstream = null;
const cleanup = () => {
  gateway?.kill('SIGKILL');
  upstream?.closeAllConnections();
  upstream?.close();
  rmSync(dir, { recursive: true, force: true });
};
const bound = setTimeout(() => {
  console.error(`big-answer: not done after ${timeoutS} s`);
  cleanup();
  process.exit(1);
}, timeoutS * 1000);

/** kB of a /proc/<pid>/status field (VmRSS, VmHWM). */
const procKb = (pid, field) => Number(readFileSync(`/proc/${pid}/status`, 'utf8').match(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm'))?.[1] ?? NaN);
const mb = (bytes) => Math.round((bytes / 1024 / 1024) * 10) / 10;
const size = (path) => {
  try {
    return statSync(path).size;
  } catch {
    return 0;
  }
};

let upstreamRequests = 0;
upstream = createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    upstreamRequests++;
    res.writeHead(201, { 'content-type': 'application/octet-stream', ...(framing === 'length' ? { 'content-length': String(total) } : {}) });
    const chunk = Buffer.alloc(64 * 1024, 0x61);
    let sent = 0;
    const pump = () => {
      while (sent < total && !res.destroyed) {
        const n = Math.min(chunk.length, total - sent);
        sent += n;
        if (!res.write(n === chunk.length ? chunk : chunk.subarray(0, n))) return void res.once('drain', pump);
      }
      if (!res.destroyed) res.end();
    };
    pump();
  });
});
await new Promise((r) => upstream.listen(0, '127.0.0.1', r));
const upstreamUrl = `http://127.0.0.1:${upstream.address().port}`;

const dbPath = join(dir, 'gateway.db');
const route = {
  name: 'payments',
  match: { path: '/payments/*', methods: ['POST'] },
  upstream: upstreamUrl,
  timeoutMs: 120_000,
  ...(maxResponseBytes === undefined ? {} : { maxResponseBytes: Number(maxResponseBytes) }),
};
const configPath = join(dir, 'config.json');
writeFileSync(configPath, JSON.stringify({ listen: { host: '127.0.0.1', port: 0 }, store: { sqlite: dbPath, synchronous: 'NORMAL' }, routes: [route] }));

gateway = spawn(process.execPath, [join(root, 'dist', 'entry', 'cli.js'), 'serve', '--config', configPath], { stdio: ['ignore', 'pipe', 'inherit'] });
const url = await new Promise((resolveUrl, reject) => {
  gateway.once('exit', (code) => reject(new Error(`gateway exited with ${code} before listening`)));
  createInterface({ input: gateway.stdout }).on('line', (line) => {
    try {
      const m = JSON.parse(line);
      if (m.msg === 'listening') resolveUrl(m.url);
    } catch {}
  });
});

/** One POST through the gateway; the answer is counted, not kept. */
function send() {
  return new Promise((resolveAnswer, reject) => {
    const started = performance.now();
    const req = request(`${url}/payments/charges`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-execution-fence': '1', 'x-fence-entity': 'big:1', 'idempotency-key': 'big-1' },
    });
    req.on('response', (res) => {
      let bytes = 0;
      res.on('data', (c) => (bytes += c.length));
      res.on('end', () =>
        resolveAnswer({
          status: res.status ?? res.statusCode,
          replayed: res.headers['idempotent-replayed'] === 'true',
          bytes,
          ms: Math.round(performance.now() - started),
        }),
      );
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end('{"amount":1}');
  });
}

const rssStartMb = mb(procKb(gateway.pid, 'VmRSS') * 1024);
const first = await send();
const afterFirst = { peakRssMb: mb(procKb(gateway.pid, 'VmHWM') * 1024), dbMb: mb(size(dbPath)), walMb: mb(size(`${dbPath}-wal`)) };
const retry = await send();
const afterRetry = { peakRssMb: mb(procKb(gateway.pid, 'VmHWM') * 1024) };

console.log(
  JSON.stringify({
    root,
    answerMb: mib,
    framing,
    maxResponseBytes: maxResponseBytes === undefined ? 'default' : Number(maxResponseBytes),
    rssStartMb,
    first: { ...first, ...afterFirst },
    retry: { ...retry, ...afterRetry },
    upstreamRequests,
  }),
);
clearTimeout(bound);
cleanup();
