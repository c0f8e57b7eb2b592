import { join } from 'node:path';
import { expect } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import type { Config } from '../../src/config/schema.js';
import { startGateway, type RunningGateway } from '../../src/entry/node.js';
import { silentLogger, type Logger } from '../../src/http/logger.js';
import { LOGGED_REFUSALS } from '../../src/http/refusal-log.js';
import { SqliteGatewayStore, type SqliteStoreOptions } from '../../src/store/sqlite/gateway-store.js';
import type { GatewayStore } from '../../src/store/types.js';
import { tempDir } from './temp.js';

// The one temp-dir helper lives in temp.ts; re-exported for the many tests that import it from here.
export { tempDir };

/** A route in the shape of the config file (defaults filled in by zod). */
export type RouteInput = Record<string, unknown> & { name: string; upstream: string };

/** The issue's example route, pointed at `upstream`, with overrides. */
export function paymentsRoute(upstream: string, overrides: Record<string, unknown> = {}): RouteInput {
  return {
    name: 'payments',
    match: { path: '/payments/*', methods: ['POST', 'PUT', 'PATCH', 'DELETE'] },
    upstream,
    entity: { header: 'X-Fence-Entity' },
    fence: 'required',
    idempotency: 'required',
    mode: 'serial',
    timeoutMs: 10_000,
    maxBodyBytes: 1_048_576,
    retention: '24h',
    onUnknown: 'reject',
    ...overrides,
  };
}

export interface TestGateway {
  url: string;
  running: RunningGateway;
  config: Config;
  /** The real SQLite store underneath any wrapper, for snapshots and backdating. */
  sqlite: SqliteGatewayStore;
  dbPath: string;
  /** GET `<adminPrefix><path>` and parse the JSON. */
  admin(path: string): Promise<{ status: number; body: any }>;
  close(): Promise<void>;
}

export interface TestGatewayOptions {
  routes: RouteInput[];
  /** Extra top-level config fields. */
  config?: Record<string, unknown>;
  /** Wraps the real store, e.g. to switch a check off in a negative control. */
  wrapStore?: (store: GatewayStore) => GatewayStore;
  env?: Record<string, string | undefined>;
  logger?: Logger;
  /** Reuse a database file (several gateways on one file). */
  dbPath?: string;
  /** Options of the SQLite store (its lock waits, …) beyond the path and `synchronous: 'NORMAL'`. */
  sqliteOptions?: Partial<SqliteStoreOptions>;
}

/**
 * The gateway as `fencegate serve` runs it (startGateway: real HTTP server on
 * loopback, undici forwarder, sweeper), in this process, on a fresh SQLite
 * file in a temporary directory.
 */
export async function startTestGateway(options: TestGatewayOptions): Promise<TestGateway> {
  const tmp = options.dbPath === undefined ? tempDir() : null;
  const dbPath = options.dbPath ?? join(tmp!.dir, 'gateway.db');
  const config = parseConfig({
    listen: { host: '127.0.0.1', port: 0 },
    store: { sqlite: dbPath, synchronous: 'NORMAL' },
    ...options.config,
    routes: options.routes,
  });
  const sqlite = new SqliteGatewayStore({ path: dbPath, synchronous: 'NORMAL', ...options.sqliteOptions });
  const store = options.wrapStore ? options.wrapStore(sqlite) : sqlite;
  let running: RunningGateway;
  try {
    running = await startGateway({ config, store, logger: options.logger ?? silentLogger, env: options.env ?? {} });
  } catch (err) {
    await sqlite.close();
    tmp?.cleanup();
    throw err;
  }
  let closed: Promise<void> | null = null;
  return {
    url: running.url,
    running,
    config,
    sqlite,
    dbPath,
    async admin(path) {
      const res = await fetch(`${running.url}${config.adminPrefix}${path}`);
      return { status: res.status, body: await res.json() };
    },
    close() {
      closed ??= (async () => {
        await running.close();
        tmp?.cleanup();
      })();
      return closed;
    },
  };
}

/**
 * Everything the gateway remembers: every row of the three gateway tables.
 * Two equal snapshots mean no state changed (fences, records, rejections).
 * A step-3 400's own row (src/http/refusal-log.ts) is left out: it is the
 * refusal's audit trail, never read by a decision (test/audit/refusal-log.test.ts).
 */
export function snapshot(store: SqliteGatewayStore): string {
  const db = store.db;
  const dump = (sql: string) => db.prepare(sql).safeIntegers(true).all();
  return JSON.stringify(
    {
      entities: dump('SELECT * FROM fence_entities ORDER BY entity'),
      records: dump(
        'SELECT scope, key, fingerprint, entity, fence, state, owner_token, locked_until, status, headers, hex(body) AS body, created_at, expires_at FROM idempotency_records ORDER BY scope, key',
      ),
      rejections: dump(`SELECT * FROM rejections WHERE reason NOT IN (${[...LOGGED_REFUSALS].map((r) => `'${r}'`).join(', ')}) ORDER BY id`),
    },
    (_k, v) => (typeof v === 'bigint' ? v.toString() : v),
  );
}

/** Idempotency records of one key, straight from the table. */
export function recordRows(store: SqliteGatewayStore, key: string): { scope: string; state: string; owner_token: string; status: number | null }[] {
  return store.db.prepare('SELECT scope, state, owner_token, status FROM idempotency_records WHERE key = ?').all(key) as any[];
}

export function rejectionRows(
  store: SqliteGatewayStore,
  reason?: string,
): { reason: string; entity: string | null; presented_fence: number | null; current_fence: number | null; idempotency_key: string | null }[] {
  return (
    reason === undefined
      ? store.db.prepare('SELECT * FROM rejections ORDER BY id').all()
      : store.db.prepare('SELECT * FROM rejections WHERE reason = ? ORDER BY id').all(reason)
  ) as any[];
}

/**
 * Makes the lock of a record and the entity's serial slot look expired, as
 * if the gateway holding them had died (CONTRIBUTING.md convention 2: backdate the row,
 * never fake the database clock).
 */
export function expireLocks(store: SqliteGatewayStore, key: string, entity: string | null): void {
  store.db.prepare("UPDATE idempotency_records SET locked_until = 0 WHERE key = ? AND state = 'in_progress'").run(key);
  if (entity !== null) store.db.prepare('UPDATE fence_entities SET inflight_until = 0 WHERE entity = ? AND inflight_owner IS NOT NULL').run(entity);
}

export interface FencedRequest {
  fence?: string | number | bigint | null;
  entity?: string | null;
  key?: string | null;
  body?: string | Uint8Array;
  method?: string;
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

/** One command through the gateway with the default headers of DESIGN §3. */
export async function command(baseUrl: string, path: string, r: FencedRequest = {}): Promise<Response> {
  const headers: Record<string, string> = { 'content-type': 'application/json', ...r.headers };
  if (r.fence !== undefined && r.fence !== null) headers['x-execution-fence'] = String(r.fence);
  if (r.entity !== undefined && r.entity !== null) headers['x-fence-entity'] = r.entity;
  if (r.key !== undefined && r.key !== null) headers['idempotency-key'] = r.key;
  return fetch(`${baseUrl}${path}`, { method: r.method ?? 'POST', headers, body: r.body ?? '{"amount":1200}', signal: r.signal });
}

/**
 * Checks an RFC 9457 refusal: the media type, `type` ending in `/<code>`,
 * title, status and detail, plus the given helpful fields. Returns the body.
 */
export async function expectProblem(res: Response, status: number, code: string, fields: Record<string, unknown> = {}): Promise<any> {
  const text = await res.text();
  expect(res.status, `${code}: ${text}`).toBe(status);
  expect(res.headers.get('content-type')).toBe('application/problem+json');
  const body = JSON.parse(text);
  expect(body.type).toMatch(new RegExp(`/${code}$`));
  expect(typeof body.title).toBe('string');
  expect(body.title.length).toBeGreaterThan(0);
  expect(body.status).toBe(status);
  expect(typeof body.detail).toBe('string');
  expect(body).toMatchObject(fields);
  return body;
}

/** Parses the default upstream answer (`{ effect, fence, entity, key }`). */
export async function effectOf(res: Response): Promise<{ effect: number; fence: string | null; entity: string | null; key: string | null }> {
  return JSON.parse(await res.text());
}

/**
 * Waits for a condition that no event announces (a row another process
 * writes), re-checking every `everyMs`. Not a timing assertion: only the
 * overall `timeoutMs` bounds it.
 */
export async function until<T>(check: () => T | Promise<T>, what: string, { everyMs = 50, timeoutMs = 20_000 } = {}): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v) return v as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
