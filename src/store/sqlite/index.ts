export { SqliteGatewayStore, type SqliteStoreOptions } from './gateway-store.js';
export { openSqlite, type OpenSqliteOptions, type SqliteDatabase } from '../../db/sqlite-open.js';
export { migrateSqlite } from './migrate.js';

import { SqliteGatewayStore, type SqliteStoreOptions } from './gateway-store.js';

/**
 * Opens (and migrates) the embedded SQLite gateway store.
 * @example
 * const store = createSqliteStore({ path: './fencegate.db' }); // synchronous=FULL
 */
export function createSqliteStore(options: SqliteStoreOptions): SqliteGatewayStore {
  return new SqliteGatewayStore(options);
}
