import pg from 'pg';
import { PostgresGatewayStore, type PostgresStoreOptions } from './gateway-store.js';
import { migratePostgres } from './migrate.js';
import { quoteIdent } from './text.js';
import type { ClientLike, PoolLike } from './types.js';

export {
  PostgresGatewayStore,
  DEFAULT_POLL_MS_LISTENING,
  DEFAULT_POLL_MS_POLLING,
  type PostgresStoreOptions,
} from './gateway-store.js';
export { migratePostgres } from './migrate.js';
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
  const clientConfig: pg.ClientConfig = {
    connectionString,
    application_name: options.applicationName ?? 'fencegate',
    connectionTimeoutMillis: options.connectionTimeoutMs ?? 5_000,
    statement_timeout: options.statementTimeoutMs ?? 10_000,
    keepAlive: true,
  };
  let pool: PoolLike;
  let ownsPool: boolean;
  let makeListenClient: (() => pg.Client) | null = null;
  if (options.pool !== undefined) {
    pool = options.pool;
    ownsPool = false;
    const settings = pool instanceof pg.Pool ? (pool as pg.Pool & { options: pg.ClientConfig }).options : null;
    if (settings !== null) makeListenClient = () => new pg.Client(settings);
  } else {
    const own = new pg.Pool({ ...clientConfig, max: options.poolSize ?? 10 });
    // An idle connection that dies (pg_terminate_backend, a restart) emits
    // here; without a listener it would crash the process. The pool has
    // already dropped it and opens a new one on the next call.
    own.on('error', (err) => onError(err, 'pool'));
    pool = own;
    ownsPool = true;
    makeListenClient = () => new pg.Client(clientConfig);
  }
  if (options.listen === false) makeListenClient = null;

  try {
    if (schema !== undefined) await ensureSchema(pool, schema);
    if (options.migrate !== false) await migratePostgres(schema === undefined ? pool : inSchema(pool, schema));
    const resolvedSchema = schema ?? (await pool.query<{ s: string | null }>('SELECT current_schema() AS s')).rows[0]?.s;
    if (resolvedSchema === null || resolvedSchema === undefined) throw new Error('no schema: the search_path names no existing schema');
    const store = new PostgresGatewayStore({
      pool,
      ownsPool,
      schema: schema ?? null,
      resolvedSchema,
      makeListenClient,
      pollMs: options.pollMs,
      onError,
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
export async function migratePostgresUrl(url: string): Promise<string[]> {
  const pool = new pg.Pool({ connectionString: url, max: 1, application_name: 'fencegate-migrate' });
  pool.on('error', () => {});
  try {
    return await migratePostgres(pool);
  } finally {
    await pool.end();
  }
}

async function ensureSchema(pool: PoolLike, schema: string): Promise<void> {
  try {
    await pool.query(`CREATE SCHEMA IF NOT EXISTS ${quoteIdent(schema)}`);
  } catch (err) {
    // Two replicas creating it at once: one of them loses the race, harmlessly.
    const code = (err as { code?: string }).code;
    if (code !== '23505' && code !== '42P06') throw err;
  }
}

/** The pool, with every connection handed to the migrator pointed at `schema` (and reset on release). */
function inSchema(pool: PoolLike, schema: string): PoolLike {
  return {
    query: (text, values) => pool.query(text, values),
    end: () => pool.end(),
    async connect(): Promise<ClientLike> {
      const client = await pool.connect();
      try {
        await client.query(`SET search_path TO ${quoteIdent(schema)}`);
      } catch (err) {
        client.release(err as Error);
        throw err;
      }
      return {
        query: (text, values) => client.query(text, values),
        release(err) {
          if (err !== undefined && err !== false) return client.release(err);
          client.query('RESET search_path').then(
            () => client.release(),
            (e: Error) => client.release(e),
          );
        },
      };
    },
  };
}
