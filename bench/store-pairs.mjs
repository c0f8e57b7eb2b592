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

const synchronous = option('synchronous', 'FULL');
const concurrency = Number(option('concurrency', 50));
const requests = Number(option('requests', 10000));
const schema = option('schema', 'current');

const dir = mkdtempSync(join(tmpdir(), 'fencegate-store-pairs-'));
const path = join(dir, 'gateway.db');
const db = openSqlite(path);
migrateSqlite(db, loadMigrations('sqlite').filter((m) => schema !== 'before-0005' || m.name < '0005'));
db.close();
const store = new SqliteGatewayStore({ path, synchronous, migrate: false });

const body = new Uint8Array(34).fill(65);
let seq = 0;
async function one() {
  const k = ++seq;
  const entity = `bench:${k % 1000}`;
  const ownerToken = `owner-${k}-0000-0000-0000-000000000000`;
  const audit = { caller: null, method: 'POST', path: '/payments/charges', payloadSha256: 'ab'.repeat(32), requestId: `req-${k}` };
  const input = { scope: 'payments', key: `key-${k}`, entity, fence: BigInt(k), fingerprint: 'f'.repeat(64), mode: 'serial', ownerToken, lockMs: 30_000, retentionMs: 86_400_000, onUnknown: 'reject', audit };
  const admission = await store.admit(input);
  if (admission.outcome !== 'forward') throw new Error(`unexpected ${admission.outcome}`);
  await store.finish({ scope: 'payments', key: input.key, entity, ownerToken, outcome: 'completed', response: { status: 201, headers: [['content-type', 'application/json']], body }, retentionMs: 86_400_000, audit });
}
async function run(total) {
  let left = total;
  await Promise.all(Array.from({ length: concurrency }, async () => { while (left-- > 0) await one(); }));
}

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
