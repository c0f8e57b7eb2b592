// CPU per request by part at 50 connections: each target of `npm run bench`
// started under `node --cpu-prof`, warmed up, loaded for --seconds, stopped;
// its profile split by bench/profile-summary.mjs over the loaded window only.
//
//   node bench/profile-http.mjs [--only fg-normal,bare] [--seconds 8]
//     [--interval 100] [--dist DIR] [--out DIR]
import { mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { paymentsRoute, startGateway, startNode, throughput, waitReady } from './lib.mjs';
import { option as opt } from './args.mjs';
import { AUTH, bearer } from './auth-token.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const seconds = Number(opt('seconds', 8));
const interval = opt('interval', '100');
const dist = opt('dist', join(here, '..', 'dist'));
const only = opt('only', 'bare,fg-normal,fg-full').split(',');
const tmp = mkdtempSync(join(tmpdir(), 'fencegate-prof-'));
const outDir = opt('out', join(tmp, 'profiles'));
process.on('exit', () => rmSync(tmp, { recursive: true, force: true }));

const upstream = await startNode(join(here, 'servers/upstream.mjs'), { cpus: 1 });

function fencegate(name, synchronous, nodeFlags, config = {}, route = {}) {
  const store = { sqlite: join(tmp, `${name}.db`), synchronous };
  return startGateway(join(dist, 'entry/cli.js'), {
    dir: tmp,
    name,
    store,
    routes: [paymentsRoute(upstream.url, route)],
    config,
    stdoutFile: join(tmp, `${name}.log`),
    nodeFlags,
  });
}

const targets = {
  bare: (nodeFlags) => startNode(join(here, 'servers/bare-proxy.mjs'), { cpus: 0, env: { UPSTREAM: upstream.url }, nodeFlags }),
  control: (nodeFlags) => startNode(join(here, 'servers/stateless-proxy.mjs'), { cpus: 0, env: { UPSTREAM: upstream.url }, nodeFlags }),
  'fg-normal': (nodeFlags) => fencegate('fg-normal', 'NORMAL', nodeFlags),
  'fg-full': (nodeFlags) => fencegate('fg-full', 'FULL', nodeFlags),
  // fg-normal with caller auth: every request carries the bearer token.
  'fg-auth': (nodeFlags) => fencegate('fg-auth', 'NORMAL', nodeFlags, { auth: AUTH }),
  // fencegate with fencing, idempotency and serial mode off: its HTTP path with no decision that touches a row.
  'fg-nostore': (nodeFlags) => fencegate('fg-nostore', 'NORMAL', nodeFlags, {}, { fence: 'off', idempotency: 'off', mode: 'concurrent' }),
};

for (const name of only) {
  const dir = join(outDir, name);
  mkdirSync(dir, { recursive: true });
  const t0 = performance.now();
  const target = await targets[name](['--cpu-prof', '--cpu-prof-dir', dir, '--cpu-prof-interval', interval]);
  await waitReady(target.url);
  const headers = name === 'fg-auth' ? { authorization: bearer } : undefined;
  await throughput(target.url, { connections: 50, seconds: 2, prefix: `${name}-pw`, headers });
  const from = (performance.now() - t0) / 1000;
  const r = await throughput(target.url, { connections: 50, seconds, prefix: `${name}-p`, headers });
  const to = (performance.now() - t0) / 1000;
  await target.stop();
  // One profile per thread: the main thread's is numbered .0.001 (the
  // checkpoint worker's, .1.002, is summarised after it).
  const profiles = readdirSync(dir)
    .filter((f) => f.endsWith('.cpuprofile'))
    .sort();
  const prof = profiles.find((f) => f.includes('.0.001.')) ?? profiles[0];
  console.log(`\n## ${name}: ${r.rps.toFixed(0)} req/s under the profiler, ${r.total} requests in ${seconds} s`);
  console.log(
    execFileSync(
      process.execPath,
      [join(here, 'profile-summary.mjs'), join(dir, prof), '--requests', String(r.total), '--from', from.toFixed(2), '--to', to.toFixed(2)],
      { encoding: 'utf8' },
    ),
  );
  for (const other of profiles.filter((f) => f !== prof)) {
    console.log(`(another thread of it, e.g. the checkpoint worker)`);
    console.log(
      execFileSync(process.execPath, [join(here, 'profile-summary.mjs'), join(dir, other), '--from', from.toFixed(2), '--to', to.toFixed(2)], {
        encoding: 'utf8',
      }).split('\n')[0],
    );
  }
}
await upstream.stop();
