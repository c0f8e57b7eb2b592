/**
 * A real BullMQ worker in its own process, its processor wrapped by
 * `fencedProcessor`. argv: one JSON object (see `Config`). Each run charges
 * once through the gateway and reports what the queue's own counters said.
 */
import { Worker, type Job } from 'bullmq';
import { createFenceSigner } from '../../../src/lease/index.js';
import { createFenceSource, fencedProcessor } from '../../../src/queue/bullmq.js';
import type { FenceSource } from '../../../src/queue/types.js';
import { connectRedis } from './redis.js';
import { command, errorFields, holdingFetch, reply } from './child.js';

interface Config {
  queue: string;
  prefix: string;
  namespace: string;
  gateway: string;
  /** Stop before the charge leaves until the test says `go`. */
  hold: boolean;
  /** Negative control: every attempt presents fence 1, as if unfenced. */
  unfenced: boolean;
  lockDuration: number;
  stalledInterval: number;
  /** Sign fences (the gateway has `fence.signed` with this secret). */
  signed?: { secret: string; graceSeconds: number };
  /** After `started`, wait for the test's `call` before the charge is built (and its fence minted). */
  waitForCall?: boolean;
  /** `processor.watch(worker)`: follow BullMQ's lock renewals explicitly. */
  watch?: boolean;
  /** The processor gets each job without the Worker that created it (`job.queue`), as a job a Worker did not hand out would come. */
  detached?: boolean;
}

const config = JSON.parse(process.argv[2]!) as Config;
const connection = connectRedis({ maxRetriesPerRequest: null });
const real = await createFenceSource({ redis: connection, namespace: config.namespace });
const fences: FenceSource = config.unfenced ? { backend: real.backend, storeId: real.storeId, begin: async () => ({ ok: true, fence: 1 }) } : real;

const processor = fencedProcessor<Job, unknown>(
  async (job, { fencedFetch, fence, entity, signal }) => {
    reply({
      msg: 'started',
      jobId: job.id,
      fence,
      entity,
      attemptsMade: job.attemptsMade,
      attemptsStarted: job.attemptsStarted,
      stalledCounter: job.stalledCounter,
    });
    try {
      if (config.waitForCall) await command('call');
      const res = await fencedFetch(`${config.gateway}/payments/charges`, {
        step: 'charge',
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(job.data),
      });
      const body = await res.json();
      reply({ msg: 'paid', status: res.status, replayed: res.headers.get('idempotent-replayed'), body });
      return body;
    } catch (err) {
      reply({ msg: 'refused', ...errorFields(err), aborted: signal.aborted });
      throw err;
    }
  },
  {
    fences,
    ...(config.hold ? { fetch: holdingFetch() } : {}),
    ...(config.signed ? { fenceSigner: createFenceSigner({ secret: config.signed.secret }, { graceSeconds: config.signed.graceSeconds }) } : {}),
  },
);

// A detached job: the same job, its `queue` (the Worker) hidden, so the adapter has no worker to follow.
const handed = config.detached
  ? (job: Job, token?: string, signal?: AbortSignal) => processor(Object.create(job, { queue: { value: undefined } }) as Job, token, signal)
  : processor;
const worker = new Worker(config.queue, handed as never, {
  connection: connection as never,
  prefix: config.prefix,
  concurrency: 1,
  lockDuration: config.lockDuration,
  stalledInterval: config.stalledInterval,
  maxStalledCount: 1,
});
if (config.watch) processor.watch(worker);
worker.on('completed', (job) => reply({ msg: 'completed', jobId: job.id }));
worker.on('failed', (job, err) => reply({ msg: 'failed', jobId: job?.id, ...errorFields(err) }));
worker.on('error', (err) => reply({ msg: 'worker_error', ...errorFields(err) }));
await worker.waitUntilReady();
reply({ msg: 'ready' });
