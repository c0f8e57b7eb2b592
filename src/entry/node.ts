import { getRequestListener } from '@hono/node-server';
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { inlineKeyFiles } from '../config/key-files.js';
import type { Config } from '../config/schema.js';
import { createUndiciForwarder } from '../http/forward-undici.js';
import type { Forwarder } from '../http/forward.js';
import { createGateway, type Gateway } from '../http/gateway.js';
import { createJsonLogger, type Logger } from '../http/logger.js';
import { createMetrics } from '../http/metrics.js';
import { createPromBackend } from '../http/metrics-node.js';
import { loadTracing } from '../observe/tracing.js';
import type { Registry } from 'prom-client';
import { drainingFinishes } from './drain-finishes.js';
import { createNodeListener } from './node-listener.js';
import { openStore } from './open-store.js';
import { SWEEP_KINDS, type GatewayStore } from '../store/types.js';

export { createUndiciForwarder, openStore };

export interface RunningGateway {
  gateway: Gateway;
  server: Server;
  /** `http://host:port`, with the port actually bound. */
  url: string;
  /**
   * Stops accepting, finishes in-flight requests and the finishes still
   * pending, closes the store; within `drainTimeout`, past which it logs each
   * finish not written and resolves without waiting further. Idempotent.
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
}

export function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || host === '[::1]' || /^127(\.\d{1,3}){3}$/.test(host);
}

/**
 * The Node server: the gateway on `config.listen`, a periodic sweeper, and a
 * close that drains in-flight requests before the store goes away.
 */
export async function startGateway(options: StartOptions): Promise<RunningGateway> {
  // Key files (auth, fence.signed) are read here, before anything is opened.
  const config = inlineKeyFiles(options.config);
  const logger = options.logger ?? createJsonLogger();
  const store = options.store ?? (await openStore(config.store, { logger }));
  // A PostgreSQL store's notices: whether a failover would keep acknowledged
  // decisions (DESIGN §8.2; docs/deploy-postgres.md), logged at start and on
  // each change, and what its pooler setting costs (no LISTEN).
  const pgStore = store as { subscribe?: (fn: (l: { level: 'info' | 'warn'; msg: string; fields: Record<string, unknown> }) => void) => () => void };
  const unsubscribeStore = pgStore.subscribe?.((l) => logger[l.level](l.msg, l.fields));
  // With caller auth the admin API answers on any address, behind its scopes; without it, only on loopback.
  const admin = config.auth !== undefined || isLoopback(config.listen.host);
  if (!admin) logger.warn('admin-api-disabled', { reason: 'listening on a non-loopback address without caller authentication', host: config.listen.host });

  // A failed start (a missing credential, a port in use) must not leave the
  // database file and the upstream pool open behind the error.
  const forwarder = options.forwarder ?? createUndiciForwarder();
  // A shutdown's finishes are retried until they land or the drain's time is up (./drain-finishes.ts).
  const finishes = drainingFinishes(store, logger);
  let gateway: Gateway;
  try {
    // prom-client on Node (one registry, with the process metrics); the same names as the text backend.
    const metrics = createMetrics({ backend: createPromBackend(options.registry ? { registry: options.registry } : {}), routes: config.routes.map((r) => r.name), reconcileRoutes: config.routes.filter((r) => r.reconcile !== undefined).map((r) => r.name) });
    // Spans from the first request when @opentelemetry/api is installed.
    await loadTracing();
    gateway = createGateway({ config, store: finishes.store, forwarder, logger, admin, env: options.env, metrics });
  } catch (err) {
    if (options.forwarder === undefined) await forwarder.close?.();
    if (options.store === undefined) await store.close();
    throw err;
  }
  // Proxied requests skip Hono's Request/Response (./node-listener.ts); the rest is the Hono app.
  const server = createServer(createNodeListener(gateway, getRequestListener(gateway.app.fetch)));
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
  // test/gateway/node-listener.test.ts fails if it stops working.
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
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(config.listen.port, config.listen.host, () => {
        server.off('error', reject);
        resolve();
      });
    });
  } catch (err) {
    await gateway.close(); // as close() would: the forwarder and the store
    throw err;
  }
  const { port } = server.address() as AddressInfo;
  const host = config.listen.host.includes(':') && !config.listen.host.startsWith('[') ? `[${config.listen.host}]` : config.listen.host;
  const url = `http://${host}:${port}`;

  const sweeper = setInterval(() => {
    gateway.sweep().then(
      (r) => {
        const behind = Object.values(r.backlog).some((n) => n > 0);
        const { backlog, ...counts } = r;
        // The sweeper fell behind (its time budget ran out): rows past their
        // retention are left for the next sweep; fencegate_sweep_backlog_rows says how many.
        if (behind) logger.warn('sweep-behind', { ...counts, backlog });
        else if (SWEEP_KINDS.some((k) => r[k] > 0)) logger.info('sweep', counts);
      },
      (err) => logger.error('sweep-failed', { error: String(err) }),
    );
  }, config.sweepInterval);
  sweeper.unref();
  // The background reconciler (../http/reconciler.ts), only with a route that has `reconcile`:
  // a pass as often as the shortest interval asks; each record's own back-off decides whether it is due.
  const intervals = config.routes.flatMap((r) => (r.reconcile === undefined ? [] : [r.reconcile.interval]));
  const reconciler =
    intervals.length === 0
      ? null
      : setInterval(() => {
          gateway.reconcile().then(
            (r) => {
              if (Object.keys(r.asked).length > 0 || r.gaveUp > 0) logger.info('reconcile-pass', { seen: r.seen, gave_up: r.gaveUp, ...r.asked });
            },
            (err) => logger.error('reconcile-failed', { error: String(err) }),
          );
        }, Math.min(...intervals));
  reconciler?.unref();

  return {
    gateway,
    server,
    url,
    close() {
      shutdown ??= (async () => {
        // One bound for the whole drain: a store that never answers (a silent
        // network) must not keep the process from exiting.
        const deadline = performance.now() + config.drainTimeout;
        finishes.drain(deadline);
        for (const res of responding) if (!res.headersSent) res.shouldKeepAlive = false;
        clearInterval(sweeper);
        if (reconciler !== null) clearInterval(reconciler);
        unsubscribeStore?.();
        const closed = new Promise<void>((resolve) => server.close(() => resolve()));
        server.closeIdleConnections();
        const closing = gateway.close();
        if (await within(closing, deadline)) await closing; // its fault, if any, is close()'s
        else {
          const unwritten = finishes.abandon('drain-timeout');
          logger.error('drain-timeout', { drain_timeout_ms: config.drainTimeout, inflight: gateway.inflight(), unwritten_finishes: unwritten });
        }
        // The handlers are done, but a large answer may still be on its way
        // to the caller: cutting the connections now would truncate it
        // (the upstream call happened; the caller must get its answer).
        await written(responding, Math.min(SHUTDOWN_WRITE_MS, Math.max(deadline - performance.now(), 0)));
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
