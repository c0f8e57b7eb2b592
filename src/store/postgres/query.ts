import { createHash } from 'node:crypto';
import type { RoundTripHealth } from './health.js';
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
 * Each round trip's fate tells `health` whether the database answers.
 */
export function poolQuery(pool: PoolLike, closed: () => boolean, health?: RoundTripHealth): Query {
  return <R>(text: string, values: unknown[], prepared = true) => {
    if (closed()) return Promise.reject(new Error('the PostgreSQL gateway store is closed'));
    const sent = prepared
      ? (pool as unknown as { query(q: { name: string; text: string; values: unknown[] }): Promise<{ rows: R[] }> }).query({
          name: statementName(text),
          text,
          values,
        })
      : pool.query<R>(text, values);
    if (health === undefined) return sent;
    return sent.then(
      (r) => {
        health.answered();
        return r;
      },
      (err: unknown) => {
        health.failed(err);
        throw err;
      },
    );
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
