/**
 * The gateway without sockets, for the fast tier (`npm run test:fast`): the
 * real Hono app (`createGateway`, the same one `app.fetch` serves on every
 * runtime), a real SQLite store in memory, the real fetch forwarder, and an
 * upstream that is a fetch handler in this process. Requests go in through
 * `app.request`. What this cannot show (sockets, the Node listener, the
 * undici forwarder, several processes) the loopback suites show.
 */
import { parseConfig } from '../../src/config/load.js';
import type { Config } from '../../src/config/schema.js';
import { createFetchForwarder } from '../../src/http/forward-fetch.js';
import { createGateway, type Gateway } from '../../src/http/gateway.js';
import { silentLogger } from '../../src/http/logger.js';
import { SqliteGatewayStore } from '../../src/store/sqlite/gateway-store.js';
import type { GatewayStore } from '../../src/store/types.js';
import type { FencedRequest, RouteInput } from './gateway.js';

export interface InProcessCall {
  /** 1-based arrival order. */
  seq: number;
  method: string;
  /** Path and query, as received. */
  url: string;
  headers: Headers;
  body: string;
  fence: string | null;
  entity: string | null;
  key: string | null;
}

export type InProcessBehavior =
  | { kind: 'respond'; status?: number; headers?: Record<string, string>; body?: string }
  /** Answer `then` (default: the default answer) once `gate` resolves. */
  | { kind: 'hold'; gate: Promise<unknown>; then?: InProcessBehavior }
  /** What Node's fetch throws when the connection is refused: nothing was sent. */
  | { kind: 'refuse' }
  /** What it throws when the connection is reset after the request went out: it may have landed. */
  | { kind: 'reset' };

/**
 * A recording upstream that is NOT idempotent: every call is one more effect.
 * Its default answer is 201 `{ effect, fence, entity, key }`, like the
 * loopback upstream's (test/helpers/upstream.ts), so `effectOf` reads both.
 */
export interface InProcessUpstream {
  url: string;
  calls: InProcessCall[];
  readonly effects: number;
  behave(fn: ((call: InProcessCall) => InProcessBehavior | undefined) | null): void;
  /** Resolves when the `n`th call (1-based) has arrived. */
  arrived(n: number): Promise<InProcessCall>;
  fetch(request: Request): Promise<Response>;
}

export function inProcessUpstream(url = 'http://upstream.test'): InProcessUpstream {
  const calls: InProcessCall[] = [];
  const waiting: { n: number; resolve: (c: InProcessCall) => void }[] = [];
  let behavior: ((call: InProcessCall) => InProcessBehavior | undefined) | null = null;
  const answer = async (b: InProcessBehavior | undefined, call: InProcessCall): Promise<Response> => {
    if (b === undefined) {
      return new Response(JSON.stringify({ effect: call.seq, fence: call.fence, entity: call.entity, key: call.key }), {
        status: 201,
        headers: { 'content-type': 'application/json' },
      });
    }
    switch (b.kind) {
      case 'respond':
        return new Response(b.body ?? '', { status: b.status ?? 200, headers: b.headers ?? {} });
      case 'hold':
        await b.gate;
        return answer(b.then, call);
      case 'refuse':
        throw new TypeError('fetch failed', { cause: Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }) });
      case 'reset':
        throw new TypeError('fetch failed', { cause: Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' }) });
    }
  };
  return {
    url,
    calls,
    get effects() {
      return calls.length;
    },
    behave(fn) {
      behavior = fn;
    },
    arrived(n) {
      const seen = calls[n - 1];
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve) => waiting.push({ n, resolve }));
    },
    async fetch(request) {
      const u = new URL(request.url);
      const call: InProcessCall = {
        seq: calls.length + 1,
        method: request.method,
        url: u.pathname + u.search,
        headers: request.headers,
        body: await request.text(),
        fence: request.headers.get('x-execution-fence'),
        entity: request.headers.get('x-fence-entity'),
        key: request.headers.get('idempotency-key'),
      };
      calls.push(call);
      for (const w of waiting.filter((w) => w.n === call.seq)) w.resolve(call);
      return answer(behavior?.(call), call);
    },
  };
}

export interface InProcessGateway {
  gateway: Gateway;
  config: Config;
  /** The real store, for `snapshot`, `recordRows`, `rejectionRows`. */
  sqlite: SqliteGatewayStore;
  upstream: InProcessUpstream;
  /** One command through `app.request` with the default headers of DESIGN §3 (as `command` sends them over HTTP). */
  command(path: string, r?: FencedRequest): Promise<Response>;
  close(): Promise<void>;
}

export interface InProcessOptions {
  /** Routes; `upstream` is filled in with the in-process upstream's URL when left out. */
  routes: (Omit<RouteInput, 'upstream'> & { upstream?: string })[];
  config?: Record<string, unknown>;
  /** Wraps the real store, e.g. to switch a check off in a negative control. */
  wrapStore?: (store: GatewayStore) => GatewayStore;
}

export function inProcessGateway(options: InProcessOptions): InProcessGateway {
  const upstream = inProcessUpstream();
  const config = parseConfig({
    store: { sqlite: ':memory:' },
    ...options.config,
    routes: options.routes.map((r) => ({ upstream: upstream.url, ...r })),
  });
  const sqlite = new SqliteGatewayStore({ path: ':memory:' });
  const store = options.wrapStore ? options.wrapStore(sqlite) : sqlite;
  const gateway = createGateway({ config, store, forwarder: createFetchForwarder({ fetch: (req) => upstream.fetch(req) }), env: {}, logger: silentLogger });
  return {
    gateway,
    config,
    sqlite,
    upstream,
    command(path, r = {}) {
      const headers: Record<string, string> = { 'content-type': 'application/json', ...r.headers };
      if (r.fence !== undefined && r.fence !== null) headers['x-execution-fence'] = String(r.fence);
      if (r.entity !== undefined && r.entity !== null) headers['x-fence-entity'] = r.entity;
      if (r.key !== undefined && r.key !== null) headers['idempotency-key'] = r.key;
      return Promise.resolve(gateway.app.request(path, { method: r.method ?? 'POST', headers, body: r.body ?? '{"amount":1200}' }));
    },
    close: () => gateway.close(),
  };
}
