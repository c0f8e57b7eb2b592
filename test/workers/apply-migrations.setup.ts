// setupFiles for the workerd tests: runs inside workerd before each test
// file. Applies migrations/gateway/sqlite (read in Node by the config) to the local
// D1 binding, as `wrangler d1 migrations apply` does; applied names are
// recorded, so a second run is a no-op.
import { applyD1Migrations } from 'cloudflare:test';
import { env } from 'cloudflare:workers';

await applyD1Migrations(env.DB, env.TEST_MIGRATIONS);
