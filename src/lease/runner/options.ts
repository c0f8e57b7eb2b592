/**
 * `runWorker` options, parsed once at start-up (CONTRIBUTING.md convention 4): an invalid
 * value fails with a `LeaseConfigError` that names the field.
 */
import { z } from 'zod';
import { LeaseConfigError } from '../errors.js';
import { LeaseEvents } from '../events.js';
import type { FenceHeaderNames, FenceSigner } from '../fenced-fetch.js';
import type { JobContext, JobHandler, PayloadSchema } from './types.js';
import { checkLeaseTiming, HEARTBEAT_DEFAULTS, type BackoffPolicy } from '../timing.js';
import type { JobStore, StoreDescriptor } from '../types.js';

export interface KindOptions {
  /** Lease length for this kind; default the worker's `leaseMs`. */
  leaseMs?: number;
  /** The longest an attempt may run, heartbeats or not; past it: `stage_timeout`. Default the worker's `maxRunMs`. */
  maxRunMs?: number;
  /** The longest the handler's thread may be blocked before heartbeats stop; default the kind's lease. */
  maxStallMs?: number;
}

export interface RunWorkerOptions {
  store: JobStore;
  /** Unique per worker process; it becomes the jobs' `owner_id` and a signed fence's `sub`. */
  workerId: string;
  /** One handler per kind; the worker claims only these kinds. */
  handlers: Record<string, JobHandler<any, any>>;
  /** Default lease length. Default 30 000 ms. */
  leaseMs?: number;
  /** Heartbeat interval. Default 5 000 ms. */
  heartbeatMs?: number;
  /** Heartbeats that may fail in a row while the lease still holds. Default 3. */
  maxMissedHeartbeats?: number;
  /** Slack for timer lateness and statement round trips; heartbeats are spread by up to this much. Default 1 000 ms. */
  jitterMs?: number;
  /**
   * How long one extend may take before it counts as a missed beat (and is
   * retried). Default on SQLite `heartbeatMs` (a busy wait blocks the
   * heartbeat thread, so keep it short); on PostgreSQL
   * max(2 000, maxMissedHeartbeats × heartbeatMs), room to reconnect.
   */
  heartbeatTimeoutMs?: number;
  /** Default for `kinds.*.maxRunMs`. Default 600 000 ms (10 minutes). */
  maxRunMs?: number;
  /** Default for `kinds.*.maxStallMs`. Default: the kind's lease length. */
  maxStallMs?: number;
  /** Per-kind lease, run time and stall limits. Lease lengths come from here, never from a payload. */
  kinds?: Record<string, KindOptions>;
  /** Jobs in flight at once. Default 1. */
  concurrency?: number;
  /** How long to wait before claiming again when nothing was ready. Default 1 000 ms. */
  pollIntervalMs?: number;
  /** Backoff before a retryable failure may be claimed again: base × 2^(attempt−1), capped. Default 1 000 / 60 000 ms. */
  retry?: Partial<BackoffPolicy>;
  /** The `fetch` behind `fencedFetch`. Default the global one. */
  fetch?: typeof fetch;
  /** Header names, if the gateway's routes changed them. */
  fenceHeaders?: Partial<FenceHeaderNames>;
  /** Signs fences (DESIGN §7); without it the fence header is the decimal token. */
  fenceSigner?: FenceSigner;
  /** How the heartbeat thread reaches the database; default the store's own descriptor. */
  threadStore?: StoreDescriptor;
  /** Node flags for the heartbeat thread; default the process's own (e.g. a TypeScript loader in tests). */
  threadExecArgv?: string[];
  /** An emitter to report to (to subscribe before the worker starts); default a new one. */
  events?: LeaseEvents;
}

export interface KindConfig {
  leaseMs: number;
  maxRunMs: number;
  maxStallMs: number;
}

export interface WorkerConfig {
  store: JobStore;
  workerId: string;
  handlers: Record<string, { schema?: PayloadSchema; run: (ctx: JobContext<any>) => unknown }>;
  heartbeatMs: number;
  maxMissedHeartbeats: number;
  jitterMs: number;
  heartbeatTimeoutMs: number;
  leaseMs: number;
  kinds: Record<string, KindConfig>;
  concurrency: number;
  pollIntervalMs: number;
  retry: BackoffPolicy;
  pulseMs: number;
  fetch: typeof fetch | undefined;
  fenceHeaders: Partial<FenceHeaderNames> | undefined;
  fenceSigner: FenceSigner | undefined;
  threadStore: StoreDescriptor;
  threadExecArgv: string[] | undefined;
}

const ms = z.number().int().positive();
const isFunction = (v: unknown) => typeof v === 'function';
const handler = z.union([
  z.custom<(ctx: JobContext<any>) => unknown>(isFunction, { message: 'must be a function or { run, schema? }' }),
  z
    .object({
      run: z.custom<(ctx: JobContext<any>) => unknown>(isFunction, { message: 'must be a function' }),
      schema: z
        .custom<PayloadSchema>((v) => typeof (v as PayloadSchema | null)?.safeParse === 'function', {
          message: 'must have safeParse (e.g. a zod schema)',
        })
        .optional(),
    })
    .strict(),
]);

const schema = z
  .object({
    store: z.custom<JobStore>((v) => typeof (v as JobStore | null)?.claim === 'function', { message: 'must be a JobStore' }),
    workerId: z.string().min(1).max(200),
    handlers: z.record(z.string().min(1), handler).refine((h) => Object.keys(h).length > 0, 'needs at least one kind'),
    leaseMs: ms.default(30_000),
    heartbeatMs: ms.default(HEARTBEAT_DEFAULTS.heartbeatMs),
    maxMissedHeartbeats: z.number().int().min(1).default(HEARTBEAT_DEFAULTS.maxMissedHeartbeats),
    jitterMs: z.number().int().min(0).default(HEARTBEAT_DEFAULTS.jitterMs),
    heartbeatTimeoutMs: ms.optional(),
    maxRunMs: ms.default(600_000),
    maxStallMs: ms.optional(),
    kinds: z.record(z.string(), z.object({ leaseMs: ms, maxRunMs: ms, maxStallMs: ms }).partial().strict()).default({}),
    concurrency: z.number().int().min(1).max(1000).default(1),
    pollIntervalMs: ms.default(1_000),
    retry: z.object({ baseMs: ms, maxMs: ms }).partial().strict().default({}),
    fetch: z.custom<typeof fetch>(isFunction, { message: 'must be a function' }).optional(),
    fenceHeaders: z
      .object({ fence: z.string().min(1), entity: z.string().min(1), idempotencyKey: z.string().min(1), requestId: z.string().min(1) })
      .partial()
      .strict()
      .optional(),
    fenceSigner: z.custom<FenceSigner>(isFunction, { message: 'must be a function' }).optional(),
    threadStore: z
      .union([z.object({ sqlite: z.string().min(1), busyTimeoutMs: ms.optional() }).strict(), z.object({ postgres: z.string().min(1) }).strict()])
      .optional(),
    threadExecArgv: z.array(z.string()).optional(),
    events: z.instanceof(LeaseEvents).optional(),
  })
  .strict();

/** Parses and checks `runWorker` options; throws `LeaseConfigError` naming the field. */
export function parseWorkerOptions(options: RunWorkerOptions): WorkerConfig {
  const parsed = schema.safeParse(options);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `${i.path.join('.') || '(options)'}: ${i.message}`);
    throw new LeaseConfigError(`runWorker: invalid options: ${issues.join('; ')}`);
  }
  const o = parsed.data;

  // The handler thread's pulse: often enough that a stall is seen quickly,
  // rarely enough to cost nothing.
  const pulseMs = Math.max(10, Math.min(100, Math.floor(o.heartbeatMs / 4)));
  const kinds: Record<string, KindConfig> = {};
  for (const kind of Object.keys(o.kinds)) {
    if (!(kind in o.handlers)) throw new LeaseConfigError(`runWorker: kinds.${kind} has no handler in handlers`);
  }
  for (const kind of Object.keys(o.handlers)) {
    const k = o.kinds[kind] ?? {};
    const leaseMs = k.leaseMs ?? o.leaseMs;
    const config: KindConfig = { leaseMs, maxRunMs: k.maxRunMs ?? o.maxRunMs, maxStallMs: k.maxStallMs ?? o.maxStallMs ?? leaseMs };
    const where = kind in o.kinds ? `runWorker kinds.${kind}` : 'runWorker';
    checkLeaseTiming({ leaseMs, heartbeatMs: o.heartbeatMs, maxMissedHeartbeats: o.maxMissedHeartbeats, jitterMs: o.jitterMs }, where);
    if (config.maxStallMs < 4 * pulseMs) {
      throw new LeaseConfigError(`${where}: maxStallMs (${config.maxStallMs}) must be at least ${4 * pulseMs} ms (4 pulses of the handler thread)`);
    }
    kinds[kind] = config;
  }

  const threadStore = o.threadStore ?? o.store.descriptor;
  if (!threadStore) {
    throw new LeaseConfigError(
      'runWorker: threadStore is required: the store was opened from a pool without a connection string, ' +
        'and the heartbeat thread needs its own connection ({ postgres: url } or { sqlite: path })',
    );
  }

  const handlers: WorkerConfig['handlers'] = {};
  for (const [kind, h] of Object.entries(o.handlers)) {
    handlers[kind] = typeof h === 'function' ? { run: h } : h;
  }

  const heartbeatTimeoutMs = o.heartbeatTimeoutMs ?? ('sqlite' in threadStore ? o.heartbeatMs : Math.max(2_000, o.maxMissedHeartbeats * o.heartbeatMs));

  return {
    store: o.store,
    workerId: o.workerId,
    handlers,
    heartbeatMs: o.heartbeatMs,
    maxMissedHeartbeats: o.maxMissedHeartbeats,
    jitterMs: o.jitterMs,
    heartbeatTimeoutMs,
    leaseMs: o.leaseMs,
    kinds,
    concurrency: o.concurrency,
    pollIntervalMs: o.pollIntervalMs,
    retry: { baseMs: o.retry.baseMs ?? 1_000, maxMs: o.retry.maxMs ?? 60_000 },
    pulseMs,
    fetch: o.fetch,
    fenceHeaders: o.fenceHeaders,
    fenceSigner: o.fenceSigner,
    threadStore,
    threadExecArgv: o.threadExecArgv,
  };
}
