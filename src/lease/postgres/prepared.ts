import { createHash } from 'node:crypto';
import type { PoolLike } from '../../db/postgres-types.js';
import type { LeaseRef } from '../types.js';

/**
 * A statement's name for the server: a hash of its text, so each connection
 * parses and plans a hot-path statement once instead of on every call. The
 * claim's parse and plan cost more server CPU than running it: 1.46 → 0.56 ms
 * per claim, 0.82 → 0.45 ms per complete, once prepared (docs/bench-lease.md).
 * Same text, same name: stores on different schemas may share a pool, since
 * PostgreSQL re-parses a prepared statement when the search_path changes.
 */
const statementNames = new Map<string, string>();
function statementName(text: string): string {
  let name = statementNames.get(text);
  if (name === undefined) {
    name = `fencegate_lease_${createHash('sha1').update(text).digest('hex').slice(0, 16)}`;
    statementNames.set(text, name);
  }
  return name;
}

/** Runs a hot-path statement, named (prepared once per connection). */
export type Prepared = <R>(text: string, values: unknown[]) => Promise<{ rows: R[] }>;

/** `pg` accepts a query config object; PoolLike only declares text and values. */
export function preparedOn(pool: PoolLike): Prepared {
  return <R>(text: string, values: unknown[]) =>
    (pool as unknown as { query(q: { name: string; text: string; values: unknown[] }): Promise<{ rows: R[] }> }).query({
      name: statementName(text),
      text,
      values,
    });
}

/** The ownership parameters ($1 id, $2 owner, $3 token) of every statement on a claimed job. */
export const owned = (lease: LeaseRef) => [lease.id, lease.ownerId, lease.fencingToken];
