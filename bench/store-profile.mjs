// Where the SQLite store's time per request goes: the statements of one
// admission and one finish, timed one by one, in groups as group commit
// forms them under load (--group N decisions per transaction, default 25),
// with the BEGIN and the COMMIT (which writes every page the group dirtied to
// the WAL) timed apart. The workload is the HTTP benchmark's: a new key and a
// rising fence for one of 1000 entities each request, serial mode.
//
//   npm run build && node bench/store-profile.mjs [--requests 20000] [--group 25] [--synchronous NORMAL]
//
// At FULL the COMMIT row would include the fsync, which the gateway does off
// the event loop (backgroundSync), so the default here is NORMAL.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SqliteGatewayStore } from '../dist/store/sqlite/index.js';
import { option as opt } from './args.mjs';

const requests = Number(opt('requests', 20000));
const groupSize = Number(opt('group', 25));
const synchronous = opt('synchronous', 'NORMAL');

const dir = mkdtempSync(join(tmpdir(), 'fencegate-store-profile-'));
const store = new SqliteGatewayStore({ path: join(dir, 'gateway.db'), synchronous, groupCommit: false });
// The store's prepared statements, exactly as admitIn / finishIn run them.
const { q, db } = store;
const spent = new Map();
const time = (name, fn) => {
  const t0 = process.hrtime.bigint();
  const out = fn();
  spent.set(name, (spent.get(name) ?? 0n) + (process.hrtime.bigint() - t0));
  return out;
};
const owner = (k) => `owner-${k}-0000-0000-0000-000000000000`;
const body = Buffer.from('{"id":"ch_1","object":"charge"}');

function group(first, now) {
  // Admissions: DESIGN §3.5 a (fence), the history row, b (record lookup), h (slot), the record.
  time('BEGIN IMMEDIATE', () => db.exec('BEGIN IMMEDIATE'));
  time('SELECT now', () => q.now.get());
  for (let k = first; k < first + groupSize; k++) {
    const entity = `bench:${k % 1000}`;
    const fence = BigInt(k);
    time('admit: raise fence', () => q.raiseFence.get({ entity, fence, now }));
    time('admit: fence history', () => q.fenceHistory.run({ entity, fence, now, caller: null, requestId: `req-${k}` }));
    time('admit: read record', () => q.getRecord.get('payments', `key-${k}`));
    time('admit: take slot', () => q.takeSlot.get({ entity, owner: owner(k), until: now + 30_000, now }));
    time('admit: insert record', () =>
      q.insertRecord.run({ scope: 'payments', key: `key-${k}`, owner: owner(k), until: now + 30_000, entity, fence, now, fingerprint: 'f'.repeat(64), expires: now + 86_400_000 }),
    );
  }
  time('COMMIT (WAL page writes)', () => db.exec('COMMIT'));
  // Finishes of the same requests, one group later (as after the upstream answered).
  time('BEGIN IMMEDIATE', () => db.exec('BEGIN IMMEDIATE'));
  time('SELECT now', () => q.now.get());
  for (let k = first; k < first + groupSize; k++) {
    time('finish: complete record', () =>
      q.complete.run({ scope: 'payments', key: `key-${k}`, owner: owner(k), status: 201, headers: '[["content-type","application/json"]]', body, expires: now + 86_400_000 }),
    );
    time('finish: free slot', () => q.freeSlot.run({ entity: `bench:${k % 1000}`, owner: owner(k) }));
  }
  time('COMMIT (WAL page writes)', () => db.exec('COMMIT'));
}

const now = Number(q.now.get().now);
let k = 1;
for (; k <= 2000; k += groupSize) group(k, now); // warm-up
spent.clear();
const t0 = process.hrtime.bigint();
for (let end = k + requests; k < end; k += groupSize) group(k, now);
const wall = Number(process.hrtime.bigint() - t0) / 1000 / requests;
await store.close();
rmSync(dir, { recursive: true, force: true });

console.log(`SQLite store, ${synchronous}, ${requests} requests in groups of ${groupSize}: µs per request (admission + finish)`);
console.log('| step | µs/request |');
console.log('|---|---:|');
let total = 0;
for (const [name, ns] of [...spent].sort((a, b) => Number(b[1] - a[1]))) {
  const us = Number(ns) / 1000 / requests;
  total += us;
  console.log(`| ${name} | ${us.toFixed(1)} |`);
}
console.log(`| **timed steps** | **${total.toFixed(1)}** |`);
console.log(`| wall clock (with the loop) | ${wall.toFixed(1)} |`);
