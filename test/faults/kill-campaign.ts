import { request } from 'node:http';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { withSearchPath } from '../helpers/postgres.js';
import { ROOT, TS_ARGS, spawnProc, type Proc } from '../helpers/child.js';
import { tempDir } from '../helpers/temp.js';
import { faultRoutes, startGatewayProc, type GatewayProc } from './toolkit/gateway-proc.js';
import { FaultProxy, type RequestHead } from './toolkit/tcp-proxy.js';
import type { Effect } from './toolkit/upstream-child.js';

/**
 * The kill campaign (docs/faults.md): a gateway process is killed with
 * SIGKILL at one of three moments of a charge's life, restarted on the same
 * store, and the caller retries the same key. Then, one reconcile interval
 * later, the campaign counts what matters (DESIGN G2, G4, §3.12):
 *
 * - duplicate executions: keys the upstream (NOT idempotent, every POST one
 *   more effect, test/faults/toolkit/upstream-child.ts) performed twice;
 * - keys needing an operator: records still `outcome_unknown` (or still
 *   `in_progress`) after the retry and one interval.
 *
 * The windows:
 * - `w1` admitted, not yet received by the upstream: the request is held in
 *   a FaultProxy, the gateway killed, the held request dropped (never sent);
 * - `w2` the upstream received and performed it, its answer not sent yet
 *   (the upstream holds it): the gateway killed;
 * - `w3` the upstream answered, the gateway has not written its finish: the
 *   proxy holds the answer's bytes, the gateway is stopped (SIGSTOP), the
 *   bytes are written into its socket, then it is killed. It never read them.
 *
 * The same campaign runs on a route without `reconcile` (before: every
 * killed attempt is an unknown outcome an operator must settle) and with it
 * (the status query `GET /payments/status/{key}` settles each), optionally
 * with a status endpoint that lags behind the upstream's writes or lies.
 */

export type Window = 'w1' | 'w2' | 'w3';
export const WINDOWS: readonly Window[] = ['w1', 'w2', 'w3'];

export interface Variant {
  /** A short name for the report (`before`, `after`, `after-lag`, `control`). */
  name: string;
  /** The route's `reconcile`; null: none (the before). */
  reconcile: { settleTimeMs: number } | null;
  /** The status endpoint shows an effect only this long after it was recorded. */
  statusLagMs?: number;
  /** The status endpoint answers 404 for every key, performed or not. */
  statusLies?: boolean;
}

export const VARIANTS = {
  before: { name: 'before', reconcile: null },
  after: { name: 'after', reconcile: { settleTimeMs: 1_000 } },
  /** A status endpoint that lags 2 s behind the upstream's writes, with a settle time above it. */
  afterLag: { name: 'after-lag', reconcile: { settleTimeMs: 3_000 }, statusLagMs: 2_000 },
  /**
   * The negative control: the status endpoint lags far more than the
   * not-found bound (settle time 0), so a "not found" for a performed charge
   * is trusted and the retry is sent again. Must show duplicates.
   */
  control: { name: 'control', reconcile: { settleTimeMs: 0 }, statusLagMs: 30_000 },
  /**
   * A second control: a status endpoint that says "not found" for a charge
   * it performed. The gateway trusts the endpoint (DESIGN §3.12, Limits):
   * after the bound the record is released and the charge runs again.
   */
  lies: { name: 'lies', reconcile: { settleTimeMs: 1_000 }, statusLies: true },
} satisfies Record<string, Variant>;

export interface CampaignOptions {
  backend: 'sqlite' | 'postgres';
  /** PostgreSQL server (a fresh schema is created and dropped). */
  postgresUrl?: string;
  variant: Variant;
  /** Trials per window. */
  trials: number;
  windows?: readonly Window[];
  /** The route's timeoutMs and lockMarginMs: the record's lock is their sum. */
  timeoutMs?: number;
  lockMarginMs?: number;
  /** `reconcile.interval`, also the wait before counting. */
  intervalMs?: number;
  /**
   * Gateway processes on the one store (default 1). With 2, the caller fails
   * over: the killed gateway is restarted meanwhile (as a supervisor would),
   * the retry goes to the other one, which finds the dead one's record.
   */
  replicas?: number;
  log?: (line: string) => void;
}

export interface Trial {
  window: Window;
  key: string;
  /** Effects the upstream recorded for the key. */
  effects: number;
  /** The record's state after the retry and one interval (`none`: released and never re-admitted). */
  state: string;
  needsOperator: boolean;
  /** From the kill to the caller's 2xx; null when the caller got none (it stopped at 409 `outcome-unknown`). */
  settledMs: number | null;
  /** From the kill to the restarted gateway answering its health check (the part of settledMs that is start-up, with one replica). */
  restartMs: number;
  /** The caller's last answer: status and problem type. */
  last: string;
  /** Answers the caller got, in order (status/type), for a failed run. */
  answers: string[];
}

export interface WindowSummary {
  trials: number;
  duplicates: number;
  needsOperator: number;
  settled: number;
  /** Median and max of settledMs over the settled trials. */
  settleMedianMs: number | null;
  settleMaxMs: number | null;
  /** Median of restartMs over all trials. */
  restartMedianMs: number | null;
}

export interface CampaignReport {
  backend: 'sqlite' | 'postgres';
  variant: string;
  replicas: number;
  windows: Partial<Record<Window, WindowSummary>>;
  total: WindowSummary;
  trials: Trial[];
  statusCalls: number;
  harnessErrors: string[];
  durationMs: number;
}

interface Answer {
  status: number;
  type: string | null;
  retryAfter: number | null;
  reconciling: boolean;
}

/** One POST on a fresh connection (no pooled socket survives a gateway kill). */
function post(url: string, path: string, headers: Record<string, string>, body: string, timeoutMs: number): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(`${url}${path}`, { method: 'POST', agent: false, headers: { ...headers, 'content-length': String(Buffer.byteLength(body)) } });
    req.setTimeout(timeoutMs, () => req.destroy(new Error('caller timeout')));
    req.on('error', reject);
    req.on('response', (res) => {
      let text = '';
      res.setEncoding('utf8').on('data', (c: string) => (text += c));
      res.on('error', reject);
      res.on('end', () => {
        let problem: any = null;
        try {
          problem = JSON.parse(text);
        } catch {
          // not JSON
        }
        const ra = res.headers['retry-after'];
        resolve({
          status: res.statusCode ?? 0,
          type: typeof problem?.type === 'string' ? problem.type.replace(/^.*\//, '') : null,
          retryAfter: ra === undefined ? null : Number(ra),
          reconciling: problem?.reconciling === true,
        });
      });
    });
    req.end(body);
  });
}

async function getJson(url: string): Promise<any> {
  const res = await fetch(url, { signal: AbortSignal.timeout(10_000) });
  if (!res.ok) throw new Error(`GET ${url}: ${res.status}`);
  return res.json();
}

/**
 * Waits until the gateway serves (`/_fencegate/ready` 200): its liveness
 * check answers while it still opens its store, and a request then gets 503
 * `store-unavailable` without being admitted. Bounded.
 */
async function untilReady(g: GatewayProc, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const res = await fetch(`${g.url}/_fencegate/ready`, { signal: AbortSignal.timeout(2_000) });
      await res.arrayBuffer();
      if (res.ok) return;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`${g.proc.name} not ready after ${timeoutMs} ms`);
    await sleep(100);
  }
}

/** Resolves at the first `event` of `emitter` whose argument passes `test`; rejects after `timeoutMs`. */
function nextEvent<T>(emitter: FaultProxy, event: string, test: (v: T) => boolean, what: string, timeoutMs = 20_000): Promise<T> {
  return new Promise((resolve, reject) => {
    const on = (v: T) => {
      if (!test(v)) return;
      clearTimeout(timer);
      emitter.off(event, on);
      resolve(v);
    };
    const timer = setTimeout(() => {
      emitter.off(event, on);
      reject(new Error(`timed out waiting for ${what}`));
    }, timeoutMs);
    emitter.on(event, on);
  });
}

function summarize(trials: Trial[]): WindowSummary {
  const times = trials
    .map((t) => t.settledMs)
    .filter((t): t is number => t !== null)
    .sort((a, b) => a - b);
  const restarts = trials.map((t) => t.restartMs).sort((a, b) => a - b);
  return {
    restartMedianMs: restarts.length ? restarts[Math.floor((restarts.length - 1) / 2)]! : null,
    trials: trials.length,
    duplicates: trials.filter((t) => t.effects > 1).length,
    needsOperator: trials.filter((t) => t.needsOperator).length,
    settled: times.length,
    settleMedianMs: times.length ? times[Math.floor((times.length - 1) / 2)]! : null,
    settleMaxMs: times.length ? times[times.length - 1]! : null,
  };
}

export async function runKillCampaign(options: CampaignOptions): Promise<CampaignReport> {
  const started = Date.now();
  const log = options.log ?? (() => {});
  const windows = options.windows ?? WINDOWS;
  const timeoutMs = options.timeoutMs ?? 1_000;
  const lockMarginMs = options.lockMarginMs ?? 300;
  const intervalMs = options.intervalMs ?? 1_000;
  const variant = options.variant;
  const settleTimeMs = variant.reconcile?.settleTimeMs ?? 0;
  const lagMs = variant.statusLagMs ?? 0;
  const tmp = tempDir('fencegate-kill-');
  const trials: Trial[] = [];
  const harnessErrors: string[] = [];
  let upstream: Proc | null = null;
  let proxy: FaultProxy | null = null;
  const gateways: GatewayProc[] = [];
  const replicas = options.replicas ?? 1;
  let schema: { url: string; drop(): Promise<void> } | null = null;
  let statusCalls = 0;
  const run = Math.random().toString(16).slice(2, 8);

  try {
    upstream = spawnProc(
      'upstream',
      [
        ...TS_ARGS,
        join(ROOT, 'test/faults/toolkit/upstream-child.ts'),
        JSON.stringify({ effectsFile: join(tmp.dir, 'effects.ndjson'), statusLagMs: lagMs, statusLies: variant.statusLies ?? false }),
      ],
      { keepLines: 200 },
    );
    const upstreamUrl = (await upstream.waitFor((m) => m.type === 'listening', 'the upstream listens')).url as string;
    const u = new URL(upstreamUrl);
    proxy = await FaultProxy.start({ target: { host: u.hostname, port: Number(u.port) }, name: 'gateway-upstream' });

    if (options.backend === 'postgres') {
      if (!options.postgresUrl) throw new Error('the PostgreSQL campaign needs postgresUrl');
      schema = await createSchema(options.postgresUrl);
    }
    const [payments] = faultRoutes(proxy.url, { timeoutMs, lockMarginMs, serialWaitMs: 1_000 });
    const route = {
      ...payments,
      ...(variant.reconcile === null
        ? {}
        : { reconcile: { path: '/payments/status/{key}', settleTime: variant.reconcile.settleTimeMs, interval: intervalMs, concurrency: 4 } }),
    };
    for (let g = 0; g < replicas; g++) {
      gateways.push(
        await startGatewayProc({
          store: schema ? { postgres: schema.url } : { sqlite: join(tmp.dir, 'gateway.db') },
          routes: [route],
          dir: tmp.dir,
          name: `gateway-${variant.name}-${g}`,
          config: { sweepInterval: intervalMs },
        }),
      );
    }
    for (const g of gateways) await untilReady(g);
    // The one killed each trial, and the one the caller retries on (the same one restarted, or the other replica).
    const gw = gateways[0]!;
    const retryGw = gateways[replicas > 1 ? 1 : 0]!;
    const up = upstream;
    const px = proxy;

    const isOurs = (key: string) => (h: RequestHead | null) => h !== null && h.method === 'POST' && h.headers['idempotency-key'] === key;

    const trial = async (window: Window, i: number): Promise<Trial> => {
      const key = `kc-${run}-${variant.name}-${window}-${i}`;
      const entity = `acct-${run}-${window}-${i}`;
      const headers = { 'content-type': 'application/json', 'idempotency-key': key, 'x-fence-entity': entity, 'x-execution-fence': '1' };
      const body = JSON.stringify({ amount: 500, key });
      const send = (to: GatewayProc = gw) => post(to.url, `/payments/${entity}`, headers, body, timeoutMs + lockMarginMs + 30_000);

      // --- arm the fault, send, wait for the window, kill ----------------------
      // The proxy decides holding per connection, at its first request: reset
      // the gateway's idle keep-alive connections (status queries of earlier
      // trials) so that this charge opens a fresh one. Nothing is in flight.
      px.cut();
      px.restore();
      await sleep(100);
      let reached: Promise<unknown>;
      if (window === 'w1') {
        px.hold(isOurs(key));
        reached = nextEvent(px, 'held', (h: { head: RequestHead }) => isOurs(key)(h.head), `${key} held in the proxy`);
      } else if (window === 'w2') {
        await fetch(`${upstreamUrl}/__control`, { method: 'POST', body: JSON.stringify({ holdAnswerFor: key }) });
        reached = up.waitFor((m) => m.type === 'answer-held' && m.key === key, `${key} performed by the upstream`, 20_000);
      } else {
        px.holdAnswers(isOurs(key));
        reached = nextEvent(px, 'answer-held', isOurs(key), `the answer to ${key} held in the proxy`);
      }
      const first = send().then(
        (a) => `${a.status}`,
        (err: Error) => `error: ${err.message}`,
      );
      // The first attempt must not end before its window (a gateway still starting answers 503 at once).
      await Promise.race([
        reached,
        first.then((a) => {
          throw new Error(`${key}: the first attempt ended before its window: ${a}`);
        }),
      ]);
      if (window === 'w3') {
        // The whole answer is in the proxy; the gateway stops, the bytes go into its socket, it never reads them.
        await sleep(100);
        gw.proc.pause();
        px.releaseAnswers();
        await sleep(100);
      }
      const killedAt = Date.now();
      await gw.kill();
      if (window === 'w1') px.dropHeld();
      const firstAnswer = await first;
      if (!firstAnswer.startsWith('error')) throw new Error(`${key}: the first attempt was answered (${firstAnswer}) before the kill`);

      // --- restart, the caller retries the same key ------------------------------
      // One replica: the caller waits for the restart. Two: it fails over at once, the restart runs meanwhile.
      let restartMs = 0;
      const restarted = gw.restart().then(() => {
        restartMs = Date.now() - killedAt;
      });
      if (replicas === 1) await restarted;
      const answers: string[] = [];
      let settledMs: number | null = null;
      const deadline = killedAt + timeoutMs + lockMarginMs + settleTimeMs + lagMs + 20 * intervalMs + 30_000;
      for (;;) {
        let a: Answer;
        try {
          a = await send(retryGw);
        } catch (err) {
          answers.push(`error: ${(err as Error).message}`);
          if (Date.now() > deadline) break;
          await sleep(200);
          continue;
        }
        answers.push(`${a.status}${a.type ? ` ${a.type}` : ''}${a.reconciling ? ' reconciling' : ''}`);
        if (a.status >= 200 && a.status < 300) {
          settledMs = Date.now() - killedAt;
          break;
        }
        // Without `reconcile` an unknown outcome is final for the caller: an operator decides.
        if (a.status === 409 && a.type === 'outcome-unknown' && !a.reconciling) break;
        if (a.status !== 409 && a.status !== 429 && a.status !== 503) throw new Error(`${key}: unexpected answer ${answers.at(-1)}`);
        if (Date.now() > deadline) break;
        await sleep(a.retryAfter !== null && a.retryAfter > 0 ? a.retryAfter * 1000 : 250);
      }

      // --- one interval later: count ---------------------------------------------
      await restarted;
      await sleep(intervalMs);
      const info = await retryGw.admin(`/v1/idempotency/${encodeURIComponent(key)}`);
      const states: string[] = (info.records ?? []).map((r: { state: string }) => r.state);
      const effects = ((await getJson(`${upstreamUrl}/__effects?entity=${encodeURIComponent(entity)}`)) as Effect[]).filter((e) => e.key === key).length;
      const t: Trial = {
        window,
        key,
        effects,
        state: states.join(',') || 'none',
        needsOperator: states.some((s) => s === 'outcome_unknown' || s === 'in_progress'),
        settledMs,
        restartMs,
        last: answers.at(-1) ?? '',
        answers,
      };
      log(
        `${options.backend}${replicas > 1 ? `x${replicas}` : ''} ${variant.name} ${window}#${i + 1}: effects=${t.effects} state=${t.state}${t.needsOperator ? ' (operator)' : ''} ` +
          `settled=${settledMs === null ? '-' : `${(settledMs / 1000).toFixed(1)}s`} restart=${(restartMs / 1000).toFixed(1)}s answers=[${collapse(answers)}]`,
      );
      return t;
    };

    for (const window of windows) {
      for (let i = 0; i < options.trials; i++) {
        try {
          trials.push(await trial(window, i));
        } catch (err) {
          harnessErrors.push(`${window}#${i + 1}: ${(err as Error).message}`);
          log(`HARNESS ERROR ${window}#${i + 1}: ${(err as Error).message}`);
          // Leave a clean state for the next trial.
          px.dropHeld();
          px.releaseAnswers();
          if (!gw.alive || gw.proc.paused) await gw.restart().catch(() => {});
          await untilReady(gw).catch(() => {});
        }
      }
    }
    statusCalls = (await getJson(`${upstreamUrl}/__status-calls`)).statusCalls;
  } catch (err) {
    harnessErrors.push((err as Error).stack ?? String(err));
  } finally {
    for (const g of gateways) await g.close().catch(() => {});
    await proxy?.close().catch(() => {});
    await upstream?.kill().catch(() => {});
    await schema?.drop().catch(() => {});
    tmp.cleanup();
  }
  const byWindow: Partial<Record<Window, WindowSummary>> = {};
  for (const w of windows) byWindow[w] = summarize(trials.filter((t) => t.window === w));
  return {
    backend: options.backend,
    variant: variant.name,
    replicas,
    windows: byWindow,
    total: summarize(trials),
    trials,
    statusCalls,
    harnessErrors,
    durationMs: Date.now() - started,
  };
}

/** `409 idempotency-in-progress ×3, 201`: repeated answers once. */
function collapse(answers: string[]): string {
  const out: string[] = [];
  let n = 0;
  for (let i = 0; i < answers.length; i++) {
    n++;
    if (answers[i + 1] === answers[i]) continue;
    out.push(n > 1 ? `${answers[i]} x${n}` : answers[i]!);
    n = 0;
  }
  return out.join(', ');
}

/** One line per window and a total. */
export function formatReport(r: CampaignReport): string {
  const s = (w: WindowSummary) =>
    `trials=${w.trials} duplicates=${w.duplicates} operator=${w.needsOperator} settled=${w.settled}` +
    (w.settleMedianMs === null ? '' : ` settle median ${(w.settleMedianMs / 1000).toFixed(1)}s max ${(w.settleMaxMs! / 1000).toFixed(1)}s`) +
    (w.restartMedianMs === null ? '' : ` restart median ${(w.restartMedianMs / 1000).toFixed(1)}s`);
  const lines = Object.entries(r.windows).map(([w, x]) => `  ${w}: ${s(x!)}`);
  return [
    `kill campaign backend=${r.backend}${r.replicas > 1 ? ` replicas=${r.replicas}` : ''} variant=${r.variant}: ${s(r.total)} statusCalls=${r.statusCalls} harnessErrors=${r.harnessErrors.length} (${(r.durationMs / 1000).toFixed(0)}s)`,
    ...lines,
  ].join('\n');
}

/** A fresh schema on `url` for the gateway's tables, dropped at the end. */
async function createSchema(url: string): Promise<{ url: string; drop(): Promise<void> }> {
  const name = `fg_kill_${Math.random().toString(16).slice(2, 10)}`;
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  await admin.query(`CREATE SCHEMA ${name}`);
  await admin.end();
  return {
    url: withSearchPath(url, name),
    async drop() {
      const c = new pg.Client({ connectionString: url });
      await c.connect();
      await c.query(`DROP SCHEMA IF EXISTS ${name} CASCADE`);
      await c.end();
    },
  };
}
