/**
 * Black box: the real `wrangler.toml` served by `wrangler dev --local`
 * (workerd, local D1 migrated by `wrangler d1 migrations apply DB --local`
 * into a temporary --persist-to directory), in front of a recording fake
 * upstream on 127.0.0.1. Only HTTP in and out, as a user would see it.
 * Runs under the main (Node) vitest config; needs no network.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT } from '../helpers/child.js';
import { rawRequest } from '../helpers/raw-http.js';
import { freePort, startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { contractRoutes, describeHttpContract } from '../replicas/contract.js';
import { answerOf, decreasingPairs, shuffled } from '../replicas/support.js';
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

/**
 * The Worker's own socket, behind the proxy `wrangler dev` listens with: the
 * proxy's `reloadComplete` message names it in wrangler's debug log
 * (WRANGLER_LOG_PATH, always written at debug level).
 */
function workerSocketUrl(dir: string): string {
  const logs = join(dir, 'logs');
  const text = readdirSync(logs)
    .map((f) => readFileSync(join(logs, f), 'utf8'))
    .join('\n');
  const found = [...text.matchAll(/"type":"reloadComplete","proxyData":\{"userWorkerUrl":\{"protocol":"http:","hostname":"127\.0\.0\.1","port":"(\d+)"\}/g)].at(
    -1,
  );
  if (found === undefined) throw new Error(`no userWorkerUrl in the wrangler log under ${logs}`);
  return `http://127.0.0.1:${found[1]}`;
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
    const routes = contractRoutes(upstream.url, `http://127.0.0.1:${await freePort()}`, {
      upstreamHeaders: { authorization: { env: 'UPSTREAM_TOKEN', prefix: 'Bearer ' } },
      stripHeaders: ['x-strip-me'],
    });
    // The contention test's route: the contract's payments with a 5 s serial wait.
    routes.push({ ...routes[0], name: 'contention', match: { path: '/contention/*', methods: ['POST'] }, serialWaitMs: 5_000 });
    const config = { store: { d1: 'DB' }, routes };
    dev = runWrangler(
      [
        'dev',
        '--local',
        '--ip',
        '127.0.0.1',
        '--port',
        String(port),
        '--inspector-port',
        String(inspectorPort),
        '--persist-to',
        persist,
        '--show-interactive-dev-session=false',
        '--log-level',
        'warn',
        '--var',
        `FENCEGATE_CONFIG:${JSON.stringify(config)}`,
        '--var',
        'UPSTREAM_TOKEN:sekret',
        '--var',
        'FENCEGATE_LOG_LEVEL:warn',
        // The contract reads the admin API without auth: local development only.
        '--var',
        'FENCEGATE_ADMIN:on',
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
  // Contention on one serial entity (docs/deploy-workers.md, "Waiting"):
  // rounds of 120 concurrent requests, fences shuffled over 1..4, so that
  // many are stale and the rest queue for the serial slot until it frees or
  // the route's 5 s serial wait runs out. A waiter that waited on a promise
  // another request resolved was cancelled by workerd as hung (500, "your
  // Worker's code had hung"). Sent to the Worker's own socket: wrangler dev's
  // proxy in front of it loses some of its connections to the Worker under
  // this load and answers those itself (503 text/plain "Your worker restarted
  // mid-request"), which is no answer of the gateway, reaches no upstream and
  // exists only in wrangler dev (docs/deploy-workers.md).
  it('120 concurrent requests with shuffled fences on one serial entity: no 500, only documented answers, each key upstream at most once, fences never go backwards', async () => {
    const worker = workerSocketUrl(dir);
    for (let round = 0; round < 3; round++) {
      const entity = uniq('tool-job');
      const sent = shuffled(Array.from({ length: 120 }, (_, i) => (i % 4) + 1)).map((fence) => ({ fence, key: uniq('pay') }));
      const answers = await Promise.all(
        sent.map(async ({ fence, key }) => {
          // A connection of its own (Connection: close): with fetch's pool,
          // reused across rounds, a request now and then read ECONNRESET
          // before any answer; fresh connections never did (and a transport
          // failure would fail this test loudly, not pass it).
          const raw = await rawRequest(worker, {
            path: '/contention/charges',
            headers: [
              ['Content-Type', 'application/json'],
              ['X-Execution-Fence', String(fence)],
              ['X-Fence-Entity', entity],
              ['Idempotency-Key', key],
            ],
            body: JSON.stringify({ amount: 1200 }),
          });
          const res = new Response(raw.body, { status: raw.status, headers: raw.headers });
          const a = await answerOf(res);
          const outcome = `${a.status} ${a.code ?? ''}`.trim();
          return { fence, key, outcome, retryAfter: res.headers.get('retry-after'), text: a.body };
        }),
      );
      const tally: Record<string, number> = {};
      for (const a of answers) tally[a.outcome] = (tally[a.outcome] ?? 0) + 1;
      console.log(`CONTENTION wrangler-dev round ${round} ${JSON.stringify(tally)}`);
      const undocumented = answers.filter(
        (a) => !['201', '409 stale-fence'].includes(a.outcome) && !(a.outcome === '409 entity-busy' && /^[1-9]\d*$/.test(a.retryAfter ?? '')),
      );
      expect(undocumented.map((a) => `${a.outcome} ${a.text.slice(0, 200)}`)).toEqual([]);
      // Each admitted key reached the upstream once, a refused one never (G2, G5).
      expect(answers.filter((a) => upstream.callsFor(a.key).length !== (a.outcome === '201' ? 1 : 0)).map((a) => a.outcome)).toEqual([]);
      // In arrival order the fences at the upstream never go backwards (G1), one call at a time (G3).
      const arrived = upstream.calls.filter((c) => c.entity === entity).map((c) => Number(c.fence));
      expect(arrived.length).toBeGreaterThan(0);
      expect(decreasingPairs(arrived)).toEqual([]);
      expect(upstream.maxInflight(entity)).toBe(1);
      // The highest fence is stale for nobody.
      expect(answers.filter((a) => a.fence === 4 && a.outcome === '409 stale-fence')).toEqual([]);
    }
  }, 90_000);

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
    dev = runWrangler(
      [
        'dev',
        '--local',
        '--ip',
        '127.0.0.1',
        '--port',
        String(port),
        '--inspector-port',
        String(inspectorPort),
        '--show-interactive-dev-session=false',
        '--log-level',
        'warn',
      ],
      dir,
      dir,
    );
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
