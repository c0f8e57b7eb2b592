#!/usr/bin/env node
// Fault campaign: gateway replicas that pause (SIGSTOP / SIGCONT) under load.
//
// N gateway processes (`fencegate serve` from <root>/dist) share one store
// (a SQLite file, or a PostgreSQL schema). Clients send commands for a few
// entities, each with a fence one higher than the last one handed out for
// its entity, to a random replica. Every `--every` seconds one replica is
// stopped for `--pause` seconds. The upstream (its own process, see
// servers/fence-order-upstream.mjs), on loopback, counts a
// violation whenever it receives a fence lower than one it already received
// for the same entity (G1), and an overlap whenever two requests for one
// entity are in flight at once (G3, serial mode).
//
//   node bench/paused-gateways.mjs [--store sqlite|postgres] [--seconds 60]
//        [--replicas 3] [--pause 3] [--every 5] [--root DIR]
//
// `--root` runs another checkout's build (e.g. a clone of an older commit,
// after `npm ci && npm run build` there) to compare before and after.
// Loopback only; bounded in time; prints one JSON line with the figures.
import { fork, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: {
    store: { type: 'string', default: 'sqlite' },
    seconds: { type: 'string', default: '60' },
    replicas: { type: 'string', default: '3' },
    pause: { type: 'string', default: '3' },
    every: { type: 'string', default: '5' },
    entities: { type: 'string', default: '4' },
    clients: { type: 'string', default: '6' },
    root: { type: 'string', default: resolve(import.meta.dirname, '..') },
    'database-url': { type: 'string', default: process.env.FENCEGATE_TEST_POSTGRES_URL ?? 'postgres://postgres@127.0.0.1:5432/test' },
  },
});
const seconds = Number(values.seconds);
const replicas = Number(values.replicas);
const pauseMs = Number(values.pause) * 1000;
const everyMs = Number(values.every) * 1000;
const entities = Number(values.entities);
const clientsPerEntity = Number(values.clients);
const root = resolve(values.root);

// The upstream, in its own process: this one is busy generating load.
const upstreamProc = fork(join(import.meta.dirname, 'servers/fence-order-upstream.mjs'), { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
const upstreamMessage = () => new Promise((r) => upstreamProc.once('message', r));
const upstreamUrl = `http://127.0.0.1:${(await upstreamMessage()).port}`;
const statuses = {};

const dir = mkdtempSync(join(tmpdir(), 'fg-paused-'));
let pgSchema = null;
let databaseUrl = null;
if (values.store === 'postgres') {
  const pg = (await import('pg')).default;
  pgSchema = `fg_paused_${randomUUID().slice(0, 8)}`;
  const c = new pg.Client({ connectionString: values['database-url'] });
  await c.connect();
  await c.query(`CREATE SCHEMA ${pgSchema}`);
  await c.end();
  const u = new URL(values['database-url']);
  u.searchParams.set('options', `-c search_path=${pgSchema}`);
  databaseUrl = u.toString();
}
const config = {
  listen: { host: '127.0.0.1', port: 0 },
  store: values.store === 'postgres' ? { postgres: databaseUrl, poolSize: 4 } : { sqlite: join(dir, 'gateway.db'), synchronous: 'NORMAL' },
  routes: [
    {
      name: 'payments',
      match: { path: '/payments/*' },
      upstream: upstreamUrl,
      // The reproduction: a lock of 1.5 s, pauses of 3 s.
      timeoutMs: 500,
      lockMarginMs: 1000,
      serialWaitMs: 200,
    },
  ],
};
writeFileSync(join(dir, 'config.json'), JSON.stringify(config));

const gateways = [];
async function startReplica(i) {
  const child = spawn(process.execPath, [join(root, 'dist/entry/cli.js'), 'serve', '--config', join(dir, 'config.json')], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: process.env,
  });
  const url = await new Promise((resolveUrl, reject) => {
    child.once('exit', (code) => reject(new Error(`replica ${i} exited with ${code}`)));
    let buf = '';
    child.stdout.on('data', (d) => {
      buf += d;
      for (const line of buf.split('\n')) {
        try {
          const msg = JSON.parse(line);
          if (msg.msg === 'listening') resolveUrl(msg.url);
        } catch {
          // a partial line
        }
      }
      buf = buf.slice(buf.lastIndexOf('\n') + 1);
    });
  });
  child.stdout.resume();
  return { child, url };
}
// One at a time: the first one migrates the store.
for (let i = 0; i < replicas; i++) gateways.push(await startReplica(i));

const next = new Map();
const deadline = Date.now() + seconds * 1000;
async function client(entity) {
  while (Date.now() < deadline) {
    const fence = (next.get(entity) ?? 0) + 1;
    next.set(entity, fence);
    const gw = gateways[Math.floor(Math.random() * gateways.length)];
    let status = 'error';
    try {
      const res = await fetch(`${gw.url}/payments/charges`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-execution-fence': String(fence), 'x-fence-entity': entity, 'idempotency-key': randomUUID() },
        body: '{"amount":1}',
        signal: AbortSignal.timeout(10_000),
      });
      await res.arrayBuffer();
      status = String(res.status);
    } catch {
      // a paused replica's answer came too late: the client gave up
    }
    statuses[status] = (statuses[status] ?? 0) + 1;
  }
}

let paused = 0;
const pauser = (async () => {
  let i = 0;
  while (Date.now() + everyMs < deadline) {
    await new Promise((r) => setTimeout(r, everyMs - pauseMs));
    const gw = gateways[i++ % gateways.length];
    gw.child.kill('SIGSTOP');
    paused++;
    await new Promise((r) => setTimeout(r, pauseMs));
    gw.child.kill('SIGCONT');
  }
})();

const clients = [];
for (let e = 0; e < entities; e++) for (let c = 0; c < clientsPerEntity; c++) clients.push(client(`tool-job:paused-${e}`));
await Promise.all([...clients, pauser]);

for (const gw of gateways) {
  gw.child.kill('SIGCONT');
  gw.child.kill('SIGTERM');
}
await Promise.all(gateways.map((gw) => new Promise((r) => (gw.child.exitCode !== null ? r() : gw.child.once('exit', r)))));
upstreamProc.send('report');
const { figures } = await upstreamMessage();
upstreamProc.disconnect();
rmSync(dir, { recursive: true, force: true });
if (pgSchema !== null) {
  const pg = (await import('pg')).default;
  const c = new pg.Client({ connectionString: values['database-url'] });
  await c.connect();
  await c.query(`DROP SCHEMA ${pgSchema} CASCADE`);
  await c.end();
}
console.log(JSON.stringify({ store: values.store, root, seconds, replicas, pauses: paused, pauseMs, ...figures, statuses }));
