import { loadMigrations, type Migration } from '../migrations.js';
import type { PoolLike } from './types.js';

/**
 * Applies the pending `migrations/postgres` files in one transaction.
 * Safe when several replicas start at once: a transaction-scoped advisory
 * lock (keyed by the schema, so per-test schemas do not contend) serialises
 * them, and the second one finds nothing left to do. Returns the names applied.
 */
export async function migratePostgres(pool: PoolLike, migrations: Migration[] = loadMigrations('postgres')): Promise<string[]> {
  const client = await pool.connect();
  const applied: string[] = [];
  try {
    await client.query('BEGIN');
    await client.query("SELECT pg_advisory_xact_lock(hashtext('fencegate_migrations:' || current_schema()))");
    await client.query(`CREATE TABLE IF NOT EXISTS fencegate_migrations (
      name text PRIMARY KEY,
      applied_at timestamptz NOT NULL DEFAULT now()
    )`);
    const { rows } = await client.query<{ name: string }>('SELECT name FROM fencegate_migrations');
    const done = new Set(rows.map((r) => r.name));
    for (const m of migrations) {
      if (done.has(m.name)) continue;
      await client.query(m.sql);
      await client.query('INSERT INTO fencegate_migrations (name) VALUES ($1)', [m.name]);
      applied.push(m.name);
    }
    await client.query('COMMIT');
    return applied;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    client.release();
  }
}
