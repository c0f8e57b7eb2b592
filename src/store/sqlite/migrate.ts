import { loadMigrations, type Migration } from '../migrations.js';
import type { SqliteDatabase } from './open.js';

/**
 * Applies the pending `migrations/sqlite` files. Safe when several processes
 * start at once on the same file: the check and the apply happen inside one
 * `BEGIN IMMEDIATE` transaction, so the second process waits for the first
 * and then finds nothing left to do. Returns the names it applied.
 */
export function migrateSqlite(db: SqliteDatabase, migrations: Migration[] = loadMigrations('sqlite')): string[] {
  const applied: string[] = [];
  const run = db.transaction(() => {
    db.exec(`CREATE TABLE IF NOT EXISTS fencegate_migrations (
      name TEXT PRIMARY KEY NOT NULL,
      applied_at INTEGER NOT NULL
    ) STRICT`);
    const done = new Set(
      (db.prepare('SELECT name FROM fencegate_migrations').all() as { name: string }[]).map((r) => r.name),
    );
    const record = db.prepare(
      "INSERT INTO fencegate_migrations (name, applied_at) VALUES (?, CAST(unixepoch('subsec') * 1000 AS INTEGER))",
    );
    for (const m of migrations) {
      if (done.has(m.name)) continue;
      db.exec(m.sql);
      record.run(m.name);
      applied.push(m.name);
    }
  });
  run.immediate();
  return applied;
}
