import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePort } from '../../helpers/upstream.js';
import { spawnProc, ROOT, type Proc } from '../../helpers/child.js';

/**
 * The gateway as a child process, built from `dist/` exactly as `fencegate
 * serve` builds it (test/helpers/gateway-child.mjs, pg-gateway-child.mjs),
 * on a fixed port so that a killed gateway can be restarted where its
 * callers (and their fault proxies) expect it. `checksOff: 'fence'` starts
 * the test-only store wrapper that never shows the store a fence: the
 * negative control.
 */

export type GatewayStoreSpec = { sqlite: string } | { postgres: string };

export interface GatewayProcOptions {
  store: GatewayStoreSpec;
  routes: Record<string, unknown>[];
  /** Where the config file goes. */
  dir: string;
  name?: string;
  checksOff?: 'fence';
  /** Extra top-level config fields (sweepInterval, …). */
  config?: Record<string, unknown>;
}

export interface GatewayProc {
  readonly url: string;
  readonly port: number;
  /** The current process (a new one after each restart). */
  readonly proc: Proc;
  readonly alive: boolean;
  /** SIGKILL: no drain, no finish; what a crash leaves behind stays in the store. */
  kill(): Promise<void>;
  /**
   * Starts a new process on the same port and store (after a kill), as a
   * supervisor would: a start that fails (its database unreachable at that
   * moment) is retried until one is healthy, for up to `withinMs`. Resolves
   * with the number of starts it took.
   */
  restart(withinMs?: number): Promise<number>;
  /** GET an admin path (`/v1/rejections?…`) and parse the JSON. */
  admin(path: string): Promise<any>;
  /** Kills the process. */
  close(): Promise<void>;
}

/** Waits until `GET /_fencegate/health` answers, or the process dies. Bounded. */
async function untilHealthy(url: string, proc: Proc, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (!proc.alive) throw new Error(`${proc.name} exited during start-up: ${proc.stderr().slice(-3000)}`);
    try {
      const res = await fetch(`${url}/_fencegate/health`, { signal: AbortSignal.timeout(2_000) });
      if (res.ok) return;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`${proc.name} not healthy after ${timeoutMs} ms: ${proc.stderr().slice(-3000)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

export async function startGatewayProc(options: GatewayProcOptions): Promise<GatewayProc> {
  const port = await freePort();
  const name = options.name ?? 'gateway';
  const configPath = join(options.dir, `${name}.config.json`);
  const sqlite = 'sqlite' in options.store;
  writeFileSync(
    configPath,
    JSON.stringify({
      listen: { host: '127.0.0.1', port },
      store: sqlite
        ? { sqlite: (options.store as { sqlite: string }).sqlite, synchronous: 'NORMAL' }
        : { postgres: 'postgres://set-by-the-child', poolSize: 6 },
      ...options.config,
      routes: options.routes,
    }),
  );
  const args = sqlite
    ? [join(ROOT, 'test/helpers/gateway-child.mjs'), configPath]
    : [join(ROOT, 'test/helpers/pg-gateway-child.mjs'), configPath, (options.store as { postgres: string }).postgres];
  if (options.checksOff) args.push('--checks-off', options.checksOff);
  const url = `http://127.0.0.1:${port}`;
  let generation = 0;
  const spawnOne = async () => {
    // warn: no line per decision (the soak makes thousands); readiness is polled instead.
    const p = spawnProc(`${name}#${++generation}`, args, { env: { FENCEGATE_LOG_LEVEL: 'warn' }, keepLines: 200 });
    await untilHealthy(url, p);
    return p;
  };
  let proc = await spawnOne();
  return {
    url,
    port,
    get proc() {
      return proc;
    },
    get alive() {
      return proc.alive;
    },
    kill: () => proc.kill(),
    async restart(withinMs = 60_000) {
      await proc.kill();
      const deadline = Date.now() + withinMs;
      for (let starts = 1; ; starts++) {
        try {
          proc = await spawnOne();
          return starts;
        } catch (err) {
          if (Date.now() > deadline) throw err;
          await new Promise((r) => setTimeout(r, 500));
        }
      }
    },
    async admin(path) {
      const res = await fetch(`${url}/_fencegate${path}`, { signal: AbortSignal.timeout(10_000) });
      return res.json();
    },
    close: () => proc.kill(),
  };
}

/** The routes the fault tests use, in front of `upstream`. */
export function faultRoutes(upstream: string, overrides: { timeoutMs?: number; lockMarginMs?: number; serialWaitMs?: number } = {}) {
  const common = {
    upstream,
    entity: { header: 'X-Fence-Entity' },
    fence: 'required',
    mode: 'serial',
    timeoutMs: overrides.timeoutMs ?? 10_000,
    lockMarginMs: overrides.lockMarginMs ?? 2_000,
    serialWaitMs: overrides.serialWaitMs ?? 5_000,
  };
  return [
    // A payment API that takes idempotency keys (Stripe-like): fenced AND deduplicated.
    { name: 'payments', match: { path: '/payments/*', methods: ['POST'] }, idempotency: 'required', ...common },
    // A payout API that takes no idempotency key: the fence is its only guard.
    { name: 'payouts', match: { path: '/payouts/*', methods: ['POST'] }, idempotency: 'off', ...common },
    // A messaging API without keys (the soak's second step): fenced, at-least-once.
    { name: 'notify', match: { path: '/notify/*', methods: ['POST'] }, idempotency: 'off', ...common },
  ];
}
