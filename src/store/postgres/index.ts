import pg from 'pg';
import { PostgresGatewayStore, type PostgresStoreOptions } from './gateway-store.js';
import { migratePostgres } from './migrate.js';
import { ensureSchema, inSchema, openPool } from './pool.js';

export {
  PostgresGatewayStore,
  DEFAULT_POLL_MS_LISTENING,
  DEFAULT_POLL_MS_POLLING,
  type PostgresStoreOptions,
} from './gateway-store.js';
export { migratePostgres } from './migrate.js';
export { ReplicationCheck, assessReplication, type ReplicationReport, type ReplicationLogLine } from './replication-check.js';
export type { ClientLike, PoolLike, QueryResultLike } from './types.js';

/**
 * Opens the PostgreSQL gateway store: a pool (or yours), pending migrations
 * applied (unless `migrate: false`; safe when several replicas start at
 * once), and a LISTEN connection for cross-replica wake-ups.
 * @example
 * const store = await createPostgresStore({ connectionString: process.env.DATABASE_URL, poolSize: 20 });
 * // … createGateway({ config, store, … }); on shutdown: await store.close();
 */
export async function createPostgresStore(options: PostgresStoreOptions): Promise<PostgresGatewayStore> {
  const { connectionString, schema } = options;
  if (options.pool === undefined && (connectionString === undefined || connectionString === '')) {
    throw new Error('createPostgresStore needs a connectionString or a pool');
  }
  const onError = options.onError ?? (() => {});
  const { pool, ownsPool, makeListenClient, notices } = openPool(options, onError);

  try {
    if (schema !== undefined) await ensureSchema(pool, schema);
    if (options.migrate !== false) await migratePostgres(schema === undefined ? pool : inSchema(pool, schema, options.pooler));
    const resolvedSchema = schema ?? (await pool.query<{ s: string | null }>('SELECT current_schema() AS s')).rows[0]?.s;
    if (resolvedSchema === null || resolvedSchema === undefined) throw new Error('no schema: the search_path names no existing schema');
    const store = new PostgresGatewayStore({
      pool,
      ownsPool,
      schema: schema ?? null,
      resolvedSchema,
      makeListenClient,
      pollMs: options.pollMs,
      replicationCheckMs: options.replicationCheckMs,
      notices,
      onError,
      ...(options.onHealth ? { onHealth: options.onHealth } : {}),
    });
    await store.start();
    return store;
  } catch (err) {
    if (ownsPool) await pool.end().catch(() => {});
    throw err;
  }
}

/**
 * `fencegate migrate --database-url URL`: applies the gateway's pending
 * `migrations/gateway/postgres` files and changed function files (./sql),
 * and returns their names.
 */
export async function migratePostgresUrl(url: string, options: { schema?: string; pooler?: 'session' | 'transaction' } = {}): Promise<string[]> {
  const pool = new pg.Pool({ connectionString: url, max: 1, application_name: 'fencegate-migrate' });
  pool.on('error', () => {});
  try {
    if (options.schema === undefined) return await migratePostgres(pool);
    await ensureSchema(pool, options.schema);
    return await migratePostgres(inSchema(pool, options.schema, options.pooler));
  } finally {
    await pool.end();
  }
}
