/**
 * A real graphile-worker runner in its own process, its task wrapped by
 * `fencedTask`. argv: one JSON object (see `Config`). Each run charges once
 * through the gateway and reports the job row's own `attempts`.
 */
import pg from 'pg';
import { run } from 'graphile-worker';
import { createFenceSigner } from '../../../src/lease/index.js';
import { createFenceSource, fencedTask } from '../../../src/queue/graphile-worker.js';
import type { FenceSource } from '../../../src/queue/types.js';
import { command, errorFields, holdingFetch, reply } from './child.js';

interface Config {
  /** Connection string whose search_path is the test's schema (the fence tables). */
  url: string;
  /** graphile-worker's own schema. */
  workerSchema: string;
  gateway: string;
  hold: boolean;
  /** Negative control: every attempt presents fence 1. */
  unfenced: boolean;
  /** Sign fences (the gateway has `fence.signed` with this secret). */
  signed?: { secret: string; graceSeconds: number };
  /** After `started`, wait for the test's `call` before the charge is built (and its fence minted). */
  waitForCall?: boolean;
  /** The adapter's `lockMs` (default graphile-worker's 4 h). */
  lockMs?: number;
}

const config = JSON.parse(process.argv[2]!) as Config;
const pool = new pg.Pool({ connectionString: config.url, max: 4 });
const real = await createFenceSource({ postgres: pool, migrate: false });
const fences: FenceSource = config.unfenced ? { backend: real.backend, storeId: real.storeId, begin: async () => ({ ok: true, fence: 1 }) } : real;

const pay = fencedTask<{ amount: number }>(
  async (payload, helpers, { fencedFetch, fence, entity, signal }) => {
    reply({
      msg: 'started',
      jobId: String(helpers.job.id),
      fence,
      entity,
      attempts: (helpers.job as { attempts?: number }).attempts,
      lockedAt: helpers.job.locked_at,
    });
    try {
      if (config.waitForCall) await command('call');
      const res = await fencedFetch(`${config.gateway}/payments/charges`, {
        step: 'charge',
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(payload),
      });
      reply({ msg: 'paid', status: res.status, replayed: res.headers.get('idempotent-replayed'), body: await res.json() });
    } catch (err) {
      reply({ msg: 'refused', ...errorFields(err), aborted: signal.aborted });
      throw err;
    }
  },
  {
    fences,
    workerSchema: config.workerSchema,
    ...(config.hold ? { fetch: holdingFetch() } : {}),
    ...(config.signed ? { fenceSigner: createFenceSigner({ secret: config.signed.secret }, { graceSeconds: config.signed.graceSeconds }) } : {}),
    ...(config.lockMs !== undefined ? { lockMs: config.lockMs } : {}),
  },
);

const runner = await run({
  pgPool: pool,
  schema: config.workerSchema,
  concurrency: 1,
  pollInterval: 100,
  noHandleSignals: true,
  // Clear expired locks soon after start (the default waits up to 60 s, then 8–10 min).
  minResetLockedInterval: 100,
  maxResetLockedInterval: 200,
  taskList: { pay: pay as never },
});
runner.events.on('job:success', ({ job }) => reply({ msg: 'completed', jobId: String(job.id) }));
runner.events.on('job:error', ({ job, error }) => reply({ msg: 'failed', jobId: String(job.id), ...errorFields(error) }));
reply({ msg: 'ready' });
