// The SQLite gateway store alone, through its public interface: one
// admission and one finish per request (new key, rising fence, one of 1000
// entities, serial mode), at --concurrency C (1: each decision its own
// transaction; 50: group commit forms groups). --schema before-0005 stops the
// migrations before 0005_lean_pages, to compare the two table layouts.
//
//   npm run build && node bench/store-pairs.mjs [--synchronous FULL|NORMAL] [--concurrency 50] [--requests 10000] [--schema before-0005]
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadMigrations } from '../dist/store/migrations.js';
import { SqliteGatewayStore, migrateSqlite, openSqlite } from '../dist/store/sqlite/index.js';
import { option } from './args.mjs';
import { pairRunner } from './store-pair.mjs';

const synchronous = option('synchronous', 'FULL');
const concurrency = Number(option('concurrency', 50));
const requests = Number(option('requests', 10000));
const schema = option('schema', 'current');

const dir = mkdtempSync(join(tmpdir(), 'fencegate-store-pairs-'));
const path = join(dir, 'gateway.db');
const db = openSqlite(path);
migrateSqlite(
  db,
  loadMigrations('sqlite').filter((m) => schema !== 'before-0005' || m.name < '0005'),
);
db.close();
const store = new SqliteGatewayStore({ path, synchronous, migrate: false });

const run = pairRunner(store, concurrency);

await run(1000); // warm-up
const t0 = process.hrtime.bigint();
const cpu0 = process.cpuUsage();
await run(requests);
const wall = Number(process.hrtime.bigint() - t0) / 1000 / requests;
const cpu = process.cpuUsage(cpu0);
const groups = store.group?.stats.groups ?? 0;
await store.close();
rmSync(dir, { recursive: true, force: true });
console.log(
  `${synchronous}, schema ${schema}, concurrency ${concurrency}: ${wall.toFixed(1)} µs per request (wall), ` +
    `${((cpu.user + cpu.system) / requests).toFixed(1)} µs CPU (${(cpu.system / requests).toFixed(1)} system), ${groups} transactions for ${requests + 1000} requests`,
);
