import type { Config } from '../config/schema.js';
import { errorText, type Logger } from '../http/logger.js';
import { createSqliteStore } from '../store/sqlite/index.js';
import type { GatewayStore } from '../store/types.js';

export interface OpenStoreOptions {
  /** PostgreSQL pool size instead of the configured one (a one-off command needs few connections). */
  poolSize?: number;
  /** Where a PostgreSQL store says that its round trips stopped, or started again, being answered. */
  logger?: Logger;
}

/**
 * Opens the store a configuration names, for every Node command (serve,
 * audit). PostgreSQL is loaded only when named, so a SQLite deployment never
 * needs `pg`; D1 exists only on Cloudflare Workers.
 */
export async function openStore(store: Config['store'], options: OpenStoreOptions = {}): Promise<GatewayStore> {
  if ('sqlite' in store) return createSqliteStore({ path: store.sqlite, synchronous: store.synchronous });
  if ('postgres' in store) {
    const pgStore = '../store/postgres/index.js';
    const mod = await import(pgStore);
    const { logger } = options;
    return mod.createPostgresStore({
      connectionString: store.postgres,
      poolSize: options.poolSize ?? store.poolSize,
      queryTimeoutMs: store.queryTimeout,
      ...(store.schema === undefined ? {} : { schema: store.schema }),
      ...(store.pooler === undefined ? {} : { pooler: store.pooler }),
      ...(store.listenUrl === undefined ? {} : { listenConnectionString: store.listenUrl }),
      ...(logger
        ? {
            onHealth: (healthy: boolean, err: Error | null) =>
              healthy ? logger.info('store-available', { store: 'postgres' }) : logger.error('store-unavailable', { store: 'postgres', error: errorText(err) }),
          }
        : {}),
    });
  }
  throw new Error('store.d1 is only available on Cloudflare Workers (see wrangler.toml)');
}
