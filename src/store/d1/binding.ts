/**
 * The part of a D1 binding this store uses, typed structurally so that the
 * package depends neither on `@cloudflare/workers-types` nor on a runtime:
 * a real `D1Database` fits, and so does a test double.
 */
export interface D1ResultLike<T = Record<string, unknown>> {
  results?: T[];
  meta?: { changes?: number };
}
export interface D1PreparedStatementLike {
  bind(...values: unknown[]): D1PreparedStatementLike;
  all<T = Record<string, unknown>>(): Promise<D1ResultLike<T>>;
  run(): Promise<D1ResultLike>;
}
export interface D1DatabaseLike {
  prepare(query: string): D1PreparedStatementLike;
  /** Runs the statements in order as ONE transaction; any failure rolls back all of them. */
  batch(statements: D1PreparedStatementLike[]): Promise<D1ResultLike<any>[]>;
}

/** A statement of ../sqlite-dialect/ (or of this store) with its `@name` parameters bound. */
export type D1Bind = (sql: string, params: Record<string, unknown>) => D1PreparedStatementLike;

/**
 * Binds `@name` parameters to a statement prepared once per binder: D1 has
 * no named parameters, so `@name` becomes `?N` (the same N for every use of
 * the name). A parameter the statement names must be given; others are not bound.
 */
export function d1Binder(db: D1DatabaseLike): D1Bind {
  const statements = new Map<string, { stmt: D1PreparedStatementLike; names: string[] }>();
  return (sql, params) => {
    let prepared = statements.get(sql);
    if (prepared === undefined) {
      const names: string[] = [];
      const text = sql.replace(/@([a-z_]+)/g, (_m, name: string) => {
        let i = names.indexOf(name);
        if (i < 0) i = names.push(name) - 1;
        return `?${i + 1}`;
      });
      prepared = { stmt: db.prepare(text), names };
      statements.set(sql, prepared);
    }
    return prepared.stmt.bind(
      ...prepared.names.map((name) => {
        const v = params[name];
        if (v === undefined) throw new Error(`d1 store: parameter @${name} not given`);
        // D1 binds no BigInt: fences go as decimal text and are CAST in SQL.
        return typeof v === 'bigint' ? v.toString() : v;
      }),
    );
  };
}
