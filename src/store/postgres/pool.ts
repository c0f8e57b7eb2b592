import pg from 'pg';
import { configuredPool, transactionPooled } from '../../db/postgres-pool.js';
import { DEFAULT_QUERY_TIMEOUT_MS, type PgStoreNotice, type PostgresStoreOptions } from './options.js';
import { quoteIdent } from './text.js';
import type { ClientLike, PoolLike } from './types.js';

export interface OpenedPool {
  pool: PoolLike;
  /** The store opened it, so the store ends it on close. */
  ownsPool: boolean;
  /** Opens the dedicated LISTEN connection, or null: poll only. */
  makeListenClient: (() => pg.Client) | null;
  /** What the store must tell the log at start (a transaction pooler without a LISTEN URL). */
  notices: PgStoreNotice[];
}

/**
 * The store's connections: the caller's pool, or one of its own with the
 * options' timeouts; and how to open the LISTEN connection (not possible on a
 * pool that is not a `pg.Pool`, whose settings are unknown).
 *
 * No setting travels as a startup parameter but `application_name` (the one
 * PgBouncer passes on): `statement_timeout` there is refused by a stock
 * PgBouncer ("unsupported startup parameter"), and with
 * `ignore_startup_parameters` it would be dropped silently. So it is SET on
 * each new connection, or, behind a transaction pooler, SET LOCAL in each
 * transaction (transactionPooled in src/db/postgres-pool.ts): a session SET
 * there lands on whichever server connection is free, and stays on it for
 * other clients.
 */
export function openPool(options: PostgresStoreOptions, onError: (err: Error, source: 'pool') => void): OpenedPool {
  const clientConfig: pg.ClientConfig = {
    connectionString: options.connectionString,
    application_name: options.applicationName ?? 'fencegate',
    connectionTimeoutMillis: options.connectionTimeoutMs ?? 5_000,
    // The client side too, as the lease store's pool does: a round trip the
    // server never answers (a silent network, a COMMIT waiting for a standby
    // that is gone) fails after this, and the pool destroys its connection
    // (the query is still active on it) instead of reusing it.
    query_timeout: options.queryTimeoutMs ?? DEFAULT_QUERY_TIMEOUT_MS,
    keepAlive: true,
  };
  const transaction = options.pooler === 'transaction';
  const notices: PgStoreNotice[] = [];
  let opened: OpenedPool;
  if (options.pool !== undefined) {
    const given = options.pool;
    const own = given instanceof pg.Pool ? (given as pg.Pool & { options: pg.ClientConfig }).options : null;
    // Your pool's settings are yours; behind a transaction pooler its statements must still go unnamed.
    if (transaction && !(given instanceof pg.Pool)) throw new Error('pooler "transaction" needs a connectionString or a pg.Pool');
    const pool = transaction ? transactionPooled(given as pg.Pool, null) : given;
    opened = { pool, ownsPool: false, makeListenClient: own === null ? null : () => new pg.Client(own), notices };
  } else {
    const pool = configuredPool(
      { ...clientConfig, max: options.poolSize ?? 10 },
      { statementTimeoutMs: options.statementTimeoutMs ?? 10_000, pooler: options.pooler },
      (err) => onError(err, 'pool'),
    );
    opened = { pool, ownsPool: true, makeListenClient: () => new pg.Client(clientConfig), notices };
  }
  if (options.listenConnectionString !== undefined) {
    const listenConfig = { ...clientConfig, connectionString: options.listenConnectionString };
    opened.makeListenClient = () => new pg.Client(listenConfig);
  } else if (transaction && options.listen !== false) {
    // LISTEN belongs to a session; through a transaction pooler it would be
    // registered on a server connection that then serves other clients, and
    // the notifications would never arrive: poll instead, and say so.
    opened.makeListenClient = null;
    notices.push({
      level: 'warn',
      msg: 'listen-unavailable',
      fields: {
        reason: 'pooler "transaction" and no listenUrl: cross-replica wake-ups poll instead of LISTEN (set store.listenUrl to a direct or session-pooled URL)',
      },
    });
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

/**
 * The pool, with every connection handed to the migrator pointed at `schema`
 * (and reset on release). Behind a transaction pooler a session SET would
 * land on another server connection than the migration's transaction, so
 * there the search_path is SET LOCAL right after the migrator's BEGIN.
 */
export function inSchema(pool: PoolLike, schema: string, pooler?: 'session' | 'transaction'): PoolLike {
  const setPath = `search_path TO ${quoteIdent(schema)}`;
  return {
    query: (text, values) => pool.query(text, values),
    end: () => pool.end(),
    async connect(): Promise<ClientLike> {
      const client = await pool.connect();
      if (pooler === 'transaction') {
        return {
          query: (text, values) => client.query(values === undefined && /^\s*BEGIN\b/i.test(text) ? `${text}; SET LOCAL ${setPath}` : text, values),
          release: (err) => client.release(err),
        };
      }
      try {
        await client.query(`SET ${setPath}`);
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
