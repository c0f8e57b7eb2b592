/**
 * A worker PROCESS for the fault tests: `runWorker` from fencegate/lease,
 * paying through the gateway with `fencedFetch`. Run it with the TypeScript
 * loader (procs.ts `TS_ARGS`); argv[2] is a `WorkerChildConfig` as JSON.
 *
 * stdout, one JSON line each:
 *   {"type":"ready"}
 *   {"type":"event","ev":"<lease event>","job":…,"token":…,…}   every runner event (heartbeat_ok only if asked)
 *   {"type":"response","job":…,"token":…,"step":…,"status":…,"code":…}   each answer the gateway gave a handler
 *   {"type":"extend"|"complete","job":…,"token":…,"ok":…}              answers to stdin commands
 *
 * stdin commands (the test acting for the worker's own code, after it comes back):
 *   extend <job> <token>     one extend of that lease, on this process's own connection
 *   complete <job> <token>   one complete of that lease with a late result
 *   stop                     stop({ release: true }) and exit 0
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { createInterface } from 'node:readline';
import { Agent, fetch as undiciFetch } from 'undici';
import { JobError, LeaseLostError, OutcomeUnknownError, OwnershipUnknownError } from '../../../src/lease/errors.js';
import type { FencedFetch } from '../../../src/lease/fenced-fetch.js';
import { openJobStore } from '../../../src/lease/open.js';
import { runWorker } from '../../../src/lease/runner/run-worker.js';
import type { JobContext } from '../../../src/lease/runner/types.js';
import type { StoreDescriptor } from '../../../src/lease/types.js';

export interface WorkerChildConfig {
  workerId: string;
  store: StoreDescriptor;
  /** Where the gateway is (usually a FaultProxy in front of it). */
  gatewayUrl: string;
  /**
   * `scenario`: charge (a route that deduplicates by key) and payout (a
   * route whose upstream takes no key), at once, and return. `soak`: charge, then notify,
   * riding out gateway and network faults within the attempt.
   */
  handler: 'scenario' | 'soak';
  leaseMs: number;
  heartbeatMs: number;
  maxMissedHeartbeats: number;
  jitterMs: number;
  pollIntervalMs: number;
  concurrency: number;
  /** Per-statement timeout of this process's store connections. */
  statementTimeoutMs?: number;
  retry?: { baseMs: number; maxMs: number };
  /** fencedFetch timeoutMs. */
  requestTimeoutMs: number;
  /** Report heartbeat_ok events too (noisy). */
  reportHeartbeats?: boolean;
}

const config = JSON.parse(process.argv[2]!) as WorkerChildConfig;
const out = (m: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(m)}\n`);

// One connection per request (no keep-alive): a fault proxy then decides per
// request whether to hold it, and a held request holds nothing else.
const agent = new Agent({ pipelining: 0, connect: { timeout: 5_000 } });
const fetchOnce = ((input: any, init: any) => undiciFetch(input, { ...init, dispatcher: agent })) as unknown as typeof fetch;

const store = await openJobStore(config.store, {
  migrate: false,
  ...(config.statementTimeoutMs ? { statementTimeoutMs: config.statementTimeoutMs } : {}),
});

interface Answer {
  status: number;
  code: string | null;
  body: any;
}

async function answerOf(res: Response): Promise<Answer> {
  const text = await res.text();
  let body: any = null;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON
  }
  const type = res.headers.get('content-type') === 'application/problem+json' && typeof body?.type === 'string' ? body.type : null;
  return { status: res.status, code: type === null ? null : type.split('/').pop(), body };
}

async function call(ctx: JobContext<any>, step: string, url: string, body: string): Promise<Answer> {
  const res = await ctx.fencedFetch(url, {
    step,
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body,
    timeoutMs: config.requestTimeoutMs,
  });
  const a = await answerOf(res);
  out({
    type: 'response',
    job: ctx.job.id,
    token: ctx.job.fencingToken,
    step,
    status: a.status,
    code: a.code,
    replayed: res.headers.get('idempotent-replayed') === 'true',
  });
  return a;
}

/** The seed's handler: both requests at once, then the result. */
async function scenario(ctx: JobContext<any>) {
  const body = JSON.stringify({ amount: ctx.job.payload?.amount ?? 1200 });
  const [charge, payout] = await Promise.all([
    call(ctx, 'charge', `${config.gatewayUrl}/payments/charges`, body),
    call(ctx, 'payout', `${config.gatewayUrl}/payouts/send`, body),
  ]);
  return { worker: config.workerId, fence: ctx.job.fencingToken, charge: charge.body, payout: payout.body };
}

/**
 * One step of the soak's handler, riding out faults within the attempt with
 * the SAME step (hence the same Idempotency-Key): what a careful worker does.
 * - lease lost or ownership unknown: rethrown, the runner decides;
 * - 409 outcome-unknown: an operator's case, the job fails with that code;
 * - a network error, 502, 503, 504, 409 in-progress / entity-busy: retry.
 */
async function step(ctx: JobContext<any>, name: string, url: string, body: string): Promise<Answer> {
  for (let i = 0; i < 20; i++) {
    let a: Answer | null = null;
    try {
      a = await call(ctx, name, url, body);
    } catch (err) {
      if (err instanceof LeaseLostError || err instanceof OwnershipUnknownError || ctx.signal.aborted) throw err;
      if (!(err instanceof OutcomeUnknownError) && !(err instanceof TypeError)) throw err;
      // The request may or may not have reached the gateway: the same key again.
    }
    if (a !== null) {
      if (a.status >= 200 && a.status < 300) return a;
      if (a.code === 'outcome-unknown') throw new JobError('outcome_unknown', `${name}: the gateway holds an outcome_unknown record`, { retryable: false });
      const retryable = a.status === 502 || a.status === 503 || a.status === 504 || a.code === 'idempotency-in-progress' || a.code === 'entity-busy';
      if (!retryable) throw new JobError('unexpected_answer', `${name}: ${a.status} ${a.code ?? ''}`, { retryable: true });
    }
    await sleep(Math.min(100 * 2 ** Math.min(i, 4), 1_000) * (0.5 + Math.random()), undefined, { signal: ctx.signal }).catch(() => {});
    if (ctx.signal.aborted) throw ctx.signal.reason;
  }
  throw new JobError('gave_up', `${name}: no answer after 20 tries`, { retryable: true });
}

async function soak(ctx: JobContext<any>) {
  const body = JSON.stringify({ job: ctx.job.id, amount: ctx.job.payload?.amount ?? 100 });
  const charge = await step(ctx, 'charge', `${config.gatewayUrl}/payments/charges`, body);
  const notify = await step(ctx, 'notify', `${config.gatewayUrl}/notify/messages`, body);
  return { worker: config.workerId, fence: ctx.job.fencingToken, charge: charge.body?.effect ?? null, notify: notify.body?.effect ?? null };
}

const handler = config.handler === 'scenario' ? scenario : soak;
const worker = await runWorker({
  store,
  workerId: config.workerId,
  leaseMs: config.leaseMs,
  heartbeatMs: config.heartbeatMs,
  maxMissedHeartbeats: config.maxMissedHeartbeats,
  jitterMs: config.jitterMs,
  pollIntervalMs: config.pollIntervalMs,
  concurrency: config.concurrency,
  ...(config.retry ? { retry: config.retry } : {}),
  fetch: fetchOnce,
  handlers: { payment: handler },
});

worker.events.onAny((e) => {
  if (e.type === 'heartbeat_ok' && !config.reportHeartbeats) return;
  const m: Record<string, unknown> = { type: 'event', ev: e.type, job: e.jobId, token: e.fencingToken, worker: e.workerId };
  if ('cause' in e) m.cause = e.cause;
  if ('reason' in e) m.reason = e.reason;
  if ('previousOwnerId' in e) m.previousOwner = e.previousOwnerId;
  if ('step' in e) m.step = e.step;
  if ('terminal' in e) m.terminal = e.terminal;
  if ('errorCode' in e) m.errorCode = e.errorCode;
  out(m);
});

out({ type: 'ready', worker: config.workerId, pid: process.pid });

for await (const line of createInterface({ input: process.stdin })) {
  const [command, job, token] = line.trim().split(/\s+/);
  const ref = { id: Number(job), ownerId: config.workerId, fencingToken: Number(token), leaseMs: config.leaseMs };
  try {
    if (command === 'extend') {
      const r = await store.extend(ref);
      out({ type: 'extend', job: ref.id, token: ref.fencingToken, ok: r.ok, ...(r.ok ? {} : { reason: r.reason }) });
    } else if (command === 'complete') {
      const r = await store.complete(ref, { worker: config.workerId, fence: ref.fencingToken, late: true });
      out({ type: 'complete', job: ref.id, token: ref.fencingToken, ok: r.ok, ...(r.ok ? {} : { reason: r.reason }) });
    } else if (command === 'stop') {
      break;
    }
  } catch (err) {
    out({ type: command ?? 'command', job: ref.id, token: ref.fencingToken, error: String(err) });
  }
}
await worker.stop({ release: true });
await store.close();
await agent.close();
process.exit(0);
