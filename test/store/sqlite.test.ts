import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { SqliteGatewayStore } from '../../src/store/sqlite/index.js';
import { describeGatewayStoreConformance } from './conformance.js';
import { tempDir } from '../helpers/temp.js';

describeGatewayStoreConformance('sqlite (temp file, WAL)', async () => {
  const dir = tempDir('fencegate-conformance-').dir;
  const path = join(dir, 'gateway.db');
  const store = new SqliteGatewayStore({ path });
  return {
    store,
    async backdateRejections(ids, ms) {
      const update = store.db.prepare('UPDATE rejections SET at = at - ? WHERE id = ?');
      store.db.transaction(() => {
        for (const id of ids) update.run(ms, BigInt(id));
      })();
    },
    async backdate(table, column, ms, where) {
      store.db.prepare(`UPDATE ${table} SET ${column} = ${column} - ? WHERE ${where.column} = ?`).run(ms, where.value);
    },
    async forgetAttempt(key) {
      store.db.prepare('UPDATE idempotency_records SET attempt_until = NULL, request_id = NULL WHERE key = ?').run(key);
    },
    // Another process on the same file would open it the same way.
    openReplica: async () => new SqliteGatewayStore({ path }),
    async close() {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
});

// The same contract with one transaction per decision (groupCommit: false).
describeGatewayStoreConformance('sqlite (one transaction per decision)', async () => {
  const dir = tempDir('fencegate-conformance-').dir;
  const path = join(dir, 'gateway.db');
  const store = new SqliteGatewayStore({ path, groupCommit: false });
  return {
    store,
    async backdateRejections(ids, ms) {
      const update = store.db.prepare('UPDATE rejections SET at = at - ? WHERE id = ?');
      store.db.transaction(() => {
        for (const id of ids) update.run(ms, BigInt(id));
      })();
    },
    async backdate(table, column, ms, where) {
      store.db.prepare(`UPDATE ${table} SET ${column} = ${column} - ? WHERE ${where.column} = ?`).run(ms, where.value);
    },
    async forgetAttempt(key) {
      store.db.prepare('UPDATE idempotency_records SET attempt_until = NULL, request_id = NULL WHERE key = ?').run(key);
    },
    openReplica: async () => new SqliteGatewayStore({ path, groupCommit: false }),
    async close() {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
});
