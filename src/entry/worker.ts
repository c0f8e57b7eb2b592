/**
 * The Cloudflare Workers entry (`wrangler.toml`: `main`). The same gateway
 * as `fencegate serve`, with Workers parts: the config from the
 * `FENCEGATE_CONFIG` variable, the D1 store its `"store": { "d1": "<binding>" }`
 * names, `fetch` for the upstream, secrets from Worker secrets (`env`), and
 * the sweeper and the background reconcile pass on the cron trigger
 * (./worker-scheduled.ts).
 *
 * Two things a Worker is not told, so the gateway cannot act on them here
 * (docs/deploy-workers.md): whether a failed upstream `fetch` sent anything
 * (every thrown error is outcome_unknown), and the caller's `Connection`
 * header (workerd drops it before `fetch` runs; the fields it named arrive).
 *
 * Nothing here may import Node-only modules (better-sqlite3, pg, undici,
 * node:fs): wrangler bundles this file and everything it reaches.
 */
import { ConfigError, parseConfigText } from '../config/load.js';
import type { Config } from '../config/schema.js';
import { createFetchForwarder } from '../http/forward-fetch.js';
import { createGateway, type Gateway } from '../http/gateway.js';
import { createJsonLogger, LOG_LEVELS, parseLogLevel, type Logger } from '../http/logger.js';
import { createMetrics } from '../http/metrics.js';
import { renderProblem } from '../protocol/problem.js';
import { createD1Store, type D1DatabaseLike } from '../store/d1/index.js';
import { createWorkerReconciler, reconcileBudgetOf, type WorkerReconciler } from './worker-scheduled.js';

/** The Worker's bindings: variables, secrets, the D1 database. */
export interface WorkerEnv {
  /** The JSON config (same schema as the config file), parsed once per isolate. */
  FENCEGATE_CONFIG?: string;
  /**
   * Who may reach the `/v1` admin API: `auth` (default: only with caller
   * `auth` configured, behind its scopes; without it, not at all), `on`
   * (even without auth: local development, `wrangler dev`, set in
   * `.dev.vars` or `--var`, never on a deployed Worker), or `off`.
   * `loopback` (older configurations) means `auth`.
   */
  FENCEGATE_ADMIN?: string;
  /** `info` (default), `warn`, `error` or `silent`. */
  FENCEGATE_LOG_LEVEL?: string;
  /** The background reconcile pass's wall-clock budget in ms (default 30000; ./worker-scheduled.ts). */
  FENCEGATE_RECONCILE_BUDGET_MS?: string;
  /** Most status queries one background reconcile pass starts (default 20; ./worker-scheduled.ts). */
  FENCEGATE_RECONCILE_MAX_QUERIES?: string;
  [binding: string]: unknown;
}

/** The parts of `ExecutionContext` used here. */
export interface ExecutionContextLike {
  waitUntil(promise: Promise<unknown>): void;
}

interface Isolate {
  text: string;
  /** FENCEGATE_ADMIN when the isolate was built: the admin decision depends on it. */
  adminMode: string | undefined;
  config: Config;
  logger: Logger;
  gateway: Gateway;
  /** The background reconcile pass, null without a route with `reconcile`. */
  reconciler: WorkerReconciler | null;
}

/**
 * Built on the first request of an isolate and reused: `env` is the same
 * object for every request of an isolate, and a changed variable comes with
 * a new deployment, hence a new isolate. Keyed by `env` so that tests with
 * several environments never share a store.
 */
const isolates = new WeakMap<object, Isolate>();

function isolateFor(env: WorkerEnv): Isolate {
  const text = env.FENCEGATE_CONFIG;
  const cached = isolates.get(env);
  if (cached !== undefined && cached.text === text && cached.adminMode === env.FENCEGATE_ADMIN) return cached;
  if (typeof text !== 'string' || text.trim() === '') {
    throw new ConfigError('FENCEGATE_CONFIG is not set: put the JSON configuration in [vars] of wrangler.toml', ['FENCEGATE_CONFIG']);
  }
  const config = parseConfigText(text, 'FENCEGATE_CONFIG');
  if (!('d1' in config.store)) {
    throw new ConfigError('store: on Workers the store must be { "d1": "<binding name>" }', ['store']);
  }
  // The Node entry inlines key files before the gateway starts; a Worker has
  // no file system, so keys must be inline (pem, jwks) or secrets ({ env }).
  const fileKeys = [...keyFileFields(config.auth, 'auth'), ...keyFileFields(config.fence.signed, 'fence.signed')];
  if (fileKeys.length > 0) {
    throw new ConfigError(
      `invalid configuration:\n  ${fileKeys.map((f) => `${f}: key files cannot be read on Workers; put the key inline (pem, jwks) or in a secret`).join('\n  ')}`,
      fileKeys,
    );
  }
  const db = env[config.store.d1] as D1DatabaseLike | undefined;
  if (db === undefined || typeof db !== 'object' || typeof db.batch !== 'function') {
    throw new ConfigError(`store.d1: no D1 binding named ${config.store.d1} (add [[d1_databases]] binding = "${config.store.d1}" to wrangler.toml)`, [
      'store.d1',
    ]);
  }
  const level = parseLogLevel(env.FENCEGATE_LOG_LEVEL || 'info');
  if (level === null)
    throw new ConfigError(`FENCEGATE_LOG_LEVEL must be one of ${LOG_LEVELS.join(', ')} (it is ${JSON.stringify(env.FENCEGATE_LOG_LEVEL)})`, [
      'FENCEGATE_LOG_LEVEL',
    ]);
  // console.log: Workers Logs parse one JSON object per line.
  const logger = createJsonLogger({ level, write: (line) => console.log(line) });
  const store = createD1Store({ db });
  const forwarder = createFetchForwarder();
  // Upstream credentials (`upstreamHeaders: { env }`) come from Worker
  // secrets: `wrangler secret put NAME`. A missing one fails here, naming it.
  const secrets = Object.fromEntries(Object.entries(env).filter((e): e is [string, string] => typeof e[1] === 'string'));
  const admin = adminAllowed(env.FENCEGATE_ADMIN, config, logger);
  const { budgetMs, maxQueries } = reconcileBudgetOf(env);
  // One metrics object for the gateway and the reconcile pass: /metrics shows both.
  const metrics = createMetrics({
    routes: config.routes.map((r) => r.name),
    reconcileRoutes: config.routes.filter((r) => r.reconcile !== undefined).map((r) => r.name),
  });
  const gateway = createGateway({ config, store, forwarder, env: secrets, logger, admin, metrics });
  const reconciler = createWorkerReconciler({ config, store, forwarder, logger, metrics, env: secrets, budgetMs, maxQueries });
  const isolate: Isolate = { text, adminMode: env.FENCEGATE_ADMIN, config, logger, gateway, reconciler };
  isolates.set(env, isolate);
  return isolate;
}

/** The config fields that name key files (`jwksFile`, `publicKeys[i].file`). */
function keyFileFields(spec: { jwksFile?: string | undefined; publicKeys?: { file?: string | undefined }[] | undefined } | undefined, field: string): string[] {
  if (spec === undefined) return [];
  const out = spec.jwksFile !== undefined ? [`${field}.jwksFile`] : [];
  spec.publicKeys?.forEach((k, i) => {
    if (k.file !== undefined) out.push(`${field}.publicKeys[${i}].file`);
  });
  return out;
}

/**
 * Whether this isolate serves the `/v1` admin API: decided from the
 * configuration alone, once per isolate, never per request. A Worker sees no
 * connection address, and the request URL's host is whatever the client put
 * in its `Host` header, so "the request came to localhost" proves nothing:
 * `Host: 127.0.0.1` reaches a deployed Worker as easily as any other name.
 * Hence the admin API is served behind caller auth, or without auth only
 * when the deployment says so explicitly (`on`, for `wrangler dev`).
 */
function adminAllowed(mode: string | undefined, config: Config, logger: Logger): boolean {
  const m = mode ?? 'auth';
  if (m !== 'auth' && m !== 'on' && m !== 'off' && m !== 'loopback') {
    throw new ConfigError(`FENCEGATE_ADMIN: must be "auth", "on" or "off", not ${JSON.stringify(m).slice(0, 40)}`, ['FENCEGATE_ADMIN']);
  }
  if (m === 'off') return false;
  if (m === 'on') {
    if (config.auth === undefined)
      logger.warn('admin-api-unauthenticated', {
        reason: 'FENCEGATE_ADMIN is "on" without caller auth: anyone who reaches this Worker reads the audit API; for wrangler dev only',
      });
    return true;
  }
  // `loopback` was decided from the Host header before; it now means `auth`.
  if (config.auth === undefined)
    logger.warn('admin-api-disabled', { reason: 'no caller auth configured (set FENCEGATE_ADMIN=on for wrangler dev only)', mode: m });
  return config.auth !== undefined;
}

/** A bad configuration answers every request 500 and logs the fields; it never forwards. */
function configFailure(err: unknown): Response {
  console.error(JSON.stringify({ level: 'error', msg: 'invalid-config', error: err instanceof Error ? err.message : String(err) }));
  const r = renderProblem({ code: 'internal-error', detail: 'the gateway configuration is invalid; see the Worker logs' });
  return new Response(r.body, { status: r.status, headers: r.headers });
}

export default {
  async fetch(request: Request, env: WorkerEnv, ctx: ExecutionContextLike): Promise<Response> {
    let isolate: Isolate;
    try {
      isolate = isolateFor(env);
    } catch (err) {
      return configFailure(err);
    }
    const handled = Promise.resolve(isolate.gateway.app.fetch(request, env, ctx as never));
    // DESIGN §3.6: a caller that disconnects must not cancel the upstream
    // call or its finish. Workers cancels a request's work when its client
    // goes away, unless the work is registered with waitUntil (which extends
    // it, within the platform's limit, after the response or disconnect).
    ctx.waitUntil(handled.catch(() => {}));
    return handled;
  },

  /**
   * The cron trigger: the sweep (expired records, dead in_progress records,
   * old rejections), then one background reconcile pass within its budget
   * (DESIGN §3.12; ./worker-scheduled.ts), which also asks about the records
   * the sweep just marked outcome_unknown. A failed sweep does not hold the
   * pass back.
   */
  async scheduled(_controller: unknown, env: WorkerEnv, ctx: ExecutionContextLike): Promise<void> {
    let isolate: Isolate;
    try {
      isolate = isolateFor(env);
    } catch (err) {
      configFailure(err);
      return;
    }
    const work = (async () => {
      await isolate.gateway.sweep().then(
        (r) => isolate.logger.info('sweep', { ...r }),
        (err) => isolate.logger.error('sweep-failed', { error: String(err) }),
      );
      // Logged (reconcile-pass, reconcile-failed) by the reconciler.
      await isolate.reconciler?.run().catch(() => {});
    })();
    ctx.waitUntil(work);
    await work;
  },
};
