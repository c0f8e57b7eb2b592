// The structural `pg` types live with the database plumbing both the gateway
// and the lease module use (src/db/).
export type { ClientLike, PoolLike, QueryResultLike } from '../../db/postgres-types.js';
