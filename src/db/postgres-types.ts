/**
 * Structural types for the parts of `pg` fencegate uses, so that callers can
 * hand in their own `pg.Pool` (or a compatible pool) and the package never
 * forces a client on a bundle that does not need one.
 */
export interface QueryResultLike<R> {
  rows: R[];
  rowCount: number | null;
}

export interface ClientLike {
  query<R = any>(text: string, values?: unknown[]): Promise<QueryResultLike<R>>;
  release(err?: Error | boolean): void;
}

export interface PoolLike {
  query<R = any>(text: string, values?: unknown[]): Promise<QueryResultLike<R>>;
  connect(): Promise<ClientLike>;
  end(): Promise<void>;
}
