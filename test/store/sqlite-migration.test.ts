/**
 * Migration 0005 (fewer B-tree pages per decision) rebuilds three tables of a
 * database that may already hold state. A gateway upgraded in place must keep
 * every guarantee across the upgrade: the fences it accepted, the responses
 * it stored, the serial slot in flight, the fence history.
 */
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { loadMigrations } from '../../src/store/migrations.js';
import { SqliteGatewayStore, migrateSqlite, openSqlite } from '../../src/store/sqlite/index.js';
import { command, finishOf, response } from './conformance.js';
import { tempDir } from '../helpers/temp.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/**
 * A database file at the schema before migration `next`, holding the state
 * `write` leaves through the store, as a gateway of an earlier release left it.
 *
 * The store is today's, and it writes `rejections.client_request_id` (0006),
 * `rejections.tool` (0009) and the record's attempt columns (0010), columns
 * an earlier release's file does not have: each exists while `write` runs and
 * is dropped again, so that the file is the earlier schema, rows included,
 * when the migrations under test run.
 */
const LATER_COLUMNS: [migration: string, table: string, column: string][] = [
  ['0006', 'rejections', 'client_request_id TEXT'],
  ['0009', 'rejections', 'tool TEXT'],
  ['0010', 'idempotency_records', 'attempt_until INTEGER'],
  ['0010', 'idempotency_records', 'request_id TEXT'],
  ['0010', 'idempotency_records', 'reconcile_result TEXT'],
  ['0010', 'idempotency_records', 'reconciled_at INTEGER'],
];

const COMMANDS_TABLE =
  'CREATE TABLE commands (id INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL, route TEXT, method TEXT, path TEXT, entity TEXT, fence INTEGER, idempotency_key TEXT, scope TEXT, caller TEXT, tool TEXT, outcome TEXT NOT NULL, decision TEXT, status INTEGER, upstream_ms REAL, request_id TEXT, client_request_id TEXT, payload_sha256 TEXT)';

async function databaseBefore(next: string, write: (store: SqliteGatewayStore) => Promise<void>): Promise<string> {
  const dir = tempDir('fencegate-migration-').dir;
  dirs.push(dir);
  const path = join(dir, 'gateway.db');
  const db = openSqlite(path);
  migrateSqlite(
    db,
    loadMigrations('sqlite').filter((m) => m.name < next),
  );
  const shim = LATER_COLUMNS.filter(([m]) => next <= m).map(([, t, c]) => [t, c] as const);
  for (const [t, c] of shim) db.exec(`ALTER TABLE ${t} ADD COLUMN ${c}`);
  // Today's store prepares its command-log insert (0011): the table exists while `write` runs.
  const commands = next <= '0011';
  if (commands) db.exec(COMMANDS_TABLE);
  db.close();
  const store = new SqliteGatewayStore({ path, migrate: false });
  try {
    await write(store);
  } finally {
    await store.close();
  }
  if (shim.length > 0 || commands) {
    const after = openSqlite(path);
    for (const [t, c] of shim) after.exec(`ALTER TABLE ${t} DROP COLUMN ${c.split(' ')[0]}`);
    if (commands) after.exec('DROP TABLE commands');
    after.close();
  }
  return path;
}

describe('sqlite migration 0005_lean_pages', () => {
  it('keeps fences, stored responses, the serial slot in flight and the fence history', async () => {
    const body = new Uint8Array(5000).map((_, i) => i % 251); // larger than a page
    const done = command({ entity: 'acct:2', fence: 7n, key: 'k-done' });
    const rise = command({ entity: 'acct:1', fence: 9n, key: 'k-rise' });
    const path = await databaseBefore('0005', async (before) => {
      expect((await before.admit(done)).outcome).toBe('forward');
      await before.finish(finishOf(done, 'completed', response({ body })));
      const first = command({ entity: 'acct:1', fence: 5n });
      expect((await before.admit(first)).outcome).toBe('forward');
      await before.finish(finishOf(first, 'completed'));
      expect((await before.admit(rise)).outcome).toBe('forward'); // still in flight: holds acct:1's slot
      expect((await before.admit(command({ entity: 'acct:1', fence: 3n }))).outcome).toBe('stale-fence');
    });

    const after = new SqliteGatewayStore({ path }); // applies 0005 and what follows
    try {
      const tables = after.db.prepare("SELECT name, sql FROM sqlite_master WHERE type IN ('table', 'index') AND name NOT LIKE 'sqlite_%'").all() as {
        name: string;
        sql: string | null;
      }[];
      const sql = new Map(tables.map((t) => [t.name, t.sql ?? '']));
      expect(sql.get('fence_entities')).toMatch(/WITHOUT ROWID/);
      expect(sql.get('fence_history')).toMatch(/WITHOUT ROWID/);
      expect(sql.get('idempotency_records')).toMatch(/PRIMARY KEY \(key, scope\)/);
      expect(sql.has('idempotency_records_by_key')).toBe(false);
      expect([...sql.keys()].filter((n) => n.endsWith('_lean'))).toEqual([]);

      // The fence survived: 8 is still stale, and the entity shows 9.
      expect(await after.admit(command({ entity: 'acct:1', fence: 8n }))).toEqual({ outcome: 'stale-fence', currentFence: 9n });
      expect((await after.getEntity('acct:1'))?.fence).toBe('9');
      // The slot of the request in flight survived: a higher fence waits for it.
      expect((await after.admit(command({ entity: 'acct:1', fence: 10n }))).outcome).toBe('entity-busy');
      // That request's owner can still finish it.
      expect(await after.finish(finishOf(rise, 'completed'))).toEqual({ recorded: true });
      // The stored response replays byte for byte (its fence is still the entity's current one).
      const replay = await after.admit({ ...done, ownerToken: 'owner-retry' });
      expect(replay.outcome).toBe('replay');
      if (replay.outcome === 'replay') expect(Buffer.from(replay.response.body).equals(Buffer.from(body))).toBe(true);
      // Lookups by key alone now use the primary key.
      expect((await after.getRecords('k-done')).map((r) => r.state)).toEqual(['completed']);
      const plan = after.db.prepare("EXPLAIN QUERY PLAN SELECT * FROM idempotency_records WHERE key = 'k-done' ORDER BY scope").all() as { detail: string }[];
      expect(plan.map((p) => p.detail).join(' ')).toMatch(/INDEX sqlite_autoindex_idempotency_records_1 \(key=\?\)/);
      // The history of rises, highest first; none for the stale fences. (10
      // was accepted, then answered entity-busy: the fence check comes first.)
      const history = await after.getFenceHistory('acct:1', { limit: 10 });
      expect(history.items.map((h) => h.fence)).toEqual(['10', '9', '5']);
      // New rises append after the migrated ones.
      expect((await after.admit(command({ entity: 'acct:1', fence: 11n }))).outcome).toBe('forward');
      expect((await after.getFenceHistory('acct:1', { limit: 10 })).items.map((h) => h.fence)).toEqual(['11', '10', '9', '5']);
    } finally {
      await after.close();
    }
  });
});

describe('sqlite migration 0006_client_request_id_retention', () => {
  it('upgrades in place: old rejections read with client_request_id null, fences and slots intact, the sweeps use their indexes', async () => {
    const rise = command({ entity: 'acct:1', fence: 9n, key: 'k-rise' });
    const path = await databaseBefore('0006', async (before) => {
      const first = command({ entity: 'acct:1', fence: 5n });
      expect((await before.admit(first)).outcome).toBe('forward');
      await before.finish(finishOf(first, 'completed'));
      expect((await before.admit(rise)).outcome).toBe('forward'); // in flight: holds acct:1's slot
      expect((await before.admit(command({ entity: 'acct:1', fence: 3n }))).outcome).toBe('stale-fence');
    });
    const cols = (p: string) => {
      const db = openSqlite(p);
      try {
        return (db.prepare('PRAGMA table_info(rejections)').all() as { name: string }[]).map((c) => c.name);
      } finally {
        db.close();
      }
    };
    expect(cols(path)).not.toContain('client_request_id');

    const after = new SqliteGatewayStore({ path }); // applies 0006
    try {
      expect(cols(path)).toContain('client_request_id');
      const [old] = (await after.listRejections({ entity: 'acct:1', limit: 10 })).items;
      expect(old).toMatchObject({ reason: 'stale-fence', presentedFence: '3', currentFence: '9', clientRequestId: null });
      expect(await after.admit(command({ entity: 'acct:1', fence: 8n }))).toEqual({ outcome: 'stale-fence', currentFence: 9n });
      expect((await after.admit(command({ entity: 'acct:1', fence: 10n }))).outcome).toBe('entity-busy');
      expect(await after.finish(finishOf(rise, 'completed'))).toEqual({ recorded: true });
      // A new row keeps the client's id.
      await after.recordRejection({
        reason: 'unauthorized',
        entity: 'acct:1',
        presentedFence: null,
        currentFence: null,
        idempotencyKey: null,
        audit: { ...rise.audit, clientRequestId: 'theirs' },
      });
      expect((await after.listRejections({ entity: 'acct:1', limit: 1 })).items[0]).toMatchObject({ reason: 'unauthorized', clientRequestId: 'theirs' });
      const plan = (sql: string) => (after.db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all() as { detail: string }[]).map((p) => p.detail).join(' ');
      expect(plan('SELECT entity FROM fence_entities WHERE accepted_at < 1 LIMIT 10')).toMatch(/fence_entities_accepted/);
      expect(plan('SELECT entity, fence FROM fence_history WHERE at < 1 LIMIT 10')).toMatch(/fence_history_at/);
      expect(plan('SELECT id FROM operator_actions WHERE at < 1 LIMIT 10')).toMatch(/operator_actions_at/);
      // The upgraded file sweeps its forgotten entities (all of acct:1's, once they are old enough).
      after.db.prepare('UPDATE fence_entities SET accepted_at = accepted_at - 7200000').run();
      const r = await after.sweep({ rejectionRetentionMs: 3_600_000, entityRetentionMs: 3_600_000 });
      expect(r.oldEntities).toBe(1);
      expect(await after.getEntity('acct:1')).toBeNull();
    } finally {
      await after.close();
    }
  });
});
