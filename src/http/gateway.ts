import { Hono, type Context } from 'hono';
import type { Config } from '../config/schema.js';
import { ConfigError } from '../config/load.js';
import { renderProblem } from '../protocol/problem.js';
import { SWEEP_TIME_BUDGET_MS } from '../store/sweep.js';
import type { GatewayStore, SweepResult } from '../store/types.js';
import { createAdminApp } from './admin.js';
import { toReply } from './errors.js';
import type { Forwarder } from './forward.js';
import type { IncomingLike, Inbound, Reply } from './inbound.js';
import { errorText, silentLogger, type Logger } from './logger.js';
import { createMetrics, type Metrics } from './metrics.js';
import { credentialHashKeyOf } from './key-scope.js';
import { createPipeline } from './pipeline/index.js';
import { createReconcileQuery } from './pipeline/reconcile.js';
import { createAsyncPoller } from './async-poller.js';
import { createAsyncPoll } from './pipeline/async-reply.js';
import { createBackgroundReconciler, deadAttemptsDue, resolveReconcileHeaders, type ReconcilePass } from './reconciler.js';
import { isMetadataPath, metadataPathOf } from './pipeline/route.js';
import { resourceMetadataDocument } from '../protocol/resource-metadata.js';
import { createSecurity } from './security.js';
import { timeStore } from './store-timing.js';
import { loadTracing } from '../observe/tracing.js';

export interface GatewayOptions {
  config: Config;
  store: GatewayStore;
  forwarder: Forwarder;
  /** Where `upstreamHeaders: { env }` secrets are read from. Default `process.env` (on Node). */
  env?: Record<string, string | undefined>;
  logger?: Logger;
  /** Serve the `/v1` admin API. Default true; the Node entry turns it off on non-loopback listeners unless `auth` is configured. */
  admin?: boolean;
  /** Where the metrics go. Default: the text backend (no dependency); the Node entry passes prom-client's (./metrics-node.ts). */
  metrics?: Metrics;
}

export interface Gateway {
  app: Hono;
  store: GatewayStore;
  config: Config;
  /**
   * The proxied-request path without Hono's Request/Response, for a server
   * that parses HTTP itself (the Node entry): the same decisions (caller
   * auth included), counted as in flight, a throw answered 500 as `app`
   * answers it. Paths under `adminPrefix` (./pipeline/route.ts isAdminPath)
   * belong to `app`.
   */
  direct: (request: Inbound) => Promise<Reply>;
  /** Requests being handled right now. */
  inflight(): number;
  /**
   * Deletes expired records, old rejections, forgotten entities and their
   * history, old operator actions; marks dead in_progress records
   * outcome_unknown. In batches until caught up, within a time budget (see
   * `sweepBudgetMs`); the result and the backlog left go to `/metrics`. A call
   * while a sweep runs joins that sweep.
   */
  sweep(): Promise<SweepResult>;
  /**
   * One background reconcile pass (./reconciler.ts, DESIGN §3.12): asks the
   * upstream about the outcome_unknown records of routes with `reconcile`
   * that are due. Nothing to do without such a route. A call while a pass
   * runs joins that pass.
   */
  reconcile(): Promise<ReconcilePass>;
  /**
   * Stops the background work that would act under this gateway's config
   * (the reconcile pass: no new status query, the running ones end) and
   * resolves when it has: a reload retires the old gateway with it, and a
   * drain begins with it, before in-flight requests are waited for.
   */
  stopBackground(): Promise<void>;
  /** Waits for in-flight requests, then closes the forwarder and the store. Idempotent. */
  close(): Promise<void>;
}

/**
 * Builds the gateway: one Hono app whose admin API lives under
 * `adminPrefix` and whose every other path goes through the fenced proxy.
 * Validates what it can at start-up (upstream credentials present).
 * `app.fetch` serves everything on any runtime; `startGateway` (the Node
 * entry) also serves proxied requests through `direct`, without Hono's
 * Request/Response.
 *
 * @example
 * const gateway = createGateway({ config, store: createSqliteStore({ path: 'fg.db' }), forwarder: createUndiciForwarder() });
 * serve({ fetch: gateway.app.fetch, port: 8080 });
 */
export function createGateway(options: GatewayOptions): Gateway {
  const { config, store, forwarder } = options;
  const logger = options.logger ?? silentLogger;
  const problemBase = problemBaseOf(config);
  const env = options.env ?? (globalThis as any).process?.env ?? {};
  const upstreamHeaders = resolveUpstreamHeaders(config, env);
  const credentialHashKey = credentialHashKeyOf(config, env);
  const reconcileHeaders = resolveReconcileHeaders(config, env);
  const reconcileRoutes = config.routes.filter((r) => r.reconcile !== undefined).map((r) => r.name);
  const metrics = options.metrics ?? createMetrics({ routes: config.routes.map((r) => r.name), reconcileRoutes });
  store.observeGroups?.((size, syncMs) => metrics.storeGroup(size, syncMs));
  // Spans only once @opentelemetry/api has loaded (if it is installed); startGateway waits for it.
  void loadTracing();
  // Caller auth (stage 2) and signed fences (stage 5), when configured.
  const { auth, checkSignedFence } = createSecurity({ config, store, logger, problemBase, env });
  // Callers are told apart, but an unsigned fence is a number any of them
  // may send: one with the proxy scope sends 9223372036854775807 for another
  // caller's entity and locks it for good (DESIGN §2 G1 trusts the fence).
  if (auth !== null && config.fence.signed === undefined && config.fence.entityScope === 'global' && config.routes.some((r) => r.fence !== 'off')) {
    logger.warn('unsigned-fences', {
      reason:
        'auth is on but fences are unsigned: any caller with fencegate:proxy can lock any entity with a giant fence; configure fence.signed, or fence.entityScope "caller"',
    });
  }

  // The status query (DESIGN §3.12), only when a route has `reconcile`: otherwise nothing changes.
  const reconcileQuery =
    reconcileRoutes.length === 0
      ? undefined
      : createReconcileQuery({ store, forwarder, logger, headers: reconcileHeaders, counted: (route, result) => metrics.reconciled(route, result) });
  const backgroundPass =
    reconcileQuery === undefined
      ? null
      : createBackgroundReconciler({ routes: config.routes, store, query: reconcileQuery, logger, gauges: (p) => metrics.reconcilePass(p) });
  // Async replies (DESIGN §3.12 "Async replies"), only when a route has `asyncReply`.
  const asyncPoll = config.routes.some((r) => r.asyncReply !== undefined) ? createAsyncPoll({ store, forwarder, logger, upstreamHeaders }) : undefined;
  const asyncPoller = asyncPoll === undefined ? null : createAsyncPoller({ routes: config.routes, store, poll: asyncPoll, logger });

  // Aborted when the gateway closes: the MCP tasks it follows end there, recorded unknown with their handle (./mcp/tasks.ts).
  const closingSignal = new AbortController();
  const proxy = createPipeline({
    closing: closingSignal.signal,
    config,
    store: timeStore(store, metrics),
    forwarder,
    logger,
    problemBase,
    upstreamHeaders,
    // The caller's Authorization authenticates it to the gateway, never to the upstream.
    verify: auth?.verify ?? null,
    credentialHashing: { auth: auth !== null, key: credentialHashKey },
    ...(checkSignedFence ? { checkSignedFence } : {}),
    observe: metrics.observe,
    ...(reconcileQuery ? { reconcileQuery } : {}),
    ...(asyncPoll ? { asyncPoll } : {}),
  });

  let active = 0;
  let drained: (() => void) | null = null;
  const app = new Hono();
  const renderMetrics = async () => {
    // A PostgreSQL store's pool (pg.Pool counts), read as it is (no store code involved), and
    // before the stats query, which itself may wait for a client of that pool.
    const pool = (store as { pool?: { totalCount?: unknown; idleCount?: unknown; waitingCount?: unknown } }).pool;
    const counts =
      typeof pool?.waitingCount === 'number' ? { total: Number(pool.totalCount), idle: Number(pool.idleCount), waiting: pool.waitingCount } : undefined;
    // A PostgreSQL store's replication check (its last reading; no round trip here).
    const asyncReplication = (store as { replication?: { gauge?: unknown } | null }).replication?.gauge;
    const stats = await store.auditStats().catch(() => null);
    return metrics.render({
      inflight: active,
      stats,
      ...(counts ? { pool: counts } : {}),
      ...(typeof asyncReplication === 'number' ? { asyncReplication } : {}),
    });
  };
  app.route(
    config.adminPrefix,
    createAdminApp({
      store,
      problemBase,
      enabled: options.admin ?? true,
      routes: config.routes,
      ...(auth ? { guard: auth.admin } : {}),
      ...(config.metrics.enabled ? { metrics: { render: renderMetrics, public: config.metrics.public, ...(auth ? { guard: auth.metrics } : {}) } } : {}),
    }),
  );
  const counted = async (request: Inbound): Promise<Reply> => {
    active++;
    let reply: Reply | undefined;
    try {
      return (reply = await proxy(request));
    } finally {
      const release = () => void (--active === 0 && drained?.());
      if (reply?.settled) reply.settled.then(release, release);
      else release();
    }
  };
  const internalError = (pathname: string, err: unknown): Reply => {
    logger.error('internal-error', { path: pathname, error: errorText(err) });
    return toReply(renderProblem({ code: 'internal-error', detail: 'the gateway failed to handle this request' }, problemBase));
  };
  const handle = async (c: Context) => {
    const req = c.req.raw;
    const url = new URL(req.url);
    const incoming = nodeIncoming(c);
    const reply = await counted({
      method: req.method,
      pathname: url.pathname,
      search: url.search,
      headers: req.headers,
      get body() {
        return req.body;
      },
      ...(incoming ? { incoming } : {}),
      get signal() {
        return req.signal;
      },
    });
    return webResponse(reply);
  };
  // With auth.resource: the protected resource metadata (RFC 9728), at the one path isAdminPath keeps from the proxy.
  const metadataPath = metadataPathOf(config);
  if (metadataPath !== null && config.auth?.resource !== undefined) {
    const document = JSON.stringify(
      resourceMetadataDocument({
        resource: config.auth.resource,
        authorizationServers: config.auth.authorizationServers ?? [],
        resourceName: config.auth.resourceName,
      }),
    );
    // Public, and read by browser-based clients from another origin: any origin may read it (it holds nothing secret).
    const cors = { 'access-control-allow-origin': '*' };
    app.all('*', (c, next) => {
      if (!isMetadataPath(new URL(c.req.url).pathname, metadataPath)) return next();
      const method = c.req.method;
      if (method === 'GET' || method === 'HEAD')
        return c.body(document, 200, { ...cors, 'content-type': 'application/json', 'cache-control': 'public, max-age=300' });
      // A preflight for the MCP-Protocol-Version header clients send with it (MCP 2025-06-18 "Protocol Version Header").
      if (method === 'OPTIONS')
        return c.body(null, 204, {
          ...cors,
          'access-control-allow-methods': 'GET, HEAD',
          'access-control-allow-headers': 'mcp-protocol-version',
          'access-control-max-age': '86400',
        });
      return c.body(null, 405, { allow: 'GET, HEAD, OPTIONS' });
    });
  }
  app.all('*', handle);
  app.onError((err, c) => webResponse(internalError(new URL(c.req.url).pathname, err)));

  const sweepOptions = {
    rejectionRetentionMs: config.rejectionRetention,
    entityRetentionMs: config.entityRetention,
    operatorActionRetentionMs: config.operatorActionRetention,
    commandRetentionMs: config.commandRetention,
    timeBudgetMs: sweepBudgetMs(config.sweepInterval),
  };
  let sweeping: Promise<SweepResult> | null = null;
  const sweep = (): Promise<SweepResult> =>
    (sweeping ??= (async () => {
      const started = Date.now();
      try {
        const r = await store.sweep(sweepOptions);
        metrics.swept(r, Date.now() - started);
        return r;
      } catch (err) {
        metrics.sweepFailed();
        throw err;
      } finally {
        sweeping = null;
      }
    })());

  let reconciling: Promise<ReconcilePass> | null = null;
  const reconcile = (): Promise<ReconcilePass> =>
    backgroundPass === null && asyncPoller === null
      ? Promise.resolve({ seen: 0, asked: {}, gaveUp: 0 })
      : (reconciling ??= (async (): Promise<ReconcilePass> => {
          // Attempts left in progress by a gateway that died or a drain that could not write their finish
          // are marked outcome_unknown first, by the store's clock (./reconciler.ts deadAttemptsDue).
          let markedDead: number | undefined;
          if (await deadAttemptsDue(store, config.routes)) markedDead = (await sweep()).unknownRecords;
          const r: ReconcilePass = backgroundPass === null ? { seen: 0, asked: {}, gaveUp: 0 } : await backgroundPass.pass();
          if (markedDead !== undefined) r.markedDead = markedDead;
          if (asyncPoller !== null) {
            const a = await asyncPoller.pass();
            r.seen += a.seen;
            r.gaveUp += a.gaveUp;
            if (Object.keys(a.polled).length > 0) r.polled = a.polled as Record<string, number>;
          }
          return r;
        })().finally(() => {
          reconciling = null;
        }));

  const stopBackground = async (): Promise<void> => {
    // A background reconcile pass uses the forwarder, the store and this config: no new query, and the running ones end first.
    backgroundPass?.stop();
    asyncPoller?.stop();
    await reconciling?.catch(() => {});
  };

  let closing: Promise<void> | null = null;
  return {
    app,
    store,
    config,
    direct: (request) => counted(request).catch((err) => internalError(request.pathname, err)),
    inflight: () => active,
    sweep,
    reconcile,
    stopBackground,
    close() {
      closing ??= (async () => {
        // Stopped first: a pass must not go on asking (and releasing) for the whole drain.
        const stopped = stopBackground();
        closingSignal.abort();
        if (active > 0) await new Promise<void>((resolve) => (drained = resolve));
        await stopped;
        await forwarder.close?.();
        await store.close();
      })();
      return closing;
    },
  };
}

/** Base of problem `type` URIs: `problemTypeBase`, or the descriptions the admin API serves. */
export function problemBaseOf(config: Config): string {
  return config.problemTypeBase ?? `${config.adminPrefix}/problems/`;
}

/**
 * One sweep's time budget: half the interval, so that a sweep is done before
 * the next one is due, and at most SWEEP_TIME_BUDGET_MS (10 s), so that a
 * deep backlog is worked off over several sweeps rather than in one long run.
 */
export function sweepBudgetMs(sweepIntervalMs: number): number {
  return Math.min(Math.max(1, Math.floor(sweepIntervalMs / 2)), SWEEP_TIME_BUDGET_MS);
}

/** Reads `upstreamHeaders` secrets once; a missing variable stops start-up naming the field. */
function resolveUpstreamHeaders(config: Config, env: Record<string, string | undefined>): Map<string, Record<string, string>> {
  const out = new Map<string, Record<string, string>>();
  const missing: string[] = [];
  config.routes.forEach((route, i) => {
    const headers: Record<string, string> = {};
    for (const [name, spec] of Object.entries(route.upstreamHeaders)) {
      if (typeof spec === 'string') {
        headers[name] = spec;
        continue;
      }
      const value = env[spec.env];
      if (value === undefined || value === '') missing.push(`routes[${i}].upstreamHeaders.${name}: environment variable ${spec.env} is not set`);
      else headers[name] = spec.prefix + value;
    }
    out.set(route.name, headers);
  });
  if (missing.length > 0) throw new ConfigError(`invalid configuration:\n  ${missing.join('\n  ')}`, missing);
  return out;
}

/** The Node request stream under @hono/node-server (`c.env.incoming`); undefined elsewhere. */
function nodeIncoming(c: Context): IncomingLike | undefined {
  const incoming = (c.env as { incoming?: Partial<IncomingLike> } | undefined)?.incoming;
  return typeof incoming?.on === 'function' && typeof incoming.pause === 'function' ? (incoming as IncomingLike) : undefined;
}

function webResponse(reply: Reply): Response {
  return new Response(reply.stream ?? reply.body, { status: reply.status, headers: reply.headers });
}
