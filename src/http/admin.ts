import { Hono, type MiddlewareHandler } from 'hono';
import { basePath } from 'hono/route';
import type { RouteConfig } from '../config/schema.js';
import { ERROR_CODES, type ErrorCode } from '../protocol/codes.js';
import { renderProblem, type Refusal } from '../protocol/problem.js';
import type { GatewayStore, RejectionQuery } from '../store/types.js';
import { EXPORT_MEDIA_TYPES, exportFormatOf, rejectionExport } from './audit/export.js';
import { rejectionJson } from './audit/format.js';
import { latestHistory, recordJson, registerAuditRoutes } from './audit/routes.js';
import { consoleResponse, type ConsoleMode } from './console/page.js';
import { registerCommandRoutes } from './audit/commands.js';
import { parseLogQuery } from './audit/time.js';

export { rejectionJson };

export interface AdminOptions {
  store: GatewayStore;
  problemBase: string;
  /** When false, only `/health` and the problem descriptions answer. */
  enabled: boolean;
  /** With caller auth: in front of every `/v1` endpoint (audit scope to read, admin scope to write). */
  guard?: MiddlewareHandler;
  /** The configured routes (a resolved record keeps its route's retention and replay headers). */
  routes?: RouteConfig[];
  /** `GET /metrics`; behind `guard` (or `enabled`) unless `public`. */
  metrics?: { render: () => Promise<string>; public: boolean; guard?: MiddlewareHandler };
}

/**
 * The admin API, mounted under `adminPrefix`. `GET /health`, `GET /ready` and
 * `GET /problems/:code` always answer; the `/v1` audit endpoints only when
 * enabled (until caller auth exists: only on a loopback listener).
 */
export function createAdminApp(options: AdminOptions): Hono {
  const { store } = options;
  const app = new Hono();
  const problem = (refusal: Refusal) => {
    const r = renderProblem(refusal, options.problemBase);
    return new Response(r.body, { status: r.status, headers: r.headers });
  };

  // Liveness: 200 while the process answers. A store that tracks whether its
  // round trips are answered (PostgreSQL) adds `store`, for readiness
  // (docs/deploy-postgres.md §4); the store is not queried here.
  app.get('/health', (c) => {
    const healthy = (store as { healthy?: unknown }).healthy;
    return c.json(typeof healthy === 'boolean' ? { status: 'ok', store: healthy ? 'up' : 'unavailable' } : { status: 'ok' });
  });

  // Readiness: 503 while the store says its round trips go unanswered, so a
  // balancer can send the traffic to a replica whose database answers; a
  // store that does not track it (SQLite, D1) is ready while the process is.
  app.get('/ready', (c) => {
    const healthy = (store as { healthy?: unknown }).healthy;
    return healthy === false ? c.json({ status: 'unavailable', store: 'unavailable' }, 503) : c.json({ status: 'ready' });
  });

  app.get('/problems/:code', (c) => {
    const code = c.req.param('code');
    if (!Object.hasOwn(ERROR_CODES, code)) return problem({ code: 'not-found', detail: `no problem type "${code}"` });
    const spec = ERROR_CODES[code as ErrorCode];
    return c.json({ code, status: spec.status, title: spec.title, retryable: spec.retryable });
  });

  // The console: a static page, no data in it; its API calls carry the
  // operator's token. Whether there is a token to ask for is rendered into
  // the page, so that it never has to ask the (audited) API first.
  const mode: ConsoleMode = !options.enabled ? 'off' : options.guard ? 'auth' : 'open';
  // `<adminPrefix>` itself answers here; the page's API paths are relative,
  // so it sends the browser on to `<adminPrefix>/` first.
  app.get('/', (c) => (c.req.path.endsWith('/') ? consoleResponse(mode) : c.redirect(`${c.req.path}/`, 308)));
  app.get('/console', () => consoleResponse(mode));

  const disabled = () =>
    problem({ code: 'admin-disabled', detail: 'the admin API answers only on a loopback listener until caller authentication is configured' });
  const { metrics } = options;
  if (metrics !== undefined) {
    app.get(
      '/metrics',
      async (c, next) => {
        if (metrics.public) return next();
        if (!options.enabled) return disabled();
        return metrics.guard ? metrics.guard(c, next) : next();
      },
      async (c) => c.body(await metrics.render(), 200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' }),
    );
  }

  app.use('/v1/*', async (c, next) => {
    if (!options.enabled) return disabled();
    if (options.guard) return options.guard(c, next);
    await next();
  });

  app.get('/v1/rejections', async (c) => {
    const params = new URL(c.req.url).searchParams;
    const parsed = parseRejectionQuery(params);
    if (typeof parsed === 'string') return problem({ code: 'invalid-request', detail: parsed });
    // Exports (Accept: application/x-ndjson or text/csv, or ?format=): every
    // matching row, streamed page by page; `limit`, when given, caps the total.
    const format = exportFormatOf(c.req.header('accept'), params.get('format'));
    if (format === null) return problem({ code: 'invalid-request', detail: 'format: expected json, ndjson or csv' });
    if (format !== 'json') {
      const { limit, ...filters } = parsed;
      const stream = rejectionExport(store, filters, format, params.has('limit') ? limit : Infinity);
      return new Response(stream, { headers: { 'content-type': EXPORT_MEDIA_TYPES[format], 'cache-control': 'no-store' } });
    }
    const page = await store.listRejections(parsed);
    return c.json({ items: page.items.map(rejectionJson), next_cursor: page.nextCursor });
  });

  // The command log (DESIGN §4.1 `commands`): its pages and exports, as the rejection log's.
  registerCommandRoutes(app, { store, problem });

  app.get('/v1/entities/:entity', async (c) => {
    const info = await store.getEntity(c.req.param('entity'));
    if (info === null) return problem({ code: 'not-found', detail: 'no such entity' });
    return c.json({
      entity: info.entity,
      fence: info.fence,
      accepted_at: info.acceptedAt.toISOString(),
      inflight: info.inflight === null ? null : { until: info.inflight.until.toISOString() },
      // Its accepted fences, highest first (more: /v1/entities/:entity/history?cursor=).
      ...(await latestHistory(store, info.entity)),
    });
  });

  app.get('/v1/idempotency/:key', async (c) => {
    const key = c.req.param('key');
    const records = await store.getRecords(key);
    if (records.length === 0) return problem({ code: 'not-found', detail: 'no record with this idempotency key' });
    return c.json({
      key,
      // The audit API's record fields, less the key this answer names once.
      records: records.map((r) => {
        const { key: _key, ...fields } = recordJson(r);
        return fields;
      }),
    });
  });

  registerAuditRoutes(app, { store, problem, routes: options.routes ?? [] });

  app.all('*', (c) => {
    // `<adminPrefix>/`: the console. Hono mounts this app's `/` on the prefix
    // without its slash, so the slashed form reaches this catch-all.
    if (c.req.method === 'GET' && c.req.path === `${basePath(c)}/`) return consoleResponse(mode);
    return problem({ code: 'not-found', detail: 'no such admin endpoint' });
  });
  return app;
}

/**
 * `entity`, `reason`, `caller`, `tool` (an MCP tool name: rows of plain
 * routes, whose tool is null, never match); `since` / `until` as ISO 8601 or as a
 * duration back from now (`2h`); `limit` 1–1000 (default 100); `cursor`.
 * Returns the query, or a message naming the bad parameter.
 */
export function parseRejectionQuery(params: URLSearchParams, now = Date.now()): RejectionQuery | string {
  return parseLogQuery(params, ['entity', 'reason', 'caller', 'tool'], now);
}
