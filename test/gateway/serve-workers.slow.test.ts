import { writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { command, paymentsRoute, tempDir } from '../helpers/gateway.js';
import { CLI, killAll, runNode, spawnNode, writeJson, type Proc } from '../helpers/child.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// `fencegate serve --workers N` (src/entry/cluster.ts) as an operator runs
// it: real processes, one SQLite file. The guarantees across the workers are
// in ./multiprocess.slow.test.ts; here, what the group adds: /metrics that
// add up whichever worker answers, signals forwarded to every worker, a
// dead worker restarted, start-up and usage errors. No timing is asserted:
// every wait is for a log line or an answer.

let up: FakeUpstream;
const tmp = tempDir();

beforeAll(async () => {
  up = await startUpstream();
});

afterAll(async () => {
  await killAll();
  await up?.close();
  tmp.cleanup();
});

let n = 0;
function configFile(extra: Record<string, unknown> = {}): string {
  n++;
  return writeJson(join(tmp.dir, `workers-${n}.json`), {
    listen: { host: '127.0.0.1', port: 0 },
    store: { sqlite: join(tmp.dir, `workers-${n}.db`), synchronous: 'NORMAL' },
    routes: [paymentsRoute(up.url)],
    sweepInterval: '1s',
    ...extra,
  });
}

type Group = Proc & { url: string; pids: Map<number, number> };

/** `serve --workers N`, once every worker listens; `pids`: worker slot → pid. */
async function startGroup(config: string, workers: number, env: Record<string, string> = {}): Promise<Group> {
  const g = spawnNode([CLI, 'serve', '--config', config, '--workers', String(workers)], env);
  const pids = new Map<number, number>();
  let url = '';
  for (let i = 0; i < workers; i++) {
    const l = await g.next((m) => m.msg === 'listening');
    pids.set(l.worker, l.pid);
    url = l.url;
  }
  return Object.assign(g, { url, pids });
}

/** The value of one series in a Prometheus exposition (0 when absent). */
function series(text: string, name: string, labels = ''): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels} `));
  return line === undefined ? 0 : Number(line.split(' ').pop());
}
function sum(text: string, name: string): number {
  return text
    .split('\n')
    .filter((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `))
    .reduce((s, l) => s + Number(l.split(' ').pop()), 0);
}

/** Decisions each worker logged. */
function byWorker(g: Proc, msg = 'decision'): Map<number, number> {
  const by = new Map<number, number>();
  for (const l of g.lines) if (l.msg === msg && typeof l.worker === 'number') by.set(l.worker, (by.get(l.worker) ?? 0) + 1);
  return by;
}

/** A scrape on a connection of its own (so that the group's round robin picks the worker). */
async function scrape(url: string): Promise<string> {
  const res = await fetch(`${url}/_fencegate/metrics`, { headers: { connection: 'close' } });
  expect(res.status).toBe(200);
  return res.text();
}

describe('serve --workers 2', () => {
  let g: Group;
  beforeAll(async () => {
    g = await startGroup(configFile(), 2, { FENCEGATE_LOG_LEVEL: 'debug' });
  });
  afterAll(async () => {
    await g?.kill();
  });

  it('runs a primary and two worker processes, the sweeper in worker 0 only', async () => {
    expect([...g.pids.keys()].sort()).toEqual([0, 1]);
    expect(new Set([...g.pids.values(), g.pid]).size).toBe(3);
    // A sweep every second (logged at debug): worker 0 runs them; by its third, worker 1 would have run one too.
    for (let i = 0; i < 3; i++) await g.next((l) => l.msg === 'sweep');
    const sweeps = g.lines.filter((l) => l.msg === 'sweep');
    expect(new Set(sweeps.map((l) => l.worker))).toEqual(new Set([0]));
    const scraped = await scrape(g.url);
    expect(series(scraped, 'fencegate_workers', '{state="answered"}')).toBe(2);
  });

  it('the counters of requests sent through both workers add up, whichever worker is scraped', async () => {
    const before = await scrape(g.url);
    const count = 60;
    // Many connections at once: the primary hands them to the workers in turn.
    const answers = await Promise.all(
      Array.from({ length: count }, (_, i) =>
        command(g.url, '/payments/charges', { fence: 1, entity: `e-sum-${i}`, key: `k-sum-${i}`, headers: { connection: 'close' } }).then((r) =>
          r.text().then(() => r.status),
        ),
      ),
    );
    expect(answers.every((s) => s === 201)).toBe(true);
    const decided = byWorker(g);
    expect([...decided.keys()].sort(), 'both workers decided some').toEqual([0, 1]);
    // Ten scrapes, each on a new connection: both workers answer some of them, and every one shows the group's total.
    const accepted = (t: string) => series(t, 'fencegate_requests_total', '{route="payments",outcome="accepted"}');
    const scrapes = await Promise.all(Array.from({ length: 10 }, () => scrape(g.url)));
    for (const t of scrapes) {
      expect(accepted(t) - accepted(before)).toBe(count);
      expect(sum(t, 'fencegate_request_duration_seconds_count') - sum(before, 'fencegate_request_duration_seconds_count')).toBe(count);
      expect(series(t, 'fencegate_workers', '{state="answered"}')).toBe(2);
      // Store-wide and build gauges are one worker's reading, not two summed.
      expect(series(t, 'fencegate_store_up')).toBe(1);
      expect(sum(t, 'fencegate_build_info')).toBe(1);
      expect(series(t, 'fencegate_inflight_requests')).toBe(0);
    }
    const metricsLines = g.lines.filter((l) => l.msg === 'decision' && l.path === '/payments/charges').length;
    expect(metricsLines).toBeGreaterThanOrEqual(count);
  });

  it('SIGHUP reaches every worker: each reloads the file', async () => {
    process.kill(g.pid, 'SIGHUP');
    const reloaded = new Set<number>();
    while (reloaded.size < 2) reloaded.add((await g.next((l) => l.msg === 'config-reloaded')).worker);
    expect([...reloaded].sort()).toEqual([0, 1]);
  });

  it('a worker that dies is logged and restarted in its slot, and the group keeps answering; its counts stay in the sum', async () => {
    const before = await scrape(g.url);
    const accepted = (t: string) => series(t, 'fencegate_requests_total', '{route="payments",outcome="accepted"}');
    const old = g.pids.get(1)!;
    process.kill(old, 'SIGKILL');
    const exited = await g.next((l) => l.msg === 'worker-exited');
    expect(exited).toMatchObject({ worker: 1, pid: old, signal: 'SIGKILL' });
    expect(typeof exited.restart_in_ms).toBe('number');
    const again = await g.next((l) => l.msg === 'listening' && l.worker === 1);
    expect(again.pid).not.toBe(old);
    g.pids.set(1, again.pid);
    const res = await command(g.url, '/payments/charges', { fence: 1, entity: 'e-after', key: 'k-after' });
    expect(res.status).toBe(201);
    // The dead worker's counts (as of its last scrape) are kept: the group's counter never goes down.
    const after = await scrape(g.url);
    expect(accepted(after)).toBeGreaterThanOrEqual(accepted(before) + 1);
  });
});

describe('serve --workers 2: SIGTERM', () => {
  it('every worker drains: /ready answers 503 draining while a request in flight finishes, then all exit 0', async () => {
    const g = await startGroup(configFile({ drainTimeout: '30s' }), 2);
    const gate = up.gate();
    up.behave((c) => (c.key === 'k-drain' ? { kind: 'hold', gate: gate.promise } : undefined));
    try {
      const inflight = command(g.url, '/payments/charges', { fence: 1, entity: 'e-drain', key: 'k-drain' });
      await up.waitFor(() => up.callsFor('k-drain').length === 1, 'the held request upstream');
      process.kill(g.pid, 'SIGTERM');
      const draining = new Set<number>();
      while (draining.size < 2) draining.add((await g.next((l) => l.msg === 'shutting-down' && typeof l.worker === 'number')).worker);
      // Both workers drain; the socket stays open: probes on new connections get 503 draining from either.
      // The worker with nothing in flight keeps its listener until the whole group has drained (a probe
      // handed to it gets 503, never a reset): neither has stopped while the held request runs.
      for (let i = 0; i < 12; i++) {
        const ready = await fetch(`${g.url}/_fencegate/ready`, { headers: { connection: 'close' } });
        expect(ready.status).toBe(503);
        expect(await ready.json()).toEqual({ status: 'draining' });
      }
      expect(g.lines.filter((l) => l.msg === 'worker-stopped')).toEqual([]);
      gate.open();
      const res = await inflight;
      expect(res.status).toBe(201);
      expect(await g.exited).toEqual({ code: 0, signal: null });
      const stopped = g.lines.filter((l) => l.msg === 'worker-stopped');
      expect(stopped.map((l) => [l.worker, l.code]).sort()).toEqual([
        [0, 0],
        [1, 0],
      ]);
      expect(g.lines.at(-1)).toMatchObject({ msg: 'stopped', code: 0 });
    } finally {
      gate.open();
      up.behave(null);
    }
  });
});

describe('serve --workers: errors', () => {
  it('a start-up that fails in the workers (the port is taken) stops the group with exit 1 and the reason, no restart loop', async () => {
    const taken = createServer();
    await new Promise<void>((r) => taken.listen(0, '127.0.0.1', () => r()));
    const port = (taken.address() as { port: number }).port;
    try {
      const r = await runNode([CLI, 'serve', '--config', configFile({ listen: { host: '127.0.0.1', port } }), '--workers', '2']);
      expect(r.code).toBe(1);
      expect(r.stderr).toContain('already in use');
      expect(r.stdout).toContain('worker-start-failed');
      expect(r.stdout).not.toContain('worker-exited');
    } finally {
      taken.close();
    }
  });

  it('a bad --workers or FENCEGATE_WORKERS is a usage error (exit 2) before anything is opened', async () => {
    const config = configFile();
    for (const [args, env, name] of [
      [['--workers', '0'], {}, '--workers'],
      [['--workers', 'many'], {}, '--workers'],
      [[], { FENCEGATE_WORKERS: '-1' }, 'FENCEGATE_WORKERS'],
    ] as const) {
      const r = await runNode([CLI, 'serve', '--config', config, ...args], env);
      expect(r.code, r.stderr).toBe(2);
      expect(r.stderr).toContain(`${name} must be a number from 1 to 256`);
    }
  });

  it('a configuration the primary refuses stops it before any worker starts (exit 1, one message)', async () => {
    const bad = join(tmp.dir, 'bad.json');
    writeFileSync(bad, JSON.stringify({ listen: { port: 0 }, store: { sqlite: join(tmp.dir, 'bad.db') }, routes: [{ name: 'x' }] }));
    const r = await runNode([CLI, 'serve', '--config', bad, '--workers', '2']);
    expect(r.code).toBe(1);
    expect(r.stdout).not.toContain('workers-started');
    expect(r.stderr.split('\n').filter((l) => l.startsWith('fencegate:'))).toHaveLength(1);
  });
});
