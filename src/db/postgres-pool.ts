// The PostgreSQL pools fencegate opens itself, for the gateway store
// (src/store/postgres/pool.ts) and the lease store (src/lease/postgres/store.ts)
// alike: database plumbing below both, so that the lease module opens its
// pool without loading the gateway store.
import pg from 'pg';
import type { ClientLike, PoolLike } from './postgres-types.js';

/**
 * A pool of the store's own (the gateway's, the lease store's) with its
 * session settings applied after connecting, never as startup parameters
 * (src/store/postgres/pool.ts, openPool, says why): SET on each new
 * connection, or behind a transaction pooler SET LOCAL in each statement's
 * transaction (transactionPooled below). `statementTimeoutMs` null: the server's.
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
      if (setLocal !== null && typeof plain === 'string' && /^\s*BEGIN\b/i.test(plain) && values === undefined)
        return client.query(`${plain}; ${setLocal}`) as never;
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
        else
          await client.query('ROLLBACK').then(
            () => client.release(),
            (e: Error) => client.release(e),
          );
        throw err;
      }
    },
  };
}
