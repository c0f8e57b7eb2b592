/**
 * `createFenceSource`: a per-job fence for any queue, kept in the queue's own
 * durable store (docs/queues.md).
 */
import type Database from 'better-sqlite3';
import type { PoolLike } from '../db/postgres-types.js';
import { LeaseError } from '../lease/errors.js';
import { migrateQueuePostgres, migrateQueueSqlite } from './migrate.js';
import { redisFenceSource, type RedisLike } from './redis-source.js';
import { postgresFenceSource, sqliteFenceSource } from './sql-source.js';
import type { FenceSource } from './types.js';

export type FenceSourceOptions =
  /** A `pg.Pool` (or compatible) on the queue's database; tables in its search_path. */
  | { postgres: PoolLike; migrate?: boolean }
  /** A better-sqlite3 database: the queue's file. */
  | { sqlite: Database.Database; migrate?: boolean }
  /** An ioredis client on the queue's Redis. Keys under `namespace` (default `fencegate:queue`), each job id's kept `keyTtlMs` after its last fence (default 100 days). */
  | { redis: RedisLike; namespace?: string; keyTtlMs?: number | null };

/**
 * Opens a fence source. On SQL backends it applies the queue migrations
 * first (`migrate: false` to skip, e.g. when a deploy step ran them).
 *
 * @example
 * const fences = await createFenceSource({ redis: new IORedis(url) });
 * const r = await fences.begin({ queue: 'payments', id: job.id });
 * if (r.ok) console.log('fence', r.fence);
 */
export async function createFenceSource(options: FenceSourceOptions): Promise<FenceSource> {
  if ('postgres' in options) {
    if (options.migrate !== false) await migrateQueuePostgres(options.postgres);
    return postgresFenceSource(options.postgres);
  }
  if ('sqlite' in options) {
    if (options.migrate !== false) migrateQueueSqlite(options.sqlite);
    return sqliteFenceSource(options.sqlite);
  }
  if ('redis' in options) return redisFenceSource(options.redis, { namespace: options.namespace, keyTtlMs: options.keyTtlMs });
  throw new LeaseError('invalid_config', 'createFenceSource needs one of postgres, sqlite or redis');
}
