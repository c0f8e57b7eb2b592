export {
  D1GatewayStore,
  type D1StoreOptions,
  type D1DatabaseLike,
  type D1PreparedStatementLike,
  type D1ResultLike,
} from './gateway-store.js';

import { D1GatewayStore, type D1StoreOptions } from './gateway-store.js';

/**
 * The gateway store on a Cloudflare D1 binding. The database must be
 * migrated with `migrations/gateway/sqlite` (`wrangler d1 migrations apply DB`);
 * this module never touches the file system.
 * @example
 * const store = createD1Store({ db: env.DB }); // pollMs: 100
 */
export function createD1Store(options: D1StoreOptions): D1GatewayStore {
  return new D1GatewayStore(options);
}
