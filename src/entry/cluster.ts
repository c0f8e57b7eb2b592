/**
 * `fencegate serve --workers N`: N gateway processes behind one listening
 * socket (node:cluster), on one store.
 *
 * Why node:cluster and not SO_REUSEPORT: Node 20's `net` has no `reusePort`
 * (it arrived in Node 22.12), and cluster's round-robin hands each new
 * connection to the next worker, where SO_REUSEPORT's kernel hash can leave
 * one process with most of a few long-lived keep-alive connections. The
 * price is that the primary accepts every connection and passes its handle
 * on; it reads and writes no request.
 *
 * The primary holds no gateway state: no store, no config beyond the check
 * the CLI ran before forking. It forks the workers, forwards SIGTERM/SIGINT
 * (each worker drains by itself: docs/cli.md) and SIGHUP (each worker
 * reloads by itself), restarts a worker that dies (with back-off), relays
 * the workers' log lines whole, and answers a worker's `/metrics` with the
 * group's counters (`aggregateMetrics`).
 *
 * Every guarantee holds across the workers because it holds across
 * processes on one store (DESIGN §8.1 for a SQLite file, §8.2 for
 * PostgreSQL): nothing here decides anything about a request. The sweeper
 * and the background reconciler run in worker 0 only (both are conditional
 * writes, so two would be harmless, only double work); a restarted worker 0
 * runs them again.
 */
import cluster, { type Worker } from 'node:cluster';
import { availableParallelism } from 'node:os';
import type { Logger } from '../http/logger.js';
import { setNotifyRelay, wakeFromElsewhere } from '../store/notifier.js';

/** The environment variable `--workers` falls back to. */
export const WORKERS_ENV = 'FENCEGATE_WORKERS';
/** The slot (0…N-1) the primary gives each worker; a restarted worker keeps its slot. */
const SLOT_ENV = 'FENCEGATE_WORKER_SLOT';
/** The default group is one worker per core, at most this many (past it, the store's one writer is the limit: docs/performance.md). */
export const MAX_DEFAULT_WORKERS = 8;
/** An explicit --workers above this is refused (a typo, not a deployment). */
export const MAX_WORKERS = 256;

export function defaultWorkers(): number {
  return Math.max(1, Math.min(availableParallelism(), MAX_DEFAULT_WORKERS));
}

/** `--workers`, else a non-empty FENCEGATE_WORKERS, else the default; a string says what is wrong. */
export function workersFrom(flag: string | undefined, env: string | undefined): number | string {
  const [name, value] = flag !== undefined ? ['--workers', flag] : env !== undefined && env !== '' ? [WORKERS_ENV, env] : [null, null];
  if (name === null) return defaultWorkers();
  if (value === 'auto') return defaultWorkers();
  if (!/^\d{1,4}$/.test(value) || Number(value) < 1 || Number(value) > MAX_WORKERS)
    return `${name} must be a number from 1 to ${MAX_WORKERS}, or "auto" (one per core, at most ${MAX_DEFAULT_WORKERS}); it is ${JSON.stringify(value)}`;
  return Number(value);
}

/** In a worker of a `serve --workers` group: its slot; null in a single process. */
export function workerSlot(): number | null {
  if (!cluster.isWorker) return null;
  const slot = Number(process.env[SLOT_ENV]);
  return Number.isInteger(slot) && slot >= 0 ? slot : null;
}

// ---------------------------------------------------------------- messages

type ToPrimary =
  | { fg: 'ready' }
  /** This worker's own drain is over: it keeps its listener open until the whole group's is. */
  | { fg: 'drained' }
  | { fg: 'watch'; topic: string; on: boolean }
  | { fg: 'changed'; topic: string }
  | { fg: 'metrics'; id: number }
  | { fg: 'collected'; id: number; metrics: unknown[] | null };
type ToWorker =
  | { fg: 'collect'; id: number }
  /** Every worker has drained: close the listener and exit. */
  | { fg: 'close' }
  | { fg: 'metrics-result'; id: number; text: string | null; error?: string }
  /** Whether a worker other than the receiver waits on `topic`. */
  | { fg: 'watched'; topic: string; on: boolean }
  | { fg: 'changed'; topic: string };

function isMessage(m: unknown): m is { fg: string } {
  return typeof m === 'object' && m !== null && typeof (m as { fg?: unknown }).fg === 'string';
}

// ---------------------------------------------------------------- worker side

/**
 * What a worker's `/metrics` needs from the group (../entry/node.ts):
 * `aggregate()` asks the primary for the whole group's exposition, and
 * `serve(collect)` answers the primary's requests for this worker's
 * metrics (prom-client's JSON, refreshed first by `collect`).
 */
export interface MetricsGroup {
  aggregate(): Promise<string>;
  serve(collect: () => Promise<unknown[]>): void;
}

/** How long a worker's scrape waits for the group before it fails (the primary itself waits less per worker). */
const AGGREGATE_TIMEOUT_MS = 10_000;

/** The worker's side of the group's metrics; null outside a `serve --workers` group. */
export function metricsGroup(): MetricsGroup | null {
  if (workerSlot() === null || process.send === undefined) return null;
  let next = 0;
  const waiting = new Map<number, { resolve: (t: string) => void; reject: (e: Error) => void; timer: NodeJS.Timeout }>();
  let collect: (() => Promise<unknown[]>) | null = null;
  process.on('message', (m: unknown) => {
    if (!isMessage(m)) return;
    const msg = m as ToWorker;
    if (msg.fg === 'metrics-result') {
      const w = waiting.get(msg.id);
      if (w === undefined) return;
      waiting.delete(msg.id);
      clearTimeout(w.timer);
      if (msg.text === null) w.reject(new Error(`the group's metrics could not be gathered: ${msg.error ?? 'unknown'}`));
      else w.resolve(msg.text);
    } else if (msg.fg === 'collect') {
      const reply = (metrics: unknown[] | null) => send({ fg: 'collected', id: msg.id, metrics });
      if (collect === null) reply(null);
      else collect().then(reply, () => reply(null));
    }
  });
  return {
    aggregate() {
      const id = next++;
      return new Promise<string>((resolve, reject) => {
        const timer = setTimeout(() => {
          waiting.delete(id);
          reject(new Error("the group's metrics did not arrive in time"));
        }, AGGREGATE_TIMEOUT_MS);
        timer.unref();
        waiting.set(id, { resolve, reject, timer });
        send({ fg: 'metrics', id });
      });
    },
    serve(fn) {
      collect = fn;
    },
  };
}

/**
 * Wakes this worker's SQLite waiters (a serial route's request waiting for
 * its entity, a retry waiting for a record: DESIGN §3.5 e, h) on a change
 * made by another worker of the group, through the primary, instead of at
 * the store's next poll (50 ms). Only topics some other worker waits on are
 * sent, so a group without contention sends nothing. A hint only
 * (../store/notifier.ts): a relay that comes late or never costs the poll.
 * Not for PostgreSQL, whose LISTEN already reaches every process.
 */
export function relayWakeups(): void {
  if (workerSlot() === null) return;
  // Topics this process waits on (with how many notifiers wait), and those other workers wait on.
  const mine = new Map<string, number>();
  const theirs = new Set<string>();
  process.on('message', (m: unknown) => {
    if (!isMessage(m)) return;
    const msg = m as ToWorker;
    if (msg.fg === 'watched') {
      if (msg.on) theirs.add(msg.topic);
      else theirs.delete(msg.topic);
    } else if (msg.fg === 'changed') wakeFromElsewhere(msg.topic);
  });
  setNotifyRelay({
    watch(topic) {
      const n = mine.get(topic) ?? 0;
      mine.set(topic, n + 1);
      if (n === 0) send({ fg: 'watch', topic, on: true });
    },
    unwatch(topic) {
      const n = mine.get(topic) ?? 0;
      if (n <= 1) {
        mine.delete(topic);
        if (n === 1) send({ fg: 'watch', topic, on: false });
      } else mine.set(topic, n - 1);
    },
    changed(topic) {
      if (theirs.has(topic)) send({ fg: 'changed', topic });
    },
  });
}

/**
 * In a group, at the end of this worker's drain: resolves once every worker
 * has drained (the primary says so), the primary is gone, or `deadline`
 * (performance.now() ms) has passed; at once outside a group. Until then the
 * worker keeps its listener open, so a probe the primary hands to it gets
 * 503 `draining` rather than a reset while another worker still drains
 * (docs/cli.md).
 */
export function groupDrained(deadline: number): Promise<void> {
  if (workerSlot() === null || !process.connected) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(timer);
      process.off('message', onMessage);
      process.off('disconnect', done);
      resolve();
    };
    const onMessage = (m: unknown) => {
      if (isMessage(m) && (m as ToWorker).fg === 'close') done();
    };
    const timer = setTimeout(done, Math.max(0, deadline - performance.now()));
    process.on('message', onMessage);
    process.once('disconnect', done);
    send({ fg: 'drained' });
  });
}

/** Tells the primary that this worker has started (its store is open and it answers): a start-up that fails before this is not retried. */
export function signalReady(): void {
  if (workerSlot() !== null) send({ fg: 'ready' });
}

function send(m: ToPrimary): void {
  // The channel closes when the primary is gone; the worker then ends with the signal that follows.
  if (process.connected) process.send?.(m);
}

// ---------------------------------------------------------------- primary side

export interface PrimaryOptions {
  workers: number;
  logger: Logger;
  /** The script each worker runs (default: this process's own, with its arguments). */
  exec?: string;
  args?: string[];
  /** First restart delay after a worker died; doubles up to `maxRestartDelayMs`. Default 100 ms. */
  restartDelayMs?: number;
  maxRestartDelayMs?: number;
}

/** A worker that stayed up this long resets its slot's back-off. */
const STABLE_MS = 30_000;
/** How long the primary waits for each worker's metrics before using its last answer. */
const COLLECT_TIMEOUT_MS = 3_000;

interface Slot {
  index: number;
  worker: Worker | null;
  ready: boolean;
  /** Its drain is over (it waits, listening, for the group's). */
  drained: boolean;
  startedAt: number;
  /** Consecutive quick deaths: the next restart waits restartDelayMs × 2^failures. */
  failures: number;
  timer: NodeJS.Timeout | null;
}

/**
 * Runs the group and resolves with the exit code once every worker has
 * exited after a signal (0 if each drained cleanly), or once a worker's
 * start-up failed before any worker was ready (that worker's code: it has
 * printed why, as a single process would).
 */
export function runPrimary(options: PrimaryOptions): Promise<number> {
  const { logger, workers } = options;
  const baseDelay = options.restartDelayMs ?? 100;
  const maxDelay = options.maxRestartDelayMs ?? 30_000;
  cluster.setupPrimary({
    ...(options.exec !== undefined ? { exec: options.exec } : {}),
    ...(options.args !== undefined ? { args: options.args } : {}),
    // stdout comes through the primary, so that two workers' lines never
    // interleave mid-line (a pipe keeps writes whole only up to 4 KiB).
    stdio: ['ignore', 'pipe', 'inherit', 'ipc'],
  });
  const slots: Slot[] = Array.from({ length: workers }, (_, index) => ({
    index,
    worker: null,
    ready: false,
    drained: false,
    startedAt: 0,
    failures: 0,
    timer: null,
  }));
  // Once every living worker has drained, each is told to close its listener and exit: until then
  // a drained worker keeps answering probes 503 draining (./cluster.ts groupDrained).
  const closeIfDrained = () => {
    const living = slots.filter((s) => s.worker !== null);
    if (stopping === null || living.length === 0 || !living.every((s) => s.drained)) return;
    for (const s of living) if (s.worker!.isConnected()) s.worker!.send({ fg: 'close' } satisfies ToWorker);
  };
  const byWorker = new Map<Worker, Slot>();
  const metrics = createAggregator(slots);
  const wakeups = createWakeupRelay();
  let stopping: string | null = null;
  let anyReady = false;
  let exitCode = 0;
  // Each worker's stdout until it ends: the group's last lines are written before the primary exits.
  const streams = new Set<Promise<void>>();
  let finish: (code: number) => void = () => {};
  const done = new Promise<number>((resolve) => {
    let once = false;
    finish = (code) => {
      if (once) return;
      once = true;
      void Promise.all([...streams]).then(() => {
        logger.info('stopped', { workers, code });
        resolve(code);
      });
    };
  });

  const start = (slot: Slot) => {
    slot.timer = null;
    slot.ready = false;
    slot.drained = false;
    slot.startedAt = performance.now();
    const worker = cluster.fork({ [SLOT_ENV]: String(slot.index) });
    slot.worker = worker;
    byWorker.set(worker, slot);
    const relayed = relayLines(worker.process.stdout);
    streams.add(relayed);
    void relayed.then(() => streams.delete(relayed));
    worker.on('message', (m: unknown) => {
      if (!isMessage(m)) return;
      const msg = m as ToPrimary;
      if (msg.fg === 'ready') {
        slot.ready = true;
        anyReady = true;
        // A worker started during the shutdown gets it now (a signal sent before it set its handlers could have killed it undrained).
        if (stopping !== null) worker.process.kill(stopping as NodeJS.Signals);
      } else if (msg.fg === 'watch') wakeups.watch(msg.topic, worker, msg.on);
      else if (msg.fg === 'changed') wakeups.changed(worker, msg.topic);
      else if (msg.fg === 'metrics') void metrics.answer(worker, msg.id);
      else if (msg.fg === 'collected') metrics.collected(worker, msg.id, msg.metrics);
      else if (msg.fg === 'drained') {
        slot.drained = true;
        closeIfDrained();
      }
    });
    worker.once('exit', (code, signal) => {
      byWorker.delete(worker);
      slot.worker = null;
      metrics.retire(worker);
      wakeups.gone(worker);
      const fields = { worker: slot.index, pid: worker.process.pid, code, signal };
      if (stopping !== null) {
        if (code !== 0) exitCode = 1;
        logger.info('worker-stopped', fields);
        if (slots.every((s) => s.worker === null)) finish(exitCode);
        else closeIfDrained();
        return;
      }
      if (!slot.ready && !anyReady) {
        // The first start failed (a bad key file, a port in use, a store that cannot be opened):
        // every worker would fail the same way, so the group stops instead of retrying forever.
        logger.error('worker-start-failed', fields);
        stopping = 'SIGTERM';
        exitCode = code === 0 || code === null ? 1 : code;
        for (const s of slots) {
          if (s.timer !== null) clearTimeout(s.timer);
          s.timer = null;
          s.worker?.process.kill('SIGTERM');
        }
        if (slots.every((s) => s.worker === null)) finish(exitCode);
        return;
      }
      if (performance.now() - slot.startedAt > STABLE_MS) slot.failures = 0;
      const delay = Math.min(baseDelay * 2 ** slot.failures, maxDelay);
      slot.failures++;
      logger.error('worker-exited', { ...fields, restart_in_ms: delay });
      slot.timer = setTimeout(() => start(slot), delay);
    });
  };

  const forward = (signal: NodeJS.Signals) => {
    for (const s of slots) if (s.worker !== null && s.ready) s.worker.process.kill(signal);
  };
  process.on('SIGHUP', () => {
    if (stopping === null) forward('SIGHUP');
  });
  let stoppedAt = 0;
  const stop = (signal: NodeJS.Signals) => {
    if (stopping !== null) {
      // As a single process: a second signal more than a second later forces every worker out.
      if (performance.now() - stoppedAt < 1000) return;
      logger.warn('forced-exit', { signal });
      for (const s of slots) s.worker?.process.kill('SIGKILL');
      process.exit(1);
    }
    stopping = signal;
    stoppedAt = performance.now();
    logger.info('shutting-down', { signal, workers: slots.filter((s) => s.worker !== null).length });
    for (const s of slots) {
      if (s.timer !== null) clearTimeout(s.timer);
      s.timer = null;
    }
    // A worker still starting gets the signal once it is ready (above).
    forward(signal);
    if (slots.every((s) => s.worker === null)) finish(exitCode);
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));

  for (const slot of slots) start(slot);
  logger.info('workers-started', { workers, pid: process.pid });
  return done;
}

/**
 * The primary's half of `relayWakeups`: who waits on which topic, told to
 * every other worker when it changes, and each change sent to the workers
 * waiting on it.
 */
function createWakeupRelay() {
  const watchers = new Map<string, Set<Worker>>();
  const tell = (topic: string, before: Set<Worker>, after: Set<Worker>) => {
    // Each worker learns whether a worker other than itself waits.
    for (const w of Object.values(cluster.workers ?? {})) {
      if (w === undefined || !w.isConnected()) continue;
      const was = [...before].some((x) => x !== w);
      const is = [...after].some((x) => x !== w);
      if (was !== is) w.send({ fg: 'watched', topic, on: is } satisfies ToWorker);
    }
  };
  const set = (topic: string, worker: Worker, on: boolean) => {
    const before = watchers.get(topic) ?? new Set<Worker>();
    const after = new Set(before);
    if (on) after.add(worker);
    else after.delete(worker);
    if (after.size === 0) watchers.delete(topic);
    else watchers.set(topic, after);
    tell(topic, before, after);
  };
  return {
    watch: set,
    changed(from: Worker, topic: string) {
      for (const w of watchers.get(topic) ?? []) if (w !== from && w.isConnected()) w.send({ fg: 'changed', topic } satisfies ToWorker);
    },
    gone(worker: Worker) {
      for (const [topic, ws] of [...watchers]) if (ws.has(worker)) set(topic, worker, false);
    },
  };
}

/** Copies a worker's stdout to ours a whole line at a time; resolves when it ends. */
function relayLines(stream: NodeJS.ReadableStream | null): Promise<void> {
  if (stream === null) return Promise.resolve();
  let rest = '';
  stream.setEncoding('utf8');
  stream.on('data', (chunk: string) => {
    const cut = chunk.lastIndexOf('\n');
    if (cut === -1) {
      rest += chunk;
      return;
    }
    process.stdout.write(rest + chunk.slice(0, cut + 1));
    rest = chunk.slice(cut + 1);
  });
  return new Promise((resolve) => {
    const end = () => {
      if (rest !== '') process.stdout.write(`${rest}\n`);
      rest = '';
      resolve();
    };
    stream.once('end', end);
    stream.once('close', end);
  });
}

// ---------------------------------------------------------------- the group's /metrics

/**
 * The primary's half of `/metrics`: asks every worker for its metrics
 * (prom-client's `getMetricsAsJSON`) and sums them with prom-client's
 * AggregatorRegistry. The asking worker's answer comes first, so a
 * store-wide gauge (aggregator `first`, ../http/metrics-node.ts) is the one
 * it just read. A worker that does not answer in time counts with its last
 * answer; a worker that exited leaves its last answer's counters and
 * histograms behind (`retired`), so that the group's counters never go down
 * when a worker is replaced (what it counted after its last scrape is lost).
 */
function createAggregator(slots: Slot[]) {
  let next = 0;
  const rounds = new Map<number, { pending: Set<Worker>; answers: Map<Worker, unknown[]>; settle: () => void }>();
  const last = new Map<Worker, unknown[]>();
  let retired: unknown[] | null = null;
  let aggregate: ((arrays: unknown[][]) => { getMetricsAsJSON(): Promise<unknown[]>; metrics(): Promise<string> }) | null = null;
  const load = async () => {
    if (aggregate === null) {
      const { AggregatorRegistry } = await import('prom-client');
      aggregate = (arrays) => AggregatorRegistry.aggregate(arrays as never) as never;
    }
    return aggregate;
  };
  return {
    async answer(asker: Worker, askerId: number) {
      const reply = (text: string | null, error?: string) => {
        if (asker.isConnected()) asker.send({ fg: 'metrics-result', id: askerId, text, ...(error ? { error } : {}) } satisfies ToWorker);
      };
      try {
        const agg = await load();
        const workers = slots.flatMap((s) => (s.worker !== null && s.ready && s.worker.isConnected() ? [s.worker] : []));
        const id = next++;
        const answers = new Map<Worker, unknown[]>();
        await new Promise<void>((resolve) => {
          const timer = setTimeout(settle, COLLECT_TIMEOUT_MS);
          function settle() {
            clearTimeout(timer);
            rounds.delete(id);
            resolve();
          }
          const pending = new Set(workers);
          rounds.set(id, { pending, answers, settle });
          for (const w of workers) w.send({ fg: 'collect', id } satisfies ToWorker);
          if (pending.size === 0) settle();
        });
        let missing = 0;
        const arrays: unknown[][] = [];
        // The asker first: its store-wide gauges are this scrape's.
        for (const w of [asker, ...workers.filter((w) => w !== asker)]) {
          const got = answers.get(w) ?? last.get(w);
          if (answers.get(w) === undefined) missing++;
          if (got !== undefined) arrays.push(got);
        }
        if (retired !== null) arrays.push(retired);
        const text = await agg(arrays).metrics();
        reply(`${text.trimEnd()}\n${workersGauge(workers.length - missing, missing)}`);
      } catch (err) {
        reply(null, err instanceof Error ? err.message : String(err));
      }
    },
    collected(worker: Worker, id: number, metrics: unknown[] | null) {
      if (metrics !== null) last.set(worker, metrics);
      const round = rounds.get(id);
      if (round === undefined || !round.pending.has(worker)) return;
      round.pending.delete(worker);
      if (metrics !== null) round.answers.set(worker, metrics);
      if (round.pending.size === 0) round.settle();
    },
    retire(worker: Worker) {
      for (const round of rounds.values()) {
        if (round.pending.delete(worker) && round.pending.size === 0) round.settle();
      }
      const gone = last.get(worker);
      last.delete(worker);
      if (gone === undefined) return;
      // Only what only grows: a dead process's gauges are no longer true.
      const kept = (gone as { type?: string }[]).filter((m) => m.type === 'counter' || m.type === 'histogram');
      void load().then(async (agg) => {
        retired = await agg(retired === null ? [kept] : [retired, kept]).getMetricsAsJSON();
      });
    },
  };
}

/** The one series the primary adds to a group's scrape (docs/metrics.md). */
export const WORKERS_GAUGE = 'fencegate_workers';

function workersGauge(answered: number, missing: number): string {
  return [
    `# HELP ${WORKERS_GAUGE} Worker processes of this serve --workers group: answered (their counts are in this scrape as of now) and late (counted as of their last answer).`,
    `# TYPE ${WORKERS_GAUGE} gauge`,
    `${WORKERS_GAUGE}{state="answered"} ${answered}`,
    `${WORKERS_GAUGE}{state="late"} ${missing}`,
    '',
  ].join('\n');
}
