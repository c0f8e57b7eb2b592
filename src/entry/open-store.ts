import type { Config } from '../config/schema.js';
import { createSqliteStore } from '../store/sqlite/index.js';
import type { GatewayStore } from '../store/types.js';

export interface OpenStoreOptions {
  /** PostgreSQL pool size instead of the configured one (a one-off command needs few connections). */
  poolSize?: number;
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
    return mod.createPostgresStore({
      connectionString: store.postgres,
      poolSize: options.poolSize ?? store.poolSize,
      ...(store.schema === undefined ? {} : { schema: store.schema }),
      ...(store.pooler === undefined ? {} : { pooler: store.pooler }),
      ...(store.listenUrl === undefined ? {} : { listenConnectionString: store.listenUrl }),
    });
  }
  throw new Error('store.d1 is only available on Cloudflare Workers (see wrangler.toml)');
}
