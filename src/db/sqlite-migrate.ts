import type Database from 'better-sqlite3';
import { checkLedger, type Ledger, type Migration } from './migrations.js';

/**
 * Applies the pending `migrations` of one part, recording them in `ledger`.
 * Safe when several processes start at once on the same file: the check and
 * the apply happen inside one `BEGIN IMMEDIATE` transaction, so the second
 * process waits for the first and then finds nothing left to do. Returns the
 * names it applied (not those adopted from `ledger.adoptFrom`).
 */
export function applySqliteMigrations(db: Database.Database, ledger: Ledger, migrations: Migration[]): string[] {
  checkLedger(ledger);
  const applied: string[] = [];
  const run = db.transaction(() => {
    db.exec(`CREATE TABLE IF NOT EXISTS ${ledger.table} (
      name TEXT PRIMARY KEY NOT NULL,
      applied_at INTEGER NOT NULL
    ) STRICT`);
    const done = new Set((db.prepare(`SELECT name FROM ${ledger.table}`).all() as { name: string }[]).map((r) => r.name));
    const adopt = ledger.adoptFrom !== undefined && hasTable(db, ledger.adoptFrom) ? ledger.adoptFrom : null;
    const earlier =
      adopt === null
        ? new Map<string, number>()
        : new Map((db.prepare(`SELECT name, applied_at FROM ${adopt}`).all() as { name: string; applied_at: number }[]).map((r) => [r.name, r.applied_at]));
    const adoptRow = db.prepare(`INSERT INTO ${ledger.table} (name, applied_at) VALUES (?, ?)`);
    const record = db.prepare(`INSERT INTO ${ledger.table} (name, applied_at) VALUES (?, CAST(unixepoch('subsec') * 1000 AS INTEGER))`);
    for (const m of migrations) {
      if (done.has(m.name)) continue;
      const at = earlier.get(m.name);
      if (at !== undefined) {
        // Applied under the earlier ledger: recorded here with its original time, never run again.
        adoptRow.run(m.name, at);
        continue;
      }
      db.exec(m.sql);
      record.run(m.name);
      applied.push(m.name);
    }
  });
  run.immediate();
  return applied;
}

function hasTable(db: Database.Database, name: string): boolean {
  return db.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?").get(name) !== undefined;
}
