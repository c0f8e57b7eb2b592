import pg from 'pg';
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
 * transaction (transactionPooled below): a session SET there lands on
 * whichever server connection is free, and stays on it for other clients.
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
    const pool = configuredPool({ ...clientConfig, max: options.poolSize ?? 10 }, { statementTimeoutMs: options.statementTimeoutMs ?? 10_000, pooler: options.pooler }, (err) => onError(err, 'pool'));
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
      fields: { reason: 'pooler "transaction" and no listenUrl: cross-replica wake-ups poll instead of LISTEN (set store.listenUrl to a direct or session-pooled URL)' },
    });
  }
  if (options.listen === false) opened.makeListenClient = null;
  return opened;
}

/**
 * A pool of the store's own (the gateway's, the lease store's) with its
 * session settings applied after connecting, never as startup parameters
 * (openPool above says why): SET on each new connection, or behind a
 * transaction pooler SET LOCAL in each statement's transaction
 * (transactionPooled below). `statementTimeoutMs` null: the server's.
 */
export function configuredPool(
  config: pg.PoolConfig,
  settings: { statementTimeoutMs: number | null; pooler?: 'session' | 'transaction' | undefined },
  onError: (err: Error) => void,
): PoolLike & Pick<pg.Pool, 'totalCount' | 'idleCount' | 'waitingCount'> {
  const ms = settings.statementTimeoutMs;
  if (ms !== null && (!Number.isSafeInteger(ms) || ms < 0)) throw new Error(`the statement timeout must be a whole number of milliseconds ≥ 0, got ${ms}`);
  const own = new pg.Pool(config);
  // An idle connection that dies (pg_terminate_backend, a restart) emits
  // here; without a listener it would crash the process. The pool has
  // already dropped it and opens a new one on the next call.
  own.on('error', onError);
  const set = ms === null ? null : `statement_timeout = ${ms}`;
  if (settings.pooler === 'transaction') return transactionPooled(own, set === null ? null : `SET LOCAL ${set}`);
  // Queued on a new connection before anything the pool hands it out for.
  if (set !== null) own.on('connect', (client) => void client.query(`SET ${set}`).catch(onError));
  return own;
}

/**
 * The pool as a transaction pooler needs it (PgBouncer `pool_mode =
 * transaction`): each statement runs in a transaction of its own, which
 * starts with the session settings SET LOCAL, so they hold for exactly the
 * statement whatever server connection the pooler lends; statements are
 * never named (a statement prepared on one server connection is unknown on
 * the next); and a client checked out (the migrator) gets the settings after
 * its BEGIN. With settings, costs two round trips more per statement (BEGIN
 * with the settings, then COMMIT); docs/deploy-postgres.md "Through
 * PgBouncer" has the figures. Without (`setLocal` null), a statement is sent
 * alone, unnamed.
 */
export function transactionPooled(pool: pg.Pool, setLocal: string | null): PoolLike & Pick<pg.Pool, 'totalCount' | 'idleCount' | 'waitingCount'> {
  const unnamed = (text: unknown) => (typeof text === 'object' && text !== null ? { ...(text as pg.QueryConfig), name: undefined } : text);
  const onClient = (client: pg.PoolClient): ClientLike => ({
    query: (text, values) => {
      const plain = unnamed(text);
      if (setLocal !== null && typeof plain === 'string' && /^\s*BEGIN\b/i.test(plain) && values === undefined) return client.query(`${plain}; ${setLocal}`) as never;
      return client.query(plain as string, values) as never;
    },
    release: (err) => client.release(err),
  });
  return {
    get totalCount() {
      return pool.totalCount;
    },
    get idleCount() {
      return pool.idleCount;
    },
    get waitingCount() {
      return pool.waitingCount;
    },
    end: () => pool.end(),
    connect: async () => onClient(await pool.connect()),
    async query(text, values) {
      // Nothing to SET LOCAL: the statement's implicit transaction is enough.
      if (setLocal === null) return pool.query(unnamed(text) as string, values) as never;
      const client = await pool.connect();
      let begun = false;
      try {
        await client.query(`BEGIN; ${setLocal}`);
        begun = true;
        const result = await client.query(unnamed(text) as string, values);
        await client.query('COMMIT');
        client.release();
        return result as never;
      } catch (err) {
        // An ERROR leaves the transaction open and aborted: end it before the
        // connection goes back (the pooler keeps the server connection tied
        // to us until then). A broken connection is dropped instead.
        const broken = !begun || !(err instanceof Error && 'severity' in err);
        if (broken) client.release(err as Error);
        else await client.query('ROLLBACK').then(() => client.release(), (e: Error) => client.release(e));
        throw err;
      }
    },
  };
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
