import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import Database from 'better-sqlite3';
import { createPostgresJobStore } from '../../../src/lease/postgres/store.js';
import { createSqliteJobStore } from '../../../src/lease/sqlite/store.js';
import type { JobStore } from '../../../src/lease/types.js';
import pg from 'pg';
import { withSearchPath } from '../../helpers/postgres.js';
import { faultRoutes, startGatewayProc, type GatewayProc } from '../toolkit/gateway-proc.js';
import { spawnProc, ROOT, TS_ARGS, type Message, type Proc } from '../../helpers/child.js';
import { FaultProxy } from '../toolkit/tcp-proxy.js';
import type { Effect } from '../toolkit/upstream-child.js';
import type { WorkerChildConfig } from '../toolkit/worker-child.js';
import { checkInvariants, type FinalState } from './invariants.js';
import { between, mulberry32 } from './random.js';
import { tempDir } from '../../helpers/temp.js';

/**
 * The randomized soak (docs/faults.md): N worker processes work through jobs (a
 * charge on a key-deduplicating route, then a notify on a route without
 * keys) through a gateway process in front of a non-idempotent upstream
 * process, while a seeded schedule injects faults:
 *
 *   pause        SIGSTOP a worker for 0.3–3.5 s (some pauses outlive its lease)
 *   kill         SIGKILL a worker, start a new one in its place
 *   dbCut        (PostgreSQL) reset a worker's database connections for 0.5–4 s
 *   gatewayDbCut (PostgreSQL) the same for the gateway's pool and LISTEN connection
 *   upstreamReset the upstream's next 1–2 answers become connection resets
 *   latency      1–3 s of 50–400 ms (+ jitter) between gateway and upstream
 *   gatewayKill  SIGKILL the gateway, restart it 0.2–1.5 s later
 *   staleOwner   hold a worker's next request in the network, freeze the
 *                worker (SIGSTOP, or on PostgreSQL a database cut) until a
 *                newer owner of that job reached the upstream, then deliver
 *                the old request late and let the worker go
 *
 * Then the faults stop, everything drains, and the invariants are checked
 * (./invariants.ts). The schedule (kinds, order, durations, target indexes)
 * is a pure function of the seed; how it interleaves with real processes on a
 * loaded machine is not, which is why the soak checks invariants, not counts.
 */

export type FaultKind = 'pause' | 'kill' | 'dbCut' | 'gatewayDbCut' | 'upstreamReset' | 'latency' | 'gatewayKill' | 'staleOwner';
export const FAULT_KINDS: FaultKind[] = ['pause', 'kill', 'dbCut', 'gatewayDbCut', 'upstreamReset', 'latency', 'gatewayKill', 'staleOwner'];

export interface SoakOptions {
  seed: number;
  /** How long faults are injected. */
  durationMs: number;
  workers: number;
  /** Upper bound on jobs enqueued (they are fed as the workers take them). */
  maxJobs: number;
  backend: 'sqlite' | 'postgres';
  /** PostgreSQL server (a fresh schema is created and dropped). */
  postgresUrl?: string;
  /** The negative control: the gateway runs with its fence check switched off (test-only store wrapper). */
  checksOff?: 'fence';
  /** Relative weights of the fault kinds; kinds the backend cannot do are dropped. */
  weights?: Partial<Record<FaultKind, number>>;
  /** Gap between two injections, drawn in [min, max] ms. */
  gapMs?: [number, number];
  /** Bound on the drain after the faults stop. */
  drainMs?: number;
  /** Progress lines (status every `statusEveryMs`, harness notes). */
  log?: (line: string) => void;
  statusEveryMs?: number;
  /** Keep the temporary directory (effects file, databases, configs). */
  keep?: boolean;
}

export interface SoakReport {
  seed: number;
  backend: 'sqlite' | 'postgres';
  checks: 'on' | 'fence-off';
  faultPhaseMs: number;
  drainMs: number;
  workers: number;
  jobs: { total: number; succeeded: number; failed: number; failedBy: Record<string, number>; outcomeUnknown: number; stuck: number };
  effects: { total: number; charges: number; notifies: number };
  faults: Record<FaultKind, number>;
  /** `afterNewer`: delivered once a newer owner of the job had reached the upstream (the others waited out their bound first). */
  late: { delivered: number; refused: number; admitted: number; noAnswer: number; afterNewer: number };
  workerEvents: { claims: number; takeovers: number; leaseLost: number; resultRejected: number };
  restartRetries: { gateway: number; workers: number };
  rejections: Record<string, number>;
  violations: string[];
  /** Anything the harness itself got wrong (a process that would not start): the run proves nothing then. */
  harnessErrors: string[];
  dir: string | null;
  summary: string;
}

const DEFAULT_WEIGHTS: Record<FaultKind, number> = {
  pause: 4,
  kill: 2,
  dbCut: 3,
  gatewayDbCut: 1,
  upstreamReset: 3,
  latency: 2,
  gatewayKill: 1,
  staleOwner: 3,
};

/** Lease timing of every worker: lease 2 s > 3 × 300 ms + 200 ms. */
const LEASE = { leaseMs: 2_000, heartbeatMs: 300, maxMissedHeartbeats: 3, jitterMs: 200 };

interface Slot {
  index: number;
  generation: number;
  proc: Proc;
  /** worker → gateway */
  gw: FaultProxy;
  /** worker → PostgreSQL */
  db: FaultProxy | null;
  busy: boolean;
}

export async function runSoak(options: SoakOptions): Promise<SoakReport> {
  const log = options.log ?? (() => {});
  const rng = mulberry32(options.seed);
  const dir = tempDir('fencegate-soak-').dir;
  const started = Date.now();
  const harnessErrors: string[] = [];
  const faults = Object.fromEntries(FAULT_KINDS.map((k) => [k, 0])) as Record<FaultKind, number>;
  const late = { delivered: 0, refused: 0, admitted: 0, noAnswer: 0, afterNewer: 0 };
  const workerEvents = { claims: 0, takeovers: 0, leaseLost: 0, resultRejected: 0 };
  /** Starts that failed and were retried (a process restarted while its database was cut). */
  const restartRetries = { gateway: 0, workers: 0 };
  const slots: Slot[] = [];
  const proxies: FaultProxy[] = [];
  let upstream: Proc | null = null;
  let gateway: GatewayProc | null = null;
  let jobs: JobStore | null = null;
  let schema: TestSchema | null = null;
  let sqliteJobs: string | null = null;
  let sqliteGateway: string | null = null;

  const pgMode = options.backend === 'postgres';
  const weights = { ...DEFAULT_WEIGHTS, ...options.weights };
  if (!pgMode) weights.dbCut = weights.gatewayDbCut = 0;
  const kinds = FAULT_KINDS.filter((k) => weights[k] > 0);
  const [gapMin, gapMax] = options.gapMs ?? [250, 900];

  try {
    // --- the processes -------------------------------------------------------
    upstream = spawnProc(
      'upstream',
      [...TS_ARGS, join(ROOT, 'test/faults/toolkit/upstream-child.ts'), JSON.stringify({ effectsFile: join(dir, 'effects.ndjson') })],
      { keepLines: 10 },
    );
    const upstreamUrl = (await upstream.waitFor((m) => m.type === 'listening', 'the upstream listens')).url as string;
    const upProxy = await FaultProxy.start({ target: hostPort(upstreamUrl), name: 'gateway-upstream', random: rng });
    proxies.push(upProxy);

    let gwDb: FaultProxy | null = null;
    let pgTarget: { host: string; port: number } | null = null;
    let workerStore: (slot: number) => WorkerChildConfig['store'];
    if (pgMode) {
      if (!options.postgresUrl) throw new Error('the PostgreSQL soak needs postgresUrl');
      schema = await createSchema(options.postgresUrl);
      jobs = await createPostgresJobStore({ pool: schema.pool, connectionString: schema.url });
      pgTarget = hostPort(options.postgresUrl);
      gwDb = await FaultProxy.start({ target: pgTarget, name: 'gateway-db' });
      proxies.push(gwDb);
      const s = schema;
      workerStore = (i) => ({ postgres: slots[i]!.db!.wrapUrl(s.url) });
    } else {
      sqliteJobs = join(dir, 'jobs.db');
      sqliteGateway = join(dir, 'gateway.db');
      jobs = createSqliteJobStore({ path: sqliteJobs });
      const path = sqliteJobs;
      workerStore = () => ({ sqlite: path });
    }
    gateway = await startGatewayProc({
      store: pgMode ? { postgres: gwDb!.wrapUrl(schema!.url) } : { sqlite: sqliteGateway! },
      routes: faultRoutes(upProxy.url, { timeoutMs: 5_000, lockMarginMs: 1_000, serialWaitMs: 2_000 }),
      dir,
      checksOff: options.checksOff,
      config: { sweepInterval: '1s' },
    });
    const gw = gateway;

    const onWorkerLine = (m: Message) => {
      // FENCEGATE_SOAK_TRACE=1: every worker event on stdout, for debugging a failed run.
      if (process.env.FENCEGATE_SOAK_TRACE) console.log(Date.now() - started, JSON.stringify(m));
      if (m.type !== 'event') return;
      if (m.ev === 'job_claimed') {
        workerEvents.claims++;
        if (m.previousOwner) workerEvents.takeovers++;
      } else if (m.ev === 'heartbeat_lost') workerEvents.leaseLost++;
      else if (m.ev === 'result_rejected') workerEvents.resultRejected++;
    };
    const spawnWorker = (slot: Slot | { index: number; generation: number }) => {
      const workerId = `w${slot.index}.${slot.generation}`;
      const config: WorkerChildConfig = {
        workerId,
        store: workerStore(slot.index),
        gatewayUrl: slots[slot.index]?.gw.url ?? '',
        handler: 'soak',
        ...LEASE,
        pollIntervalMs: 100,
        concurrency: 2,
        statementTimeoutMs: 2_000,
        retry: { baseMs: 200, maxMs: 2_000 },
        requestTimeoutMs: 8_000,
      };
      return spawnProc(workerId, [...TS_ARGS, join(ROOT, 'test/faults/toolkit/worker-child.ts'), JSON.stringify(config)], {
        stdin: true,
        keepLines: 50,
        onLine: onWorkerLine,
      });
    };
    for (let i = 0; i < options.workers; i++) {
      const gwProxy = await FaultProxy.start({ target: { host: '127.0.0.1', port: gw.port }, name: `w${i}-gateway` });
      const db = pgMode ? await FaultProxy.start({ target: pgTarget!, name: `w${i}-db` }) : null;
      proxies.push(gwProxy, ...(db ? [db] : []));
      const slot = { index: i, generation: 1, gw: gwProxy, db, busy: false } as Slot;
      slots.push(slot);
      slot.proc = spawnWorker(slot);
    }
    await Promise.all(slots.map((s) => s.proc.waitFor((m) => m.type === 'ready', `${s.proc.name} ready`, 60_000)));
    // The fault phase starts once every process is up (start-up takes seconds on a loaded machine).
    const faultsFrom = Date.now();
    log(
      `soak seed=${options.seed} backend=${options.backend} checks=${options.checksOff ? 'fence-off' : 'on'}: ${options.workers} workers ready, faults for ${Math.round(options.durationMs / 1000)} s (${kinds.join(', ')})`,
    );

    // --- jobs: fed as the workers take them ----------------------------------
    let enqueued = 0;
    let feeding = true;
    const js = jobs;
    const feeder = (async () => {
      while (feeding && enqueued < options.maxJobs) {
        try {
          const counts = await js.counts();
          const queued = counts.filter((c) => c.state === 'queued').reduce((n, c) => n + c.count, 0);
          for (let i = queued; i < options.workers * 3 && enqueued < options.maxJobs; i++) {
            await js.enqueue({ kind: 'payment', idempotencyKey: `soak-${options.seed}-${enqueued}`, payload: { amount: 100 + enqueued }, maxAttempts: 8 });
            enqueued++;
          }
        } catch {
          // A paused worker may hold the SQLite write lock: try again later.
        }
        await sleep(200);
      }
    })();

    // --- faults ------------------------------------------------------------------
    const running = new Set<Promise<void>>();
    const exclusive = { latency: false, gatewayKill: false, gatewayDbCut: false };
    const freeSlot = (r: number): Slot | null => {
      const free = slots.filter((s) => !s.busy && s.proc.alive);
      return free.length === 0 ? null : free[Math.floor(r * free.length)]!;
    };
    const track = (p: Promise<void>) => {
      const t: Promise<void> = p
        .catch((err) => {
          harnessErrors.push(`fault task: ${err instanceof Error ? err.stack : String(err)}`);
          log(`HARNESS ERROR ${harnessErrors.at(-1)}`);
        })
        .finally(() => running.delete(t));
      running.add(t);
    };
    const effectsFor = async (entity: string): Promise<Effect[]> => {
      const res = await fetch(`${upstreamUrl}/__effects?entity=${encodeURIComponent(entity)}`);
      return (await res.json()) as Effect[];
    };

    const inject: Record<FaultKind, (r: number[]) => Promise<void> | null> = {
      pause: ([r0, r1]) => {
        const slot = freeSlot(r0!);
        if (!slot) return null;
        slot.busy = true;
        return (async () => {
          try {
            slot.proc.pause();
            await sleep(between(r1!, 300, 3_500));
          } finally {
            slot.proc.resume();
            slot.busy = false;
          }
        })();
      },
      kill: ([r0, r1]) => {
        const slot = freeSlot(r0!);
        if (!slot) return null;
        slot.busy = true;
        return (async () => {
          try {
            await slot.proc.kill();
            await sleep(between(r1!, 200, 1_000));
            // A supervisor's restart: a start that fails (its database unreachable) is retried.
            const deadline = Date.now() + 60_000;
            for (;;) {
              slot.generation++;
              slot.proc = spawnWorker(slot);
              const ready = await slot.proc.waitFor((m) => m.type === 'ready', `${slot.proc.name} ready`, 60_000).catch((err: Error) => err);
              if (!(ready instanceof Error)) break;
              if (Date.now() > deadline) throw ready;
              restartRetries.workers++;
              await slot.proc.kill();
              await sleep(500);
            }
          } finally {
            slot.busy = false;
          }
        })();
      },
      dbCut: ([r0, r1]) => {
        const slot = freeSlot(r0!);
        if (!slot?.db) return null;
        slot.busy = true;
        return (async () => {
          try {
            slot.db!.cut();
            await sleep(between(r1!, 500, 4_000));
          } finally {
            slot.db!.restore();
            slot.busy = false;
          }
        })();
      },
      gatewayDbCut: ([, r1]) => {
        if (!gwDb || exclusive.gatewayDbCut) return null;
        exclusive.gatewayDbCut = true;
        return (async () => {
          try {
            gwDb.cut();
            await sleep(between(r1!, 300, 2_000));
          } finally {
            gwDb.restore();
            exclusive.gatewayDbCut = false;
          }
        })();
      },
      upstreamReset: ([r0]) => {
        upProxy.resetNext(r0! < 0.5 ? 1 : 2);
        return Promise.resolve();
      },
      latency: ([r0, r1]) => {
        if (exclusive.latency) return null;
        exclusive.latency = true;
        return (async () => {
          try {
            upProxy.latency(between(r0!, 50, 400), 200);
            await sleep(between(r1!, 1_000, 3_000));
          } finally {
            upProxy.latency(0);
            exclusive.latency = false;
          }
        })();
      },
      gatewayKill: ([, r1]) => {
        if (exclusive.gatewayKill) return null;
        exclusive.gatewayKill = true;
        return (async () => {
          try {
            await gw.kill();
            await sleep(between(r1!, 200, 1_500));
            // Retried like a supervisor would (the gateway exits when its database is cut at start-up).
            restartRetries.gateway += (await gw.restart()) - 1;
          } finally {
            exclusive.gatewayKill = false;
          }
        })();
      },
      staleOwner: ([r0, r1, r2]) => {
        const slot = freeSlot(r0!);
        if (!slot) return null;
        slot.busy = true;
        // Mostly the notify step (a route without keys: only the fence guards it).
        const notifyOnly = r1! < 0.75;
        const freezeByCut = slot.db !== null && r2! < 0.5;
        return (async () => {
          try {
            slot.gw.hold((h) => !notifyOnly || h.target.startsWith('/notify/'));
            const already = slot.gw.heldRequests.length;
            const held = await slot.gw.waitForHeld(already + 1, 4_000).catch(() => null);
            if (held === null) {
              await slot.gw.release();
              return;
            }
            const req = held[already]!;
            if (freezeByCut) slot.db!.cut();
            else slot.proc.pause();
            const entity = req.head.headers['x-fence-entity'] ?? '';
            const fence = Number(req.head.headers['x-execution-fence']);
            // Until a newer owner of the job has reached the upstream (bounded).
            const deadline = Date.now() + 2 * LEASE.leaseMs + 6_000;
            let newer = false;
            while (Date.now() < deadline) {
              const seen = await effectsFor(entity).catch(() => []);
              if ((newer = seen.some((e) => Number(e.fence) > fence))) break;
              await sleep(200);
            }
            const delivered = await slot.gw.release(10_000);
            for (const h of delivered) {
              late.delivered++;
              if (newer) late.afterNewer++;
              if (h.response === undefined) late.noAnswer++;
              else if (h.response.status === 409 && h.response.text.includes('stale-fence')) late.refused++;
              else late.admitted++;
            }
          } finally {
            if (slot.db?.cutOff) slot.db.restore();
            slot.proc.resume();
            slot.busy = false;
          }
        })();
      },
    };

    const total = kinds.reduce((n, k) => n + weights[k], 0);
    const firstPass = [...kinds];
    for (let i = firstPass.length - 1; i > 0; i--) {
      const j = Math.floor(rng() * (i + 1));
      [firstPass[i], firstPass[j]] = [firstPass[j]!, firstPass[i]!];
    }
    let nextStatus = faultsFrom + (options.statusEveryMs ?? 30_000);
    // The phase lasts durationMs, and longer (up to three times that) while
    // the first pass has a kind left: a kind whose targets are all busy (a
    // worker still restarting on a slow box) is tried again, not skipped,
    // so a short run still injects every kind once.
    const firstPassUntil = faultsFrom + options.durationMs * 3;
    while (Date.now() - faultsFrom < options.durationMs || (firstPass.length > 0 && Date.now() < firstPassUntil)) {
      // Every draw happens whatever the outcome, so the schedule depends on the seed only.
      let x = rng() * total;
      let kind = kinds.find((k) => (x -= weights[k]) < 0) ?? kinds[kinds.length - 1]!;
      // A first pass injects every kind once (a short CI run must see them all).
      if (firstPass.length > 0) kind = firstPass[0]!;
      const draws = [rng(), rng(), rng()];
      const gap = between(rng(), gapMin, gapMax);
      const task = inject[kind](draws);
      if (task !== null) {
        faults[kind]++;
        track(task);
        if (firstPass[0] === kind) firstPass.shift();
      }
      if (!gw.alive && !exclusive.gatewayKill) {
        harnessErrors.push('the gateway died on its own');
        log(`HARNESS ERROR the gateway died on its own: ${gw.proc.stderr().slice(-2000)}`);
        exclusive.gatewayKill = true;
        track(
          gw.restart().then(
            () => void (exclusive.gatewayKill = false),
            (err) => Promise.reject(err),
          ),
        );
      }
      if (Date.now() > nextStatus) {
        nextStatus += options.statusEveryMs ?? 30_000;
        log(
          `  ${Math.round((Date.now() - faultsFrom) / 1000)} s: ${enqueued} jobs enqueued, ${workerEvents.claims} claims (${workerEvents.takeovers} takeovers), faults ${formatCounts(faults)}`,
        );
      }
      await sleep(gap);
    }
    const faultPhaseMs = Date.now() - faultsFrom;

    // --- drain ---------------------------------------------------------------------
    feeding = false;
    await feeder;
    await Promise.all([...running]);
    upProxy.latency(0);
    upProxy.resetRate(0);
    for (const p of proxies) p.restore();
    for (const s of slots) {
      s.proc.resume();
      if (s.gw.holding) await s.gw.release();
    }
    if (!gw.alive) restartRetries.gateway += (await gw.restart()) - 1;
    const drainStarted = Date.now();
    const drainDeadline = drainStarted + (options.drainMs ?? 90_000);
    const finalRead = () => readFinal({ jobs: js, schema, sqliteJobs, sqliteGateway, upstreamUrl });
    let final = await finalRead();
    while (Date.now() < drainDeadline) {
      const unfinished = final.jobs.filter((j) => j.state === 'queued' || j.state === 'running').length;
      const inProgress = final.records.filter((r) => r.state === 'in_progress').length;
      if (unfinished === 0 && inProgress === 0) break;
      await sleep(500);
      final = await finalRead();
    }
    const drainMs = Date.now() - drainStarted;
    for (const s of slots) s.proc.send('stop');
    await Promise.all(slots.map((s) => Promise.race([s.proc.exited, sleep(10_000)])));
    final = await finalRead();

    const violations = checkInvariants(final);
    const failedBy: Record<string, number> = {};
    for (const j of final.jobs.filter((x) => x.state === 'failed')) failedBy[j.reason ?? 'none'] = (failedBy[j.reason ?? 'none'] ?? 0) + 1;
    const unknownKeys = new Set(final.records.filter((r) => r.state === 'outcome_unknown').map((r) => r.key));
    const rejections: Record<string, number> = {};
    for (const r of final.rejections) rejections[r.reason] = r.n;
    const report: SoakReport = {
      seed: options.seed,
      backend: options.backend,
      checks: options.checksOff ? 'fence-off' : 'on',
      faultPhaseMs,
      drainMs,
      workers: options.workers,
      jobs: {
        total: final.jobs.length,
        succeeded: final.jobs.filter((j) => j.state === 'succeeded').length,
        failed: final.jobs.filter((j) => j.state === 'failed').length,
        failedBy,
        outcomeUnknown: final.jobs.filter((j) => j.state === 'failed' && unknownKeys.has(`${j.jobKey}:charge`)).length,
        stuck: final.jobs.filter((j) => j.state === 'queued' || j.state === 'running').length,
      },
      effects: {
        total: final.effects.length,
        charges: final.effects.filter((e) => e.path.startsWith('/payments/')).length,
        notifies: final.effects.filter((e) => e.path.startsWith('/notify/')).length,
      },
      faults,
      late,
      workerEvents,
      restartRetries,
      rejections,
      violations,
      harnessErrors,
      dir: options.keep ? dir : null,
      summary: '',
    };
    report.summary = summarize(report);
    return report;
  } finally {
    for (const s of slots) await s.proc?.kill();
    await gateway?.close();
    await upstream?.kill();
    for (const p of proxies) await p.close();
    await jobs?.close();
    await schema?.drop().catch(() => {});
    if (!options.keep) rmSync(dir, { recursive: true, force: true });
  }
}

interface TestSchema {
  pool: pg.Pool;
  url: string;
  drop(): Promise<void>;
}

/** A fresh schema on `url` (both the gateway's tables and tool_jobs), dropped at the end. */
async function createSchema(url: string): Promise<TestSchema> {
  const name = `fg_soak_${Math.random().toString(16).slice(2, 10)}`;
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  await admin.query(`CREATE SCHEMA ${name}`);
  await admin.end();
  const schemaUrl = withSearchPath(url, name);
  const pool = new pg.Pool({ connectionString: schemaUrl, max: 4 });
  return {
    pool,
    url: schemaUrl,
    async drop() {
      await pool.end();
      const c = new pg.Client({ connectionString: url });
      await c.connect();
      await c.query(`DROP SCHEMA IF EXISTS ${name} CASCADE`);
      await c.end();
    },
  };
}

function hostPort(url: string): { host: string; port: number } {
  const u = new URL(url);
  return { host: u.hostname, port: Number(u.port || (u.protocol.startsWith('postgres') ? 5432 : 80)) };
}

function formatCounts(counts: Record<string, number>): string {
  return Object.entries(counts)
    .map(([k, v]) => `${k} ${v}`)
    .join(', ');
}

/** The one line a soak prints: invariants, jobs, effects and the faults injected. */
export function summarize(r: SoakReport): string {
  const failed = Object.entries(r.jobs.failedBy)
    .map(([k, v]) => `${k} ${v}`)
    .join(', ');
  const faults = Object.entries(r.faults)
    .filter(([k, v]) => v > 0 || (r.backend === 'postgres' ? true : k !== 'dbCut' && k !== 'gatewayDbCut'))
    .map(([k, v]) => `${k} ${v}`)
    .join(', ');
  return (
    `soak seed=${r.seed} backend=${r.backend} checks=${r.checks} faults ${Math.round(r.faultPhaseMs / 100) / 10}s + drain ${Math.round(r.drainMs / 100) / 10}s, ` +
    `${r.workers} workers: jobs=${r.jobs.total} (succeeded ${r.jobs.succeeded}, failed ${r.jobs.failed}${failed ? `: ${failed}` : ''}; visibly outcome_unknown ${r.jobs.outcomeUnknown}; stuck ${r.jobs.stuck}) ` +
    `effects=${r.effects.total} (charges ${r.effects.charges}, notifies ${r.effects.notifies}) ` +
    `claims=${r.workerEvents.claims} takeovers=${r.workerEvents.takeovers} leaseLost=${r.workerEvents.leaseLost} ` +
    `faults: ${faults}; late requests ${r.late.delivered} (after a newer owner ${r.late.afterNewer}; refused stale-fence ${r.late.refused}, admitted ${r.late.admitted}, no answer ${r.late.noAnswer}); ` +
    `stale-fence refusals ${r.rejections['stale-fence'] ?? 0}; restarts retried (database cut at start-up): gateway ${r.restartRetries.gateway}, workers ${r.restartRetries.workers}; violations=${r.violations.length}${r.harnessErrors.length ? ` HARNESS ERRORS=${r.harnessErrors.length}` : ''}`
  );
}

/** Everything the invariants look at, read straight from the databases and the upstream. */
async function readFinal(where: {
  jobs: JobStore;
  schema: TestSchema | null;
  sqliteJobs: string | null;
  sqliteGateway: string | null;
  upstreamUrl: string;
}): Promise<FinalState> {
  const effects = (await (await fetch(`${where.upstreamUrl}/__effects`)).json()) as Effect[];
  // job_key as the lease module builds it (a row from before the store had an id keeps tool-job:<id>).
  const jobsSql =
    "SELECT id, 'tool-job:' || coalesce(store_id || ':', '') || id AS job_key, state, fencing_token, reason, error, result FROM tool_jobs ORDER BY id";
  const recordsSql = 'SELECT scope, key, state, entity, fence FROM idempotency_records';
  const rejectionsSql = 'SELECT reason, count(*) AS n FROM rejections GROUP BY reason';
  if (where.schema) {
    const q = async (sql: string) => (await where.schema!.pool.query(sql)).rows;
    const jobs = await q(jobsSql);
    return {
      effects,
      jobs: jobs.map((j: any) => ({
        id: Number(j.id),
        jobKey: j.job_key,
        state: j.state,
        token: Number(j.fencing_token),
        reason: j.reason,
        error: j.error,
        result: j.result,
      })),
      records: (await q(recordsSql)).map((r: any) => ({ ...r, fence: r.fence === null ? null : String(r.fence) })),
      rejections: (await q(rejectionsSql)).map((r: any) => ({ reason: r.reason, n: Number(r.n) })),
    };
  }
  const read = <T>(path: string, fn: (db: Database.Database) => T): T => {
    const db = new Database(path, { readonly: true, timeout: 5_000 });
    try {
      return fn(db);
    } finally {
      db.close();
    }
  };
  const jobs = read(where.sqliteJobs!, (db) => db.prepare(jobsSql).all()) as any[];
  const [records, rejections] = read(where.sqliteGateway!, (db) => [db.prepare(recordsSql).all(), db.prepare(rejectionsSql).all()]) as [any[], any[]];
  return {
    effects,
    jobs: jobs.map((j) => ({
      id: j.id,
      jobKey: j.job_key,
      state: j.state,
      token: j.fencing_token,
      reason: j.reason,
      error: j.error === null ? null : JSON.parse(j.error),
      result: j.result === null ? null : JSON.parse(j.result),
    })),
    records: records.map((r) => ({ ...r, fence: r.fence === null ? null : String(r.fence) })),
    rejections: rejections.map((r) => ({ reason: r.reason, n: Number(r.n) })),
  };
}
