import pg from 'pg';
import { DEFAULT_QUERY_TIMEOUT_MS, type PostgresStoreOptions } from './options.js';
import { quoteIdent } from './text.js';
import type { ClientLike, PoolLike } from './types.js';

export interface OpenedPool {
  pool: PoolLike;
  /** The store opened it, so the store ends it on close. */
  ownsPool: boolean;
  /** Opens the dedicated LISTEN connection, or null: poll only. */
  makeListenClient: (() => pg.Client) | null;
}

/**
 * The store's connections: the caller's pool, or one of its own with the
 * options' timeouts; and how to open the LISTEN connection (not possible on a
 * pool that is not a `pg.Pool`, whose settings are unknown).
 */
export function openPool(options: PostgresStoreOptions, onError: (err: Error, source: 'pool') => void): OpenedPool {
  const clientConfig: pg.ClientConfig = {
    connectionString: options.connectionString,
    application_name: options.applicationName ?? 'fencegate',
    connectionTimeoutMillis: options.connectionTimeoutMs ?? 5_000,
    statement_timeout: options.statementTimeoutMs ?? 10_000,
    // The client side too, as the lease store's pool does: a round trip the
    // server never answers (a silent network, a COMMIT waiting for a standby
    // that is gone) fails after this, and the pool destroys its connection
    // (the query is still active on it) instead of reusing it.
    query_timeout: options.queryTimeoutMs ?? DEFAULT_QUERY_TIMEOUT_MS,
    keepAlive: true,
  };
  let opened: OpenedPool;
  if (options.pool !== undefined) {
    const pool = options.pool;
    const settings = pool instanceof pg.Pool ? (pool as pg.Pool & { options: pg.ClientConfig }).options : null;
    opened = { pool, ownsPool: false, makeListenClient: settings === null ? null : () => new pg.Client(settings) };
  } else {
    const own = new pg.Pool({ ...clientConfig, max: options.poolSize ?? 10 });
    // An idle connection that dies (pg_terminate_backend, a restart) emits
    // here; without a listener it would crash the process. The pool has
    // already dropped it and opens a new one on the next call.
    own.on('error', (err) => onError(err, 'pool'));
    opened = { pool: own, ownsPool: true, makeListenClient: () => new pg.Client(clientConfig) };
  }
  if (options.listen === false) opened.makeListenClient = null;
  return opened;
}

export async function ensureSchema(pool: PoolLike, schema: string): Promise<void> {
  try {
    await pool.query(`CREATE SCHEMA IF NOT EXISTS ${quoteIdent(schema)}`);
  } catch (err) {
    // Two replicas creating it at once: one of them loses the race, harmlessly.
    const code = (err as { code?: string }).code;
    if (code !== '23505' && code !== '42P06') throw err;
  }
}

/** The pool, with every connection handed to the migrator pointed at `schema` (and reset on release). */
export function inSchema(pool: PoolLike, schema: string): PoolLike {
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
