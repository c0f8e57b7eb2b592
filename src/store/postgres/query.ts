import { createHash } from 'node:crypto';
import { quoteIdent } from './text.js';
import type { PoolLike } from './types.js';

/** One statement on the store's pool, with its rows. */
export type Query = <R>(text: string, values: unknown[], prepared?: boolean) => Promise<{ rows: R[] }>;

/** What each part of the store (admit, finish, reads, audit, sweep) is handed. */
export interface PgContext {
  query: Query;
  /** A table or function name qualified with the store's schema (or bare, for the search_path). */
  table(name: string): string;
}

/**
 * The store's one way to the database: one statement, never retried (an
 * admission whose commit acknowledgement was lost would otherwise meet its
 * own record). Hot-path statements are named, so each connection parses and
 * plans them once; the name carries a hash of the text, so two stores on
 * different schemas can share a pool. Refused once the store is closing.
 */
export function poolQuery(pool: PoolLike, closed: () => boolean): Query {
  return <R>(text: string, values: unknown[], prepared = true) => {
    if (closed()) return Promise.reject(new Error('the PostgreSQL gateway store is closed'));
    if (!prepared) return pool.query<R>(text, values);
    const named = { name: statementName(text), text, values };
    return (pool as unknown as { query(q: typeof named): Promise<{ rows: R[] }> }).query(named);
  };
}

/** `"schema".name`, or the bare name when the store follows the search_path (`schema` null). */
export function qualifier(schema: string | null): (name: string) => string {
  const prefix = schema === null ? '' : `${quoteIdent(schema)}.`;
  return (name) => `${prefix}${name}`;
}

const statementNames = new Map<string, string>();
function statementName(text: string): string {
  let name = statementNames.get(text);
  if (name === undefined) statementNames.set(text, (name = `fencegate_${createHash('sha1').update(text).digest('hex').slice(0, 16)}`));
  return name;
}
