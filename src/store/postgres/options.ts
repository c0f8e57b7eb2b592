import type { PoolLike } from './types.js';

export { DEFAULT_QUERY_TIMEOUT_MS } from '../query-timeout.js';

/** `createPostgresStore`'s options (./index.ts). */
export interface PostgresStoreOptions {
  /** `postgres://…`. Either this or `pool`. */
  connectionString?: string;
  /**
   * Bring your own pool (`pg.Pool` or compatible). The store never ends it.
   * LISTEN needs a dedicated connection: with a `pg.Pool` the store opens one
   * with the pool's settings; with another pool it falls back to polling.
   */
  pool?: PoolLike;
  /** Connections in the store's own pool (the LISTEN connection comes on top). Default 10. */
  poolSize?: number;
  /**
   * Schema that holds the tables (created and migrated if missing). Default:
   * the connection's search_path. Statements name it explicitly, so a shared
   * pool with another search_path works too.
   */
  schema?: string;
  /** Apply pending migrations on open. Default true. */
  migrate?: boolean;
  /** LISTEN/NOTIFY for cross-replica wake-ups. Default true. */
  listen?: boolean;
  /** Poll fallback for waiters. Default 500 ms with LISTEN, 50 ms without. */
  pollMs?: number;
  /** A store call fails (→ 503 store-unavailable) after this long without a connection. Default 5000 ms. */
  connectionTimeoutMs?: number;
  /**
   * What sits between the store and the server (docs/deploy-postgres.md
   * "Through PgBouncer"). Absent or `session`: a direct connection or a
   * session-pooling pooler; settings are SET once per connection.
   * `transaction`: a transaction-pooling pooler (PgBouncer
   * `pool_mode = transaction`): no named prepared statements, every store
   * statement in its own transaction with its settings SET LOCAL, and LISTEN
   * only on `listenConnectionString` (else polling, with a warning).
   */
  pooler?: 'session' | 'transaction';
  /**
   * Where the LISTEN connection goes instead of `connectionString`: a direct
   * (or session-pooled) URL of the same database, for `pooler: "transaction"`.
   */
  listenConnectionString?: string;
  /**
   * Server-side statement_timeout for the store's own connections, SET after
   * connecting (a startup parameter would be refused by PgBouncer). Default 10000 ms.
   */
  statementTimeoutMs?: number;
  /**
   * How often the store reads whether its server replicates synchronously
   * (./replication-check.ts; docs/deploy-postgres.md "Replication and
   * failover"): at start, then every this many ms. `false`: never. Default 60000.
   */
  replicationCheckMs?: number | false;
  /**
   * Client-side bound of every round trip on the store's own connections
   * (node-postgres `query_timeout`), COMMIT included, which `statement_timeout`
   * does not cover and which a silent network never delivers. Past it the call
   * fails (→ 503 store-unavailable, an admission is released in the background,
   * a finish is retried) and its connection is destroyed, not returned to the
   * pool. Default 15000 ms (above `statementTimeoutMs`, so that the server's own
   * timeout answers first when it can). A `pool` you bring keeps its own settings.
   */
  queryTimeoutMs?: number;
  /** Shown in pg_stat_activity. Default `fencegate`. */
  applicationName?: string;
  /**
   * Connection faults seen while no call was running (an idle pooled
   * connection dropped, the listener lost): the pool and the listener
   * recover by themselves, this is for logs. Default: ignored.
   */
  onError?: (err: Error, source: 'pool' | 'listener') => void;
  /**
   * The store's round trips stopped being answered (`healthy` false, with the
   * fault) or are answered again (true): see `PostgresGatewayStore.healthy`.
   * Called on each change only. Default: ignored.
   */
  onHealth?: (healthy: boolean, err: Error | null) => void;
}

/** A line for the gateway's log (src/entry/node.ts logs every one; the store holds no logger). */
export interface PgStoreNotice {
  level: 'info' | 'warn';
  msg: string;
  fields: Record<string, unknown>;
}
