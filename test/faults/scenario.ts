import { rmSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { createPostgresJobStore } from '../../src/lease/postgres/store.js';
import { createSqliteJobStore } from '../../src/lease/sqlite/store.js';
import type { Job, JobStore } from '../../src/lease/types.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { startUpstream, type FakeUpstream, type UpstreamCall } from '../helpers/upstream.js';
import { faultRoutes, startGatewayProc, type GatewayProc } from './toolkit/gateway-proc.js';
import { spawnProc, TS_ARGS, ROOT, type Message, type Proc } from '../helpers/child.js';
import { FaultProxy, type HeldRequest } from './toolkit/tcp-proxy.js';
import type { WorkerChildConfig } from './toolkit/worker-child.js';
import { tempDir } from '../helpers/temp.js';

/**
 * The seed's scenario with real processes (DESIGN §1, docs/faults.md):
 *
 *   W1 claims the job (token t) and heartbeats; its two requests (a charge on
 *   a route that deduplicates by key, a payout on a route whose upstream takes
 *   no key) leave W1 and get stuck in the network (a FaultProxy holds them).
 *   W1 loses the database: SIGSTOP (SQLite) or a cut of its database
 *   connections through a FaultProxy (PostgreSQL). Its lease expires by the
 *   database clock; W2 claims with t+1 and pays through the gateway. Then the
 *   network delivers W1's requests late, and W1 comes back: its extend and its
 *   result are refused by the database, its late requests by the gateway
 *   (409 stale-fence, in the rejection log), and the upstream saw exactly one
 *   charge and one payout.
 *
 * Why two requests: with a shared key the idempotency cache alone would
 * catch W1's late charge (it would get W2's answer replayed); the payout
 * route has no key, so only the fence stands between W1's late payout and a
 * second payout. With the fence check switched off (`checksOff: 'fence'`,
 * the test-only store wrapper) that second payout happens: the negative
 * control.
 */

export type Backend = 'sqlite' | 'postgres';

export interface ScenarioOptions {
  backend: Backend;
  checksOff?: 'fence';
  /** Narration, one line per step. */
  log?: (line: string) => void;
}

export interface ScenarioResult {
  backend: Backend;
  checksOff: 'fence' | null;
  jobId: number;
  entity: string;
  w1Token: number;
  w2Token: number;
  w2PreviousOwner: string | null;
  /** W1's requests as the proxy held them, with the gateway's late answers. */
  late: HeldRequest[];
  /** W1's own view once back. */
  w1Lost: Message | null;
  w1ResultRejected: Message | null;
  w1Extend: Message;
  w1Complete: Message;
  w2Committed: boolean;
  /** Stale-fence rows of the rejection log for the entity (admin API). */
  rejections: any[];
  charges: UpstreamCall[];
  payouts: UpstreamCall[];
  job: Job;
}

type LeaseTiming = Pick<WorkerChildConfig, 'leaseMs' | 'heartbeatMs' | 'maxMissedHeartbeats' | 'jitterMs'>;

/** W1's lease: short, because the story waits for it to expire. */
const LEASE: LeaseTiming = { leaseMs: 1_500, heartbeatMs: 250, maxMissedHeartbeats: 2, jitterMs: 100 };
/**
 * W2's lease: long. Nothing waits for it to expire; with W1's 1.5 s, a single
 * extend of W2's held up ~1.25 s by a slow fsync on a loaded box was enough
 * for W2 to lose its lease and the token to move on past W1's + 1, with no
 * code at fault.
 */
const W2_LEASE: LeaseTiming = { leaseMs: 10_000, heartbeatMs: 500, maxMissedHeartbeats: 2, jitterMs: 100 };

function workerConfig(workerId: string, store: WorkerChildConfig['store'], gatewayUrl: string, lease: LeaseTiming = LEASE): WorkerChildConfig {
  return {
    workerId,
    store,
    gatewayUrl,
    handler: 'scenario',
    ...lease,
    pollIntervalMs: 100,
    concurrency: 1,
    statementTimeoutMs: 2_000,
    requestTimeoutMs: 30_000,
    reportHeartbeats: true,
  };
}

function spawnWorker(config: WorkerChildConfig): Proc {
  return spawnProc(config.workerId, [...TS_ARGS, join(ROOT, 'test/faults/toolkit/worker-child.ts'), JSON.stringify(config)], { stdin: true });
}

const event = (ev: string, job: number) => (m: Message) => m.type === 'event' && m.ev === ev && m.job === job;

/**
 * SIGSTOP that never freezes W1 inside a write transaction on the SQLite
 * jobs file (that would lock W2 out, which is not the fault under test):
 * after the stop, take the write lock once on a separate connection; if
 * that fails, let W1 run one more heartbeat and stop it again. Bounded.
 */
async function pauseOutsideWrites(w: Proc, jobsDb: string): Promise<void> {
  const probe = new Database(jobsDb, { timeout: 0 });
  try {
    for (let i = 0; i < 10; i++) {
      w.pause();
      try {
        probe.exec('BEGIN IMMEDIATE');
        probe.exec('ROLLBACK');
        return;
      } catch {
        const seen = w.lines.length;
        w.resume();
        await w.waitFor((m) => m.ev === 'heartbeat_ok' && w.lines.indexOf(m) >= seen, 'a heartbeat after an unlucky stop');
      }
    }
    throw new Error('W1 held the write lock at every stop');
  } finally {
    probe.close();
  }
}

interface Resources {
  dir: string;
  upstream: FakeUpstream | null;
  gateway: GatewayProc | null;
  proxies: FaultProxy[];
  workers: Proc[];
  jobs: JobStore | null;
  schema: TestSchema | null;
}

export async function runStaleOwner(options: ScenarioOptions): Promise<ScenarioResult> {
  const log = options.log ?? (() => {});
  const r: Resources = { dir: tempDir('fencegate-faults-').dir, upstream: null, gateway: null, proxies: [], workers: [], jobs: null, schema: null };
  try {
    return await scenario(options, r, log);
  } finally {
    for (const w of r.workers) await w.kill();
    await r.gateway?.close();
    for (const p of r.proxies) await p.close();
    await r.upstream?.close();
    await r.jobs?.close();
    await r.schema?.drop();
    rmSync(r.dir, { recursive: true, force: true });
  }
}

async function scenario(options: ScenarioOptions, r: Resources, log: (line: string) => void): Promise<ScenarioResult> {
  const { backend } = options;
  const jobsDb = join(r.dir, 'jobs.db');
  let w1Store: WorkerChildConfig['store'];
  let w2Store: WorkerChildConfig['store'];
  let dbProxy: FaultProxy | null = null;
  r.upstream = await startUpstream();

  if (backend === 'sqlite') {
    r.jobs = createSqliteJobStore({ path: jobsDb });
    w1Store = w2Store = { sqlite: jobsDb };
    r.gateway = await startGatewayProc({
      store: { sqlite: join(r.dir, 'gateway.db') },
      routes: faultRoutes(r.upstream.url),
      dir: r.dir,
      checksOff: options.checksOff,
    });
  } else {
    if (!POSTGRES_URL) throw new Error('FENCEGATE_TEST_POSTGRES_URL is not set');
    r.schema = await createTestSchema('fg_faults', 4);
    r.jobs = await createPostgresJobStore({ pool: r.schema.pool, connectionString: r.schema.url });
    const pg = new URL(POSTGRES_URL);
    dbProxy = await FaultProxy.start({ target: { host: pg.hostname, port: Number(pg.port || 5432) }, name: 'w1-db' });
    r.proxies.push(dbProxy);
    w1Store = { postgres: dbProxy.wrapUrl(r.schema.url) };
    w2Store = { postgres: r.schema.url };
    r.gateway = await startGatewayProc({ store: { postgres: r.schema.url }, routes: faultRoutes(r.upstream.url), dir: r.dir, checksOff: options.checksOff });
  }
  const gateway = r.gateway;
  log(`gateway (${backend} store${options.checksOff ? ', FENCE CHECK OFF' : ''}) at ${gateway.url}; upstream at ${r.upstream.url}`);

  const { job } = await r.jobs.enqueue({ kind: 'payment', idempotencyKey: 'invoice-42', payload: { amount: 1200 }, maxAttempts: 5 });
  const entity = job.jobKey;
  log(`job ${job.id} enqueued (entity ${entity})`);

  // Everything W1 sends to the gateway gets stuck in the network.
  const w1Net = await FaultProxy.start({ target: { host: '127.0.0.1', port: gateway.port }, name: 'w1-gateway' });
  r.proxies.push(w1Net);
  w1Net.hold();

  const w1 = spawnWorker(workerConfig('w1', w1Store, w1Net.url));
  r.workers.push(w1);
  const claimed1 = await w1.waitFor(event('job_claimed', job.id), 'W1 claims');
  const w1Token = claimed1.token as number;
  await w1.waitFor(event('heartbeat_ok', job.id), 'W1 heartbeats');
  log(`W1 claimed job ${job.id} with token ${w1Token} and heartbeats`);
  const held = await w1Net.waitForHeld(2);
  log(`W1 sent ${held.map((h) => `${h.head.method} ${h.head.target} (fence ${h.head.headers['x-execution-fence']})`).join(' and ')}: stuck in the network`);

  if (backend === 'sqlite') {
    await pauseOutsideWrites(w1, jobsDb);
    log('W1 frozen (SIGSTOP): no heartbeats, no progress');
  } else {
    dbProxy!.cut();
    log('W1 cut off from PostgreSQL (its connections reset, new ones refused)');
    await w1.waitFor(event('heartbeat_failed', job.id), 'W1 notices the cut');
    log('W1: heartbeat failed');
  }

  const w2 = spawnWorker(workerConfig('w2', w2Store, gateway.url, W2_LEASE));
  r.workers.push(w2);
  const claimed2 = await w2.waitFor(event('job_claimed', job.id), "W2's claim after W1's lease expired", 60_000);
  const w2Token = claimed2.token as number;
  log(`W1's lease expired (database clock); W2 claimed job ${job.id} with token ${w2Token} (previous owner ${claimed2.previousOwner})`);
  const committed = await w2.waitFor(
    (m) => m.type === 'event' && m.job === job.id && (m.ev === 'result_committed' || m.ev === 'result_rejected' || m.ev === 'job_failed'),
    "W2's result",
  );
  log(`W2 paid through the gateway and committed its result (${committed.ev})`);

  const late = await w1Net.release();
  for (const h of late) log(`W1's late ${h.head.target} reached the gateway: ${h.response?.status ?? 'no answer'} ${problemType(h) ?? ''}`);

  if (backend === 'sqlite') {
    w1.resume();
    log('W1 resumed (SIGCONT)');
  } else {
    dbProxy!.restore();
    log("W1's database connection restored");
  }
  // W1's runner notices by itself (or already did, on PostgreSQL); the
  // result it computed is not stored. result_rejected always comes; a
  // heartbeat_lost, when the loss is noticed before the handler settles,
  // comes before it.
  const w1ResultRejected = await w1.waitFor(event('result_rejected', job.id), "W1's result refused").catch(() => null);
  const w1Lost = w1.lines.find(event('heartbeat_lost', job.id)) ?? null;
  if (w1Lost) log(`W1: heartbeat_lost (${w1Lost.cause})`);
  if (w1ResultRejected) log(`W1: result_rejected (${w1ResultRejected.reason})`);
  // And W1's own code, retrying by hand on its own connection: refused by the database.
  w1.send(`extend ${job.id} ${w1Token}`);
  const w1Extend = await w1.waitFor((m) => m.type === 'extend' && m.job === job.id, "W1's extend");
  w1.send(`complete ${job.id} ${w1Token}`);
  const w1Complete = await w1.waitFor((m) => m.type === 'complete' && m.job === job.id, "W1's late result");
  log(`W1 extend with token ${w1Token}: ${w1Extend.ok ? 'ACCEPTED' : `refused (${w1Extend.reason ?? w1Extend.error})`}`);
  log(`W1 complete with token ${w1Token}: ${w1Complete.ok ? 'ACCEPTED' : `refused (${w1Complete.reason ?? w1Complete.error})`}`);

  const page = await gateway.admin(`/v1/rejections?reason=stale-fence&entity=${encodeURIComponent(entity)}`);
  const finalJob = (await r.jobs.get(job.id))!;
  const calls = r.upstream.calls.filter((c) => c.entity === entity);
  const result: ScenarioResult = {
    backend,
    checksOff: options.checksOff ?? null,
    jobId: job.id,
    entity,
    w1Token,
    w2Token,
    w2PreviousOwner: claimed2.previousOwner ?? null,
    late,
    w1Lost,
    w1ResultRejected,
    w1Extend,
    w1Complete,
    w2Committed: committed.ev === 'result_committed',
    rejections: page.items ?? [],
    charges: calls.filter((c) => c.url.startsWith('/payments/')),
    payouts: calls.filter((c) => c.url.startsWith('/payouts/')),
    job: finalJob,
  };
  log(
    `audit log: ${result.rejections.length} stale-fence rejection(s) for ${entity}; upstream: ${result.charges.length} charge(s), ${result.payouts.length} payout(s)`,
  );
  return result;
}

export function problemType(h: HeldRequest): string | null {
  const body = h.response?.text.split('\r\n\r\n')[1];
  if (!body) return null;
  try {
    const type = JSON.parse(body).type;
    return typeof type === 'string' ? type.split('/').pop()! : null;
  } catch {
    return null;
  }
}

/** What the scenario must show; each string is one broken expectation (empty: all hold). */
export function checkScenario(r: ScenarioResult): string[] {
  const failures: string[] = [];
  const expect = (ok: boolean, what: string) => {
    if (!ok) failures.push(what);
  };
  expect(r.w2Token === r.w1Token + 1, `W2's token is W1's + 1 (${r.w1Token} → ${r.w2Token})`);
  expect(r.w2PreviousOwner === 'w1', `W2 took the job over from w1 (previous owner ${r.w2PreviousOwner})`);
  expect(r.w2Committed, "W2's result was committed");
  expect(r.late.length === 2, `W1's two requests were held and delivered late (${r.late.length})`);
  for (const h of r.late) {
    expect(
      h.response?.status === 409 && problemType(h) === 'stale-fence',
      `W1's late ${h.head.target} refused with 409 stale-fence (got ${h.response?.status} ${problemType(h)})`,
    );
  }
  expect(r.w1Extend.ok === false && r.w1Extend.reason === 'lease_lost', `W1's extend refused (${JSON.stringify(r.w1Extend)})`);
  expect(r.w1Complete.ok === false && r.w1Complete.reason === 'lease_lost', `W1's late result refused (${JSON.stringify(r.w1Complete)})`);
  expect(r.w1ResultRejected?.reason === 'lease_lost', `W1's runner reported result_rejected lease_lost (${JSON.stringify(r.w1ResultRejected)})`);
  const stale = r.rejections.filter((x) => x.presented_fence === String(r.w1Token) && x.current_fence === String(r.w2Token));
  expect(stale.length === 2, `two stale-fence rows (presented ${r.w1Token}, current ${r.w2Token}) in the audit log (${r.rejections.length} rows)`);
  expect(r.charges.length === 1, `exactly one charge upstream (${r.charges.length})`);
  expect(r.payouts.length === 1, `exactly one payout upstream (${r.payouts.length})`);
  for (const c of [...r.charges, ...r.payouts])
    expect(c.fence === String(r.w2Token), `every upstream effect carries W2's fence ${r.w2Token} (${c.url}: ${c.fence})`);
  expect(r.job.state === 'succeeded' && r.job.fencingToken === r.w2Token, `the job succeeded under W2's token (${r.job.state}, ${r.job.fencingToken})`);
  const stored = r.job.result as { worker?: string; fence?: number } | null;
  expect(stored?.worker === 'w2' && stored?.fence === r.w2Token, `the stored result is W2's (${JSON.stringify(stored)})`);
  return failures;
}
