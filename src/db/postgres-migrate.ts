import { checkLedger, type Ledger, type Migration } from './migrations.js';
import type { ClientLike, PoolLike } from './postgres-types.js';

/**
 * What runs after the migrations, in their transaction and under their lock:
 * the gateway re-applies its function files here (src/store/postgres/functions.ts).
 * `applied` are the migrations this run applied; returns more names applied.
 */
export type AfterMigrations = (client: ClientLike, applied: readonly string[]) => Promise<string[]>;

/**
 * Applies the pending `migrations` of one part in one transaction, recording
 * them in `ledger`. Safe when several replicas start at once: a
 * transaction-scoped advisory lock serialises them, and the second one finds
 * nothing left to do. The lock is keyed by the schema (so per-test schemas
 * do not contend) and is the same for both parts and for the releases before
 * the split, so a lease migrator adopting rows of the single ledger never
 * runs beside a migrator still writing it. Returns the names applied.
 */
export async function applyPostgresMigrations(pool: PoolLike, ledger: Ledger, migrations: Migration[], after?: AfterMigrations): Promise<string[]> {
  checkLedger(ledger);
  const client = await pool.connect();
  const applied: string[] = [];
  try {
    await client.query('BEGIN');
    await client.query("SELECT pg_advisory_xact_lock(hashtext('fencegate_migrations:' || current_schema()))");
    await client.query(`CREATE TABLE IF NOT EXISTS ${ledger.table} (
      name text PRIMARY KEY,
      applied_at timestamptz NOT NULL DEFAULT now()
    )`);
    const { rows } = await client.query<{ name: string }>(`SELECT name FROM ${ledger.table}`);
    const done = new Set(rows.map((r) => r.name));
    let adopt = false;
    if (ledger.adoptFrom !== undefined) {
      const { rows: found } = await client.query<{ t: string | null }>("SELECT to_regclass(quote_ident(current_schema()) || '.' || $1)::text AS t", [
        ledger.adoptFrom,
      ]);
      adopt = found[0]?.t != null;
    }
    for (const m of migrations) {
      if (done.has(m.name)) continue;
      if (adopt) {
        // Applied under the earlier ledger: recorded here with its original time, never run again.
        const taken = await client.query(`INSERT INTO ${ledger.table} (name, applied_at) SELECT name, applied_at FROM ${ledger.adoptFrom} WHERE name = $1`, [
          m.name,
        ]);
        if (taken.rowCount === 1) continue;
      }
      await client.query(m.sql);
      await client.query(`INSERT INTO ${ledger.table} (name) VALUES ($1)`, [m.name]);
      applied.push(m.name);
    }
    if (after !== undefined) applied.push(...(await after(client, applied)));
    await client.query('COMMIT');
    return applied;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    client.release();
  }
}
