import type { JobStore, JobStoreOptions, StoreDescriptor } from './types.js';

export interface OpenJobStoreOptions extends JobStoreOptions {
  /** Per-statement timeout (PostgreSQL client side; SQLite: the busy timeout). */
  statementTimeoutMs?: number;
}

/**
 * Opens a store from a serialisable descriptor: how the heartbeat thread
 * (and child processes) get their own connection to the runner's database.
 * Each backend is loaded on demand, so `pg` and `better-sqlite3` are only
 * loaded by programs that use them.
 *
 * @example
 * const store = await openJobStore({ sqlite: '/var/lib/app/jobs.db' });
 */
export async function openJobStore(descriptor: StoreDescriptor, options: OpenJobStoreOptions = {}): Promise<JobStore> {
  const { statementTimeoutMs, ...storeOptions } = options;
  if ('sqlite' in descriptor) {
    const { createSqliteJobStore } = await import('./sqlite/store.js');
    const busyTimeoutMs = statementTimeoutMs ?? descriptor.busyTimeoutMs;
    return createSqliteJobStore({
      ...storeOptions,
      path: descriptor.sqlite,
      ...(busyTimeoutMs === undefined ? {} : { busyTimeoutMs }),
    });
  }
  const { createPostgresJobStore } = await import('./postgres/store.js');
  return createPostgresJobStore({
    ...storeOptions,
    connectionString: descriptor.postgres,
    ...(descriptor.pooler === undefined ? {} : { pooler: descriptor.pooler }),
    ...(statementTimeoutMs === undefined ? {} : { queryTimeoutMs: statementTimeoutMs, connectionTimeoutMs: statementTimeoutMs }),
  });
}
