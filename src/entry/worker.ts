/**
 * The Cloudflare Workers entry (`wrangler.toml`: `main`). The same gateway
 * as `fencegate serve`, with Workers parts: the config from the
 * `FENCEGATE_CONFIG` variable, the D1 store its `"store": { "d1": "<binding>" }`
 * names, `fetch` for the upstream, secrets from Worker secrets (`env`), and
 * the sweeper on the cron trigger.
 *
 * Nothing here may import Node-only modules (better-sqlite3, pg, undici,
 * node:fs): wrangler bundles this file and everything it reaches.
 */
import { ConfigError, parseConfigText } from '../config/load.js';
import type { Config } from '../config/schema.js';
import { createFetchForwarder } from '../http/forward-fetch.js';
import { createGateway, type Gateway } from '../http/gateway.js';
import { createJsonLogger, type Logger, type LogLevel } from '../http/logger.js';
import { renderProblem } from '../protocol/problem.js';
import { createD1Store, type D1DatabaseLike } from '../store/d1/index.js';

/** The Worker's bindings: variables, secrets, the D1 database. */
export interface WorkerEnv {
  /** The JSON config (same schema as the config file), parsed once per isolate. */
  FENCEGATE_CONFIG?: string;
  /**
   * Who may reach the `/v1` admin API: `loopback` (default: with caller
   * `auth` configured, any hostname, behind its scopes, as on Node; without
   * it, only requests to localhost / 127.0.0.1 / [::1], i.e. `wrangler dev`),
   * `on` (any hostname, even without auth: never on a public hostname), or `off`.
   */
  FENCEGATE_ADMIN?: string;
  /** `info` (default), `warn`, `error` or `silent`. */
  FENCEGATE_LOG_LEVEL?: string;
  [binding: string]: unknown;
}

/** The parts of `ExecutionContext` used here. */
export interface ExecutionContextLike {
  waitUntil(promise: Promise<unknown>): void;
}

interface Isolate {
  text: string;
  config: Config;
  logger: Logger;
  /** One gateway with the admin API, one without; same store. */
  withAdmin: Gateway;
  withoutAdmin: Gateway;
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
  if (cached !== undefined && cached.text === text) return cached;
  if (typeof text !== 'string' || text.trim() === '') {
    throw new ConfigError('FENCEGATE_CONFIG is not set: put the JSON configuration in [vars] of wrangler.toml', ['FENCEGATE_CONFIG']);
  }
  const config = parseConfigText(text, 'FENCEGATE_CONFIG');
  if (!('d1' in config.store)) {
    throw new ConfigError('store: on Workers the store must be { "d1": "<binding name>" }', ['store']);
  }
  // The Node entry inlines key files before the gateway starts; a Worker has
  // no file system, so keys must be inline (pem, jwks) or secrets ({ env }).
  const fileKeys = [
    ...keyFileFields(config.auth, 'auth'),
    ...keyFileFields(config.fence.signed, 'fence.signed'),
  ];
  if (fileKeys.length > 0) {
    throw new ConfigError(`invalid configuration:\n  ${fileKeys.map((f) => `${f}: key files cannot be read on Workers; put the key inline (pem, jwks) or in a secret`).join('\n  ')}`, fileKeys);
  }
  const db = env[config.store.d1] as D1DatabaseLike | undefined;
  if (db === undefined || typeof db !== 'object' || typeof db.batch !== 'function') {
    throw new ConfigError(`store.d1: no D1 binding named ${config.store.d1} (add [[d1_databases]] binding = "${config.store.d1}" to wrangler.toml)`, ['store.d1']);
  }
  const level = (env.FENCEGATE_LOG_LEVEL ?? 'info') as LogLevel;
  // console.log: Workers Logs parse one JSON object per line.
  const logger = createJsonLogger({ level: ['info', 'warn', 'error', 'silent'].includes(level) ? level : 'info', write: (line) => console.log(line) });
  const store = createD1Store({ db });
  const forwarder = createFetchForwarder();
  // Upstream credentials (`upstreamHeaders: { env }`) come from Worker
  // secrets: `wrangler secret put NAME`. A missing one fails here, naming it.
  const secrets = Object.fromEntries(Object.entries(env).filter((e): e is [string, string] => typeof e[1] === 'string'));
  const make = (admin: boolean) => createGateway({ config, store, forwarder, env: secrets, logger, admin });
  const isolate: Isolate = { text, config, logger, withAdmin: make(true), withoutAdmin: make(false) };
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

function adminAllowed(env: WorkerEnv, config: Config, url: URL): boolean {
  const mode = env.FENCEGATE_ADMIN ?? 'loopback';
  if (mode === 'on') return true;
  if (mode === 'off') return false;
  // With caller auth the admin API sits behind its scopes, on any hostname.
  if (config.auth !== undefined) return true;
  const host = url.hostname;
  return host === 'localhost' || host === '[::1]' || host === '::1' || /^127(\.\d{1,3}){3}$/.test(host);
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
    const gateway = adminAllowed(env, isolate.config, new URL(request.url)) ? isolate.withAdmin : isolate.withoutAdmin;
    const handled = Promise.resolve(gateway.app.fetch(request, env, ctx as never));
    // DESIGN §3.6: a caller that disconnects must not cancel the upstream
    // call or its finish. Workers cancels a request's work when its client
    // goes away, unless the work is registered with waitUntil (which extends
    // it, within the platform's limit, after the response or disconnect).
    ctx.waitUntil(handled.catch(() => {}));
    return handled;
  },

  /** The cron trigger: expired records, dead in_progress records, old rejections. */
  async scheduled(_controller: unknown, env: WorkerEnv, ctx: ExecutionContextLike): Promise<void> {
    let isolate: Isolate;
    try {
      isolate = isolateFor(env);
    } catch (err) {
      configFailure(err);
      return;
    }
    const sweep = isolate.withoutAdmin.sweep().then(
      (r) => isolate.logger.info('sweep', { ...r }),
      (err) => isolate.logger.error('sweep-failed', { error: String(err) }),
    );
    ctx.waitUntil(sweep);
    await sweep;
  },
};
