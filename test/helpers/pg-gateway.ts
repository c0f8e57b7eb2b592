import { randomUUID } from 'node:crypto';
import { parseConfig } from '../../src/config/load.js';
import type { Config } from '../../src/config/schema.js';
import { startGateway, type RunningGateway } from '../../src/entry/node.js';
import { silentLogger } from '../../src/http/logger.js';
import { createPostgresStore, type PostgresGatewayStore } from '../../src/store/postgres/index.js';
import type { GatewayStore } from '../../src/store/types.js';
import type { RouteInput } from './gateway.js';
import { createTestSchema, type TestSchema } from './postgres.js';

export interface PgTestGateway {
  url: string;
  running: RunningGateway;
  config: Config;
  /** The gateway's own store (its pool, its listener). */
  store: PostgresGatewayStore;
  /** The fresh schema, with a pool of its own for direct SQL (backdating, snapshots). */
  schema: TestSchema;
  /** Stops the gateway, closes its store and drops the schema. Idempotent. */
  close(): Promise<void>;
}

/**
 * The Node gateway (startGateway, as `fencegate serve` runs it) in this
 * process, on the PostgreSQL store in a fresh schema. Needs
 * FENCEGATE_TEST_POSTGRES_URL (use `describe.skipIf(!POSTGRES_URL)`).
 */
export async function startPgTestGateway(options: {
  routes: RouteInput[];
  config?: Record<string, unknown>;
  prefix?: string;
  env?: Record<string, string>;
  /** Wraps the real store the gateway is given (negative controls, held replies). */
  wrapStore?: (store: GatewayStore) => GatewayStore;
}): Promise<PgTestGateway> {
  const schema = await createTestSchema(options.prefix ?? 'fg_gw', 4);
  let store: PostgresGatewayStore | null = null;
  try {
    const config = parseConfig({
      listen: { host: '127.0.0.1', port: 0 },
      store: { postgres: schema.url, poolSize: 6 },
      ...options.config,
      routes: options.routes,
    });
    // Its own application name: no other test file's session kills reach it.
    store = await createPostgresStore({ connectionString: schema.url, poolSize: 6, applicationName: `fg-test-${randomUUID().slice(0, 8)}` });
    const running = await startGateway({ config, store: options.wrapStore ? options.wrapStore(store) : store, logger: silentLogger, env: options.env ?? {} });
    const s = store;
    let closed: Promise<void> | null = null;
    return {
      url: running.url,
      running,
      config,
      store: s,
      schema,
      close() {
        closed ??= (async () => {
          try {
            await running.close();
          } finally {
            await s.close();
            await schema.drop();
          }
        })();
        return closed;
      },
    };
  } catch (err) {
    await store?.close();
    await schema.drop();
    throw err;
  }
}

/** One line the gateway logged, as `logger[level](msg, fields)` was called. */
export interface LoggedLine {
  level: 'info' | 'warn' | 'error';
  msg: string;
  fields: Record<string, unknown>;
}

export interface LoggedPgGateway {
  url: string;
  running: RunningGateway;
  store: PostgresGatewayStore;
  /** Every line it logged, start-up included. */
  lines: LoggedLine[];
  /** Stops the gateway, then closes the store. */
  close(): Promise<void>;
}

/**
 * The Node gateway (startGateway) on a PostgreSQL store the test opened
 * (a private server, a pooler), keeping what it logs; the config's store
 * URL is `url` (the store given is used).
 */
export async function startLoggedPgGateway(store: PostgresGatewayStore, url: string, routes: RouteInput[]): Promise<LoggedPgGateway> {
  const lines: LoggedLine[] = [];
  const keep =
    (level: LoggedLine['level']) =>
    (msg: string, fields: Record<string, unknown> = {}) =>
      void lines.push({ level, msg, fields });
  const config = parseConfig({ listen: { host: '127.0.0.1', port: 0 }, store: { postgres: url }, routes });
  const running = await startGateway({ config, store, logger: { info: keep('info'), warn: keep('warn'), error: keep('error') }, env: {} });
  return {
    url: running.url,
    running,
    store,
    lines,
    async close() {
      try {
        await running.close();
      } finally {
        await store.close();
      }
    },
  };
}
