import { getRequestListener } from '@hono/node-server';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { isDeepStrictEqual } from 'node:util';
import { ConfigError } from '../config/load.js';
import { prepareConfig } from '../config/prepare.js';
import type { Config } from '../config/schema.js';
import { createUndiciForwarder, upstreamTlsOf } from '../http/forward-undici.js';
import type { Forwarder } from '../http/forward.js';
import { createGateway, problemBaseOf, type Gateway } from '../http/gateway.js';
import { renderProblem } from '../protocol/problem.js';
import { createJsonLogger, type Logger } from '../http/logger.js';
import { createMetrics } from '../http/metrics.js';
import { createPromBackend } from '../http/metrics-node.js';
import { loadTracing } from '../observe/tracing.js';
import type { Registry } from 'prom-client';
import { drainingFinishes } from './drain-finishes.js';
import { createNodeListener } from './node-listener.js';
import { openStore } from './open-store.js';
import type { MetricsGroup } from './cluster.js';
import { SPECS } from '../http/metrics-spec.js';
import { SWEEP_KINDS, type GatewayStore } from '../store/types.js';

export { createUndiciForwarder, openStore };

export interface RunningGateway {
  /** The gateway answering new requests (another one after a reload). */
  readonly gateway: Gateway;
  server: Server;
  /** `http://host:port`, with the port actually bound. */
  url: string;
  /**
   * Validates `config` as start-up does (secrets, keys, TLS files) and, only
   * if it is valid and changes nothing that cannot change while running
   * (`listen`, `store`: RELOAD_FIXED), builds a gateway on the same store
   * and answers new requests with it; requests in flight finish on the old
   * one (docs/deploy.md §4). Throws ConfigError, and keeps the running
   * configuration, otherwise.
   */
  reload(config: Config): Promise<void>;
  /**
   * Stops taking new requests (they get 503, `<adminPrefix>/ready` 503
   * `draining`; the listener stays open for probes), finishes in-flight
   * requests and the finishes still pending, closes the store; within
   * `drainTimeout`, past which it logs each finish not written and resolves
   * without waiting further. Idempotent.
   */
  close(): Promise<void>;
}

export interface StartOptions {
  config: Config;
  logger?: Logger;
  /** Defaults to the store the config names. */
  store?: GatewayStore;
  forwarder?: Forwarder;
  env?: Record<string, string | undefined>;
  /** The prom-client Registry `/metrics` serves (default: a new one); register your own metrics in it too. */
  registry?: Registry;
  /**
   * Run the periodic sweeper and the background reconciler in this process.
   * Default true; a `serve --workers` group runs them in its worker 0 only
   * (./cluster.ts).
   */
  background?: boolean;
  /** In a `serve --workers` group: `/metrics` shows the whole group's series (./cluster.ts). */
  metricsGroup?: MetricsGroup;
  /**
   * In a `serve --workers` group: called at the end of this process's drain,
   * before the listener closes; resolves once the whole group has drained
   * (or by the drain's deadline, `performance.now()` ms), so that the
   * listener answers probes until then (./cluster.ts groupDrained).
   */
  groupDrained?: (deadline: number) => Promise<void>;
}

/** What a reload refuses to change: the socket is bound and the store open once (docs/deploy.md §4). */
export const RELOAD_FIXED = ['listen', 'store'] as const;

export function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || host === '[::1]' || /^127(\.\d{1,3}){3}$/.test(host);
}

type Listener = (req: IncomingMessage, res: ServerResponse) => void;

/** The forwarder a configuration needs: the upstream TLS settings of its routes (../http/forward-undici.ts). */
function forwarderFor(config: Config): Forwarder {
  return createUndiciForwarder({ tls: upstreamTlsOf(config) });
}

/**
 * The Node server: the gateway on `config.listen`, a periodic sweeper, and a
 * close that drains in-flight requests before the store goes away.
 *
 * The socket is bound before the store is opened: while PostgreSQL is
 * reached and its migrations run (which wait for another replica's),
 * `<adminPrefix>/health` answers 200 and `<adminPrefix>/ready` 503
 * `starting`, so that an orchestrator neither kills a process that is
 * migrating nor sends it traffic (docs/deploy.md §3). Everything that
 * can refuse the configuration is checked before either.
 */
export async function startGateway(options: StartOptions): Promise<RunningGateway> {
  const env = options.env ?? process.env;
  // Key and TLS files are read and every secret checked here, before
  // anything is opened: a refused configuration leaves no store file behind.
  let config = await prepareConfig(options.config, env);
  const logger = options.logger ?? createJsonLogger();
  // With caller auth the admin API answers on any address, behind its scopes; without it, only on loopback.
  const adminAllowed = (c: Config) => c.auth !== undefined || isLoopback(c.listen.host);
  if (!adminAllowed(config))
    logger.warn('admin-api-disabled', { reason: 'listening on a non-loopback address without caller authentication', host: config.listen.host });

  // What answers a request: nothing yet (starting), the gateway, then
  // nothing again (draining). A reload swaps the gateway; a request keeps
  // the one it started on, since its handler holds it.
  let phase: 'starting' | 'serving' | 'draining' = 'starting';
  let current: { gateway: Gateway; listener: Listener; forwarder: Forwarder; owned: boolean } | null = null;
  const adminPath = (req: IncomingMessage) => {
    const path = (req.url ?? '').split('?', 1)[0]!;
    return path.startsWith(`${config.adminPrefix}/`) ? path.slice(config.adminPrefix.length) : null;
  };
  const notServing = (req: IncomingMessage, res: ServerResponse) => {
    const admin = adminPath(req);
    const json = (status: number, body: unknown, headers: Record<string, string> = {}) => {
      res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store', ...headers });
      res.end(JSON.stringify(body));
    };
    // Liveness holds while starting and draining: the process is doing what it should.
    if (admin === '/health' && req.method === 'GET') return json(200, { status: phase });
    if (admin === '/ready' && req.method === 'GET') return json(503, { status: phase });
    // Nothing of this request was admitted or sent: a retry, here later or on another replica, is safe.
    const r = renderProblem(
      {
        code: 'store-unavailable',
        detail: phase === 'starting' ? 'the gateway is starting (opening its store); retry shortly' : 'the gateway is shutting down; retry on another replica',
      },
      problemBaseOf(config),
    );
    res.shouldKeepAlive = false;
    res.writeHead(r.status, { ...r.headers, 'retry-after': '1' });
    res.end(r.body);
  };
  const server = createServer((req, res) => {
    if (phase === 'serving' && current !== null) current.listener(req, res);
    else if (phase === 'draining' && current !== null && adminPath(req) === '/health') current.listener(req, res);
    else notServing(req, res);
  });
  // Slow-body and slow-header clients are cut off instead of holding sockets.
  server.requestTimeout = 60_000;
  server.headersTimeout = 20_000;
  // A client's FIN ends what it sends, not what it reads: a client that
  // half-closes after its request (nc, shutdown(SHUT_WR)) gets its answer,
  // and the connection closes once that is written. Node's default ends
  // our side at the FIN, so the answer of a forwarded, executed request was
  // lost. A caller that has really gone still does not cancel the upstream
  // call (DESIGN §3.6); its socket errors when the answer is written.
  // `httpAllowHalfOpen` is in Node's http server but not in its typings;
  // test/gateway/node-listener.slow.test.ts fails if it stops working.
  (server as Server & { httpAllowHalfOpen: boolean }).httpAllowHalfOpen = true;
  // Without a cap, every connection a client opens costs a socket, a file
  // descriptor and its buffers until a timeout: enough of them exhaust the
  // descriptor limit, and then the store and the upstream cannot open theirs.
  // Past the cap Node closes a new connection at once, before reading any of
  // it: nothing is admitted or forwarded, so the client's retry is safe.
  server.maxConnections = config.maxConnections;
  let dropped = 0;
  let dropLogged = -Infinity;
  server.on('drop', () => {
    dropped++;
    // One line per 10 s at most: a flood of connections must not become a flood of log lines.
    if (performance.now() - dropLogged < 10_000) return;
    dropLogged = performance.now();
    logger.warn('connections-dropped', { max_connections: config.maxConnections, dropped });
    dropped = 0;
  });
  // Responses not yet fully written, so that a shutdown lets them finish.
  const responding = new Set<ServerResponse>();
  let shutdown: Promise<void> | null = null;
  server.on('request', (_req, res: ServerResponse) => {
    // Once closing, every answer says Connection: close, so that no caller
    // sends its next request on a connection about to be cut.
    if (shutdown !== null) res.shouldKeepAlive = false;
    responding.add(res);
    res.once('close', () => responding.delete(res));
    // Once the whole answer is handed to the socket: a client that stops taking it is cut off.
    // (A streamed answer is bounded by what may wait for its caller, ../http/mcp/stream.ts CallerStream.)
    res.once('prefinish', () => cutOffStalled(res, config.writeStallTimeout));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(config.listen.port, config.listen.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;
  const host = config.listen.host.includes(':') && !config.listen.host.startsWith('[') ? `[${config.listen.host}]` : config.listen.host;
  const url = `http://${host}:${port}`;

  // A failed start (a store that cannot be opened, a credential refused)
  // must not leave the socket, the database file or the upstream pool open
  // behind the error.
  let store: GatewayStore;
  try {
    store = options.store ?? (await openStore(config.store, { logger }));
  } catch (err) {
    await new Promise<void>((resolve) => server.close(() => resolve()));
    throw err;
  }
  // A PostgreSQL store's notices: whether a failover would keep acknowledged
  // decisions (DESIGN §8.2; docs/deploy-postgres.md), logged at start and on
  // each change, and what its pooler setting costs (no LISTEN).
  const pgStore = store as { subscribe?: (fn: (l: { level: 'info' | 'warn'; msg: string; fields: Record<string, unknown> }) => void) => () => void };
  const unsubscribeStore = pgStore.subscribe?.((l) => logger[l.level](l.msg, l.fields));
  // A shutdown's finishes are retried until they land or the drain's time is up (./drain-finishes.ts).
  const finishes = drainingFinishes(store, logger);
  // prom-client on Node (one registry, with the process metrics); the same names as the text backend.
  // One backend for the process: a reload's gateway counts into the same series.
  const group = options.metricsGroup;
  const metricsBackend = createPromBackend({
    ...(options.registry ? { registry: options.registry } : {}),
    // In a group, the worker that is scraped sets its gauges as always, then serves the group's sum.
    ...(group ? { render: () => group.aggregate() } : {}),
  });
  // Asked by the group for this worker's series: its per-process gauges
  // first (what a scrape of this worker would set; the store-wide ones come
  // from the scraped worker).
  group?.serve(async () => {
    metricsBackend.metric(SPECS.inflight).set([], current?.gateway.inflight() ?? 0);
    const pool = (store as { pool?: { totalCount?: unknown; idleCount?: unknown; waitingCount?: unknown } }).pool;
    if (typeof pool?.waitingCount === 'number') {
      const series = metricsBackend.metric(SPECS.pool);
      series.set(['total'], Number(pool.totalCount));
      series.set(['idle'], Number(pool.idleCount));
      series.set(['waiting'], pool.waitingCount);
    }
    return metricsBackend.registry.getMetricsAsJSON();
  });
  const build = (c: Config, reuse: Forwarder | null) => {
    const forwarder = reuse ?? options.forwarder ?? forwarderFor(c);
    try {
      const metrics = createMetrics({
        backend: metricsBackend,
        routes: c.routes.map((r) => r.name),
        reconcileRoutes: c.routes.filter((r) => r.reconcile !== undefined).map((r) => r.name),
      });
      const gateway = createGateway({ config: c, store: finishes.store, forwarder, logger, admin: adminAllowed(c), env, metrics });
      // Proxied requests skip Hono's Request/Response (./node-listener.ts); the rest is the Hono app.
      const listener = createNodeListener(gateway, getRequestListener(gateway.app.fetch));
      return { gateway, listener, forwarder, owned: reuse === null && options.forwarder === undefined };
    } catch (err) {
      if (reuse === null && options.forwarder === undefined) void forwarder.close?.();
      throw err;
    }
  };
  try {
    // Spans from the first request when @opentelemetry/api is installed.
    await loadTracing();
    current = build(config, null);
  } catch (err) {
    await new Promise<void>((resolve) => server.close(() => resolve()));
    unsubscribeStore?.();
    if (options.store === undefined) await store.close();
    throw err;
  }
  phase = 'serving';

  const background = options.background ?? true;
  const sweep = () => {
    if (!background) return undefined;
    return setInterval(() => {
      current!.gateway.sweep().then(
        (r) => {
          const behind = Object.values(r.backlog).some((n) => n > 0);
          const { backlog, ...counts } = r;
          // The sweeper fell behind (its time budget ran out): rows past their
          // retention are left for the next sweep; fencegate_sweep_backlog_rows says how many.
          if (behind) logger.warn('sweep-behind', { ...counts, backlog });
          else if (SWEEP_KINDS.some((k) => r[k] > 0)) logger.info('sweep', counts);
          else logger.debug?.('sweep', counts);
        },
        (err) => logger.error('sweep-failed', { error: String(err) }),
      );
    }, config.sweepInterval).unref();
  };
  let sweeper = sweep();
  // The background reconciler (../http/reconciler.ts), only with a route that has `reconcile`:
  // a pass as often as the shortest interval asks; each record's own back-off decides whether it is due.
  const reconcileEvery = () => {
    // Routes with `asyncReply` poll their pending Locations in the same pass (../http/async-poller.ts).
    const intervals = config.routes.flatMap((r) => [
      ...(r.reconcile === undefined ? [] : [r.reconcile.interval]),
      ...(r.asyncReply === undefined ? [] : [r.asyncReply.interval]),
    ]);
    if (intervals.length === 0 || !background) return null;
    return setInterval(
      () => {
        current!.gateway.reconcile().then(
          (r) => {
            if (Object.keys(r.asked).length > 0 || r.gaveUp > 0 || r.polled !== undefined || r.markedDead !== undefined)
              logger.info('reconcile-pass', {
                seen: r.seen,
                gave_up: r.gaveUp,
                ...r.asked,
                ...(r.polled !== undefined ? { polled: r.polled } : {}),
                ...(r.markedDead !== undefined ? { marked_dead: r.markedDead } : {}),
              });
            else logger.debug?.('reconcile-pass', { seen: r.seen, gave_up: r.gaveUp });
          },
          (err) => logger.error('reconcile-failed', { error: String(err) }),
        );
      },
      Math.min(...intervals),
    ).unref();
  };
  let reconciler = reconcileEvery();

  // Gateways replaced by a reload, until their requests are done.
  const retired = new Set<Promise<void>>();
  const retire = (old: NonNullable<typeof current>) => {
    const done = (async () => {
      // Its background reconcile pass acts under the old config (a route
      // whose reconcile the reload removed or changed): stopped now, and
      // waited for, before anything of the old gateway is closed.
      await old.gateway.stopBackground();
      // The old gateway's in-flight requests finish on it; its own close()
      // would also close the shared store, so only its forwarder is closed.
      while (old.gateway.inflight() > 0) await new Promise((r) => setTimeout(r, 50));
      if (old.owned && old.forwarder !== current?.forwarder) await old.forwarder.close?.();
    })();
    retired.add(done);
    void done.finally(() => retired.delete(done));
  };

  return {
    get gateway() {
      return current!.gateway;
    },
    server,
    url,
    async reload(input) {
      if (phase !== 'serving') throw new ConfigError('not reloaded: the gateway is shutting down', []);
      const next = await prepareConfig(input, env);
      // The drain may have begun while the files were read: it closes the gateway it saw, so none may replace it now.
      if ((phase as string) !== 'serving') throw new ConfigError('not reloaded: the gateway is shutting down', []);
      const fixed = RELOAD_FIXED.filter((k) => !isDeepStrictEqual(next[k], config[k]));
      if (fixed.length > 0) {
        const lines = fixed.map((k) => `${k}: cannot change on reload (restart the process to change it)`);
        throw new ConfigError(`invalid configuration:\n  ${lines.join('\n  ')}`, lines);
      }
      // The upstream pool is kept unless the TLS settings it was made with changed.
      const sameTls = isDeepStrictEqual(upstreamTlsOf(next), upstreamTlsOf(config));
      const old = current!;
      current = build(next, sameTls ? old.forwarder : null);
      if (sameTls) current.owned = old.owned;
      config = next;
      server.maxConnections = config.maxConnections;
      clearInterval(sweeper);
      sweeper = sweep();
      if (reconciler !== null) clearInterval(reconciler);
      reconciler = reconcileEvery();
      retire(old);
    },
    close() {
      shutdown ??= (async () => {
        // The listener stays open: a probe gets `ready` 503 `draining`, a
        // new request 503 (nothing of it admitted), instead of a refused
        // connection that a balancer reads as a dead process.
        phase = 'draining';
        // No status query starts once the drain has (close() waits for the running ones).
        void current!.gateway.stopBackground();
        // One bound for the whole drain: a store that never answers (a silent
        // network) must not keep the process from exiting.
        const deadline = performance.now() + config.drainTimeout;
        finishes.drain(deadline);
        for (const res of responding) if (!res.headersSent) res.shouldKeepAlive = false;
        clearInterval(sweeper);
        if (reconciler !== null) clearInterval(reconciler);
        unsubscribeStore?.();
        server.closeIdleConnections();
        const gateway = current!.gateway;
        const closing = Promise.all([...retired]).then(() => gateway.close());
        if (await within(closing, deadline))
          await closing; // its fault, if any, is close()'s
        else {
          const unwritten = finishes.abandon('drain-timeout');
          logger.error('drain-timeout', { drain_timeout_ms: config.drainTimeout, inflight: gateway.inflight(), unwritten_finishes: unwritten });
        }
        // The handlers are done, but a large answer may still be on its way
        // to the caller: cutting the connections now would truncate it
        // (the upstream call happened; the caller must get its answer).
        await written(responding, Math.min(SHUTDOWN_WRITE_MS, Math.max(deadline - performance.now(), 0)));
        await options.groupDrained?.(deadline);
        const closed = new Promise<void>((resolve) => server.close(() => resolve()));
        server.closeAllConnections();
        await closed;
      })();
      return shutdown;
    },
  };
}

/**
 * Destroys the connection of an answer that makes no progress to the client
 * for `stallMs` (`writeStallTimeout`): checked every `stallMs`, a stall is
 * bytes queued in the socket at this check and the one before with none of
 * them taken by the client in between. Taken, not what is left queued: a
 * buffered answer is one write, whose queued length stays whole until the
 * client has taken all of it, so a client reading a large answer slowly
 * was cut off at the first check as if it read nothing. Node times a
 * connection out while its request comes in (requestTimeout, headersTimeout)
 * and while it is idle between requests (keepAliveTimeout), never while an
 * answer waits for a client that does not read (the FIN of a half-closing
 * one included: it ends what the client sends, not what it reads). The
 * answer is lost to that client only; its outcome is stored, so a retry with
 * its key gets the replay (DESIGN §3.6). A client that reads, however
 * slowly, keeps it: every interval it takes some more.
 */
function cutOffStalled(res: ServerResponse, stallMs: number): void {
  const socket = res.socket;
  if (socket === null || res.writableFinished) return;
  // Taken: the writes completed (bytesWritten counts the queued bytes too),
  // and within the write under way what the kernel accepted of it: a large
  // chunk (a whole buffered answer is one) completes only once all of it is
  // taken, so its progress shows only in the handle's write queue (libuv's
  // writeQueueSize, internal to Node; without it, completed writes only).
  const handle = (socket as { _handle?: { writeQueueSize?: unknown } | null })._handle;
  const completed = () => socket.bytesWritten - socket.writableLength;
  const inQueue = () => (typeof handle?.writeQueueSize === 'number' ? handle.writeQueueSize : 0);
  let queued = socket.writableLength > 0;
  let done = completed();
  let left = inQueue();
  const timer = setInterval(() => {
    const nowDone = completed();
    const nowLeft = inQueue();
    const pending = socket.writableLength > 0;
    if (pending && queued && nowDone === done && nowLeft >= left) {
      clearInterval(timer);
      socket.destroy();
    }
    queued = pending;
    done = nowDone;
    left = nowLeft;
  }, stallMs);
  timer.unref();
  const stop = () => clearInterval(timer);
  res.once('finish', stop);
  res.once('close', stop);
}

/** How long a shutdown waits for answers still being written (a slow reader must not hold it forever). */
const SHUTDOWN_WRITE_MS = 30_000;

/** True once `work` settled (a rejection included), false if `deadline` (performance.now() time) came first. */
function within(work: Promise<unknown>, deadline: number): Promise<boolean> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), Math.max(deadline - performance.now(), 0));
    const done = () => {
      clearTimeout(timer);
      resolve(true);
    };
    work.then(done, done);
  });
}

/** Resolves when every response in `responding` has closed, or after `maxMs`. */
function written(responding: Set<ServerResponse>, maxMs: number): Promise<void> {
  if (responding.size === 0) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, maxMs);
    timer.unref();
    let left = responding.size;
    for (const res of responding) {
      res.once('close', () => {
        if (--left === 0) {
          clearTimeout(timer);
          resolve();
        }
      });
    }
  });
}
