/**
 * Black box: the real `wrangler.toml` served by `wrangler dev --local`
 * (workerd, local D1 migrated by `wrangler d1 migrations apply DB --local`
 * into a temporary --persist-to directory), in front of a recording fake
 * upstream on 127.0.0.1. Only HTTP in and out, as a user would see it.
 * Runs under the main (Node) vitest config; needs no network.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT } from '../helpers/child.js';
import { rawRequest } from '../helpers/raw-http.js';
import { freePort, startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { contractRoutes, describeHttpContract } from '../replicas/contract.js';
import { tempDir } from '../helpers/temp.js';

const WRANGLER = join(ROOT, 'node_modules', 'wrangler', 'bin', 'wrangler.js');

/** Quiet, offline-friendly wrangler: no metrics, no error reports, logs in the temp dir. */
function wranglerEnv(dir: string): NodeJS.ProcessEnv {
  return {
    ...process.env,
    WRANGLER_SEND_METRICS: 'false',
    WRANGLER_SEND_ERROR_REPORTS: 'false',
    WRANGLER_HIDE_BANNER: 'true',
    WRANGLER_LOG_PATH: join(dir, 'logs'),
    NO_COLOR: '1',
  };
}

interface Proc {
  child: ChildProcess;
  output(): string;
  exited: Promise<number | null>;
}

/** Spawns wrangler (in `cwd`, default the repository) in its own process group, so that stopping it also stops its workerd. */
function runWrangler(args: string[], dir: string, cwd = ROOT): Proc {
  const child = spawn(process.execPath, [WRANGLER, ...args], { cwd, env: wranglerEnv(dir), stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let out = '';
  child.stdout!.setEncoding('utf8').on('data', (c: string) => (out += c));
  child.stderr!.setEncoding('utf8').on('data', (c: string) => (out += c));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  return { child, output: () => out, exited };
}

/** SIGTERM to the group we started; SIGKILL if it has not exited after 5 s. */
async function stop(proc: Proc | null): Promise<void> {
  if (proc === null || proc.child.exitCode !== null || proc.child.signalCode !== null) return;
  const group = -proc.child.pid!;
  const signal = (s: NodeJS.Signals) => {
    try {
      process.kill(group, s);
    } catch {
      // already gone
    }
  };
  signal('SIGTERM');
  const timer = setTimeout(() => signal('SIGKILL'), 5_000);
  await proc.exited;
  clearTimeout(timer);
  signal('SIGKILL'); // workerd children that outlived their parent
}

async function waitUntilServing(url: string, proc: Proc, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (proc.child.exitCode !== null) throw new Error(`wrangler dev exited early:\n${proc.output()}`);
    try {
      const res = await fetch(`${url}/_fencegate/health`, { signal: AbortSignal.timeout(2_000) });
      if (res.status === 200) return;
    } catch {
      // not yet listening
    }
    if (Date.now() > deadline) throw new Error(`wrangler dev did not answer within ${timeoutMs} ms:\n${proc.output()}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

describe('wrangler dev --local serves the HTTP contract', () => {
  let dir: string;
  let upstream: FakeUpstream;
  let dev: Proc | null = null;
  let url: string;
  let n = 0;
  const uniq = (what: string) => `${what}-${++n}-${Date.now().toString(36)}`;

  const pay = (entity: string, key: string, fence: string, extra: Record<string, string> = {}) =>
    fetch(`${url}/payments/charges`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-execution-fence': fence, 'x-fence-entity': entity, 'idempotency-key': key, ...extra },
      body: JSON.stringify({ amount: 1200 }),
    });

  beforeAll(async () => {
    dir = tempDir('fencegate-wrangler-').dir;
    const persist = join(dir, 'state');
    upstream = await startUpstream();

    const migrate = runWrangler(['d1', 'migrations', 'apply', 'DB', '--local', '--persist-to', persist], dir);
    const code = await migrate.exited;
    if (code !== 0) throw new Error(`wrangler d1 migrations apply failed (${code}):\n${migrate.output()}`);

    const [port, inspectorPort] = [await freePort(), await freePort()];
    url = `http://127.0.0.1:${port}`;
    // The routes of the shared HTTP contract (test/replicas/contract.ts; its
    // `payments` is the route of wrangler.toml), pointed at this test's
    // upstream (`refused`: at a port nothing listens on), with an upstream
    // credential from a secret (a --var here, `wrangler secret` in production).
    const config = {
      store: { d1: 'DB' },
      routes: contractRoutes(upstream.url, `http://127.0.0.1:${await freePort()}`, {
        upstreamHeaders: { authorization: { env: 'UPSTREAM_TOKEN', prefix: 'Bearer ' } },
        stripHeaders: ['x-strip-me'],
      }),
    };
    dev = runWrangler(
      [
        'dev', '--local', '--ip', '127.0.0.1', '--port', String(port), '--inspector-port', String(inspectorPort),
        '--persist-to', persist, '--show-interactive-dev-session=false', '--log-level', 'warn',
        '--var', `FENCEGATE_CONFIG:${JSON.stringify(config)}`, '--var', 'UPSTREAM_TOKEN:sekret', '--var', 'FENCEGATE_LOG_LEVEL:warn',
        // The contract reads the admin API without auth: local development only.
        '--var', 'FENCEGATE_ADMIN:on',
      ],
      dir,
    );
    await waitUntilServing(url, dev);
  }, 120_000);

  afterAll(async () => {
    await stop(dev);
    await upstream?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  }, 30_000);

  // The contract every deployment shape answers. workerd cannot tell a
  // refused connection from a reset after sending (src/http/forward-fetch.ts,
  // the probe in upstream-errors.workerd.ts): a refused upstream is
  // outcome_unknown here, never a blind retry (docs/deploy-workers.md).
  describeHttpContract(() => ({ gatewayUrl: url, upstream, refusedUpstream: 'outcome-unknown' }));

  it('forwards a payment once; the retry is replayed with Idempotent-Replayed: true', async () => {
    const entity = uniq('tool-job');
    const key = uniq('pay');
    const first = await pay(entity, key, '1');
    expect(first.status).toBe(201);
    const body = await first.text();
    expect(JSON.parse(body)).toMatchObject({ effect: expect.any(Number), key, fence: '1', entity });
    const [call, ...more] = upstream.callsFor(key);
    expect(more).toEqual([]);
    expect(call!.headers).toMatchObject({ authorization: 'Bearer sekret', 'x-execution-fence': '1', 'x-fence-entity': entity, 'idempotency-key': key });

    const replay = await pay(entity, key, '1');
    expect(replay.status).toBe(201);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await replay.text()).toBe(body);
    expect(upstream.callsFor(key)).toHaveLength(1);
  });

  it('refuses a stale fence with 409 problem+json (type …/stale-fence) and logs it under /_fencegate/v1/rejections', async () => {
    const entity = uniq('tool-job');
    expect((await pay(entity, uniq('pay'), '42')).status).toBe(201);
    const staleKey = uniq('pay');
    const stale = await pay(entity, staleKey, '41');
    expect(stale.status).toBe(409);
    expect(stale.headers.get('content-type')).toBe('application/problem+json');
    const problem = (await stale.json()) as Record<string, unknown>;
    expect(problem.type).toMatch(/\/stale-fence$/);
    expect(problem).toMatchObject({ status: 409, entity, presented_fence: '41', current_fence: '42' });
    expect(upstream.callsFor(staleKey)).toEqual([]);

    const log = await fetch(`${url}/_fencegate/v1/rejections?entity=${encodeURIComponent(entity)}`);
    expect(log.status).toBe(200);
    const { items } = (await log.json()) as { items: Record<string, unknown>[] };
    expect(items).toHaveLength(1);
    expect(items[0]).toMatchObject({ reason: 'stale-fence', entity, presented_fence: '41', current_fence: '42', idempotency_key: staleKey });
  });

  it('refuses a malformed fence with 400 and sends nothing', async () => {
    const key = uniq('pay');
    const res = await pay(uniq('tool-job'), key, '+1');
    expect(res.status).toBe(400);
    expect(res.headers.get('content-type')).toBe('application/problem+json');
    expect(((await res.json()) as { type: string }).type).toMatch(/\/invalid-fence$/);
    expect(upstream.callsFor(key)).toEqual([]);
  });

  it('serial mode across separate requests: the second waits for the first, never overlapping upstream', async () => {
    const entity = uniq('tool-job');
    const gate = upstream.gate();
    const [k1, k2] = [uniq('pay'), uniq('pay')];
    upstream.behave((call) => (call.key === k1 ? { kind: 'hold', gate: gate.promise } : undefined));
    try {
      const first = pay(entity, k1, '1');
      await upstream.waitFor(() => upstream.callsFor(k1).length === 1, 'the first request upstream');
      const second = pay(entity, k2, '1');
      gate.open();
      const [a, b] = await Promise.all([first, second]);
      expect([a.status, b.status]).toEqual([201, 201]);
      expect(upstream.maxInflight(entity)).toBe(1);
      expect(upstream.calls.filter((c) => c.entity === entity).map((c) => c.key)).toEqual([k1, k2]);
    } finally {
      upstream.behave(null);
    }
  });

  it('10 parallel identical requests reach the upstream once; Prefer: wait gives every caller the answer', async () => {
    const entity = uniq('tool-job');
    const key = uniq('pay');
    upstream.behave((call) => (call.key === key ? { kind: 'delay', ms: 200 } : undefined));
    try {
      const answers = await Promise.all(Array.from({ length: 10 }, () => pay(entity, key, '1', { prefer: 'wait=10' })));
      expect(answers.map((r) => r.status)).toEqual(Array(10).fill(201));
      expect(new Set(await Promise.all(answers.map((r) => r.text()))).size).toBe(1);
      expect(upstream.callsFor(key)).toHaveLength(1);
    } finally {
      upstream.behave(null);
    }
  });
  it('documented limit: workerd drops Connection before the Worker sees it, so a field it names reaches the upstream; stripHeaders removes one', async () => {
    const entity = uniq('tool-job');
    const key = uniq('pay');
    const res = await rawRequest(url, {
      path: '/payments/charges',
      headers: [
        ['Connection', 'keep-alive, x-secret-hop'],
        ['X-Secret-Hop', '1'],
        ['Keep-Alive', 'timeout=5'],
        ['X-Strip-Me', 'secret'],
        ['Content-Type', 'application/json'],
        ['X-Execution-Fence', '1'],
        ['X-Fence-Entity', entity],
        ['Idempotency-Key', key],
      ],
      body: '{"amount":1200}',
    });
    expect(res.status, res.text).toBe(201);
    const [call] = upstream.callsFor(key);
    // The limit (docs/deploy-workers.md): Node strips it (RFC 9110 §7.6.1); here it arrives.
    expect(call!.headers['x-secret-hop']).toBe('1');
    expect(call!.headers['keep-alive']).toBeUndefined();
    expect(call!.headers['x-strip-me']).toBeUndefined();
  });
});

describe('what a Worker sees of hop-by-hop fields under wrangler dev --local (probe)', () => {
  let dir: string;
  let dev: Proc | null = null;
  let url: string;

  beforeAll(async () => {
    dir = tempDir('fencegate-echo-').dir;
    // A Worker that answers with the request headers it was given.
    writeFileSync(join(dir, 'echo.js'), 'export default { fetch(r) { const h = {}; r.headers.forEach((v, k) => (h[k] = v)); return Response.json(h); } };\n');
    writeFileSync(join(dir, 'wrangler.toml'), 'name = "echo"\nmain = "echo.js"\ncompatibility_date = "2026-04-01"\n');
    const [port, inspectorPort] = [await freePort(), await freePort()];
    url = `http://127.0.0.1:${port}`;
    dev = runWrangler(['dev', '--local', '--ip', '127.0.0.1', '--port', String(port), '--inspector-port', String(inspectorPort), '--show-interactive-dev-session=false', '--log-level', 'warn'], dir, dir);
    await waitUntilServing(url, dev);
  }, 120_000);

  afterAll(async () => {
    await stop(dev);
    if (dir) rmSync(dir, { recursive: true, force: true });
  }, 30_000);

  it('Connection, Keep-Alive and TE never reach the Worker; the field Connection named does', async () => {
    const res = await rawRequest(url, {
      path: '/x',
      headers: [
        ['Connection', 'keep-alive, x-secret-hop'],
        ['X-Secret-Hop', '1'],
        ['Keep-Alive', 'timeout=5'],
        ['TE', 'trailers'],
        ['Proxy-Connection', 'keep-alive'],
      ],
    });
    expect(res.status).toBe(200);
    const seen = JSON.parse(res.text) as Record<string, string>;
    console.log(`PROBE connection wrangler-dev ${JSON.stringify(seen)}`);
    expect(seen.connection).toBeUndefined();
    expect(seen['keep-alive']).toBeUndefined();
    expect(seen.te).toBeUndefined();
    expect(seen['x-secret-hop']).toBe('1');
    // Not removed by workerd; the gateway's own list drops it (src/http/forward.ts HOP_BY_HOP).
    expect(seen['proxy-connection']).toBe('keep-alive');
  });
});

describe('the Workers bundle', () => {
  it('contains no better-sqlite3, pg, undici or node:fs (wrangler deploy --dry-run)', async () => {
    const dir = tempDir('fencegate-bundle-').dir;
    try {
      const out = join(dir, 'out');
      const build = runWrangler(['deploy', '--dry-run', '--outdir', out], dir);
      const code = await build.exited;
      expect(code, build.output()).toBe(0);
      const bundle = readFileSync(join(out, 'worker.js'), 'utf8');
      const imports = [...bundle.matchAll(/^import .* from "([^"]+)";?$/gm)].map((m) => m[1]);
      expect(imports.filter((m) => /^(node:)?(fs|fs\/promises|child_process|net|worker_threads)$|better-sqlite3|^pg$|undici/.test(m!))).toEqual([]);
      const { sources } = JSON.parse(readFileSync(join(out, 'worker.js.map'), 'utf8')) as { sources: string[] };
      expect(sources.filter((s) => /node_modules\/(better-sqlite3|pg|pg-[a-z-]+|undici)\//.test(s))).toEqual([]);
      expect(sources.some((s) => s.endsWith('src/store/d1/gateway-store.ts'))).toBe(true);
      // The Node stores' folders (sqlite/, postgres/); the SQL text D1 shares with SQLite (sqlite-dialect/) may come along.
      expect(sources.filter((s) => /src\/(store\/(sqlite|postgres)\/|http\/forward-undici|store\/migrations)/.test(s))).toEqual([]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);
});
