// Where the SQLite store's time per request goes: the statements of one
// admission and one finish, timed one by one, in groups as group commit
// forms them under load (--group N decisions per transaction, default 25),
// with the BEGIN and the COMMIT (which writes every page the group dirtied to
// the WAL) timed apart. The workload is the HTTP benchmark's: a new key and a
// rising fence for one of 1000 entities each request, serial mode.
//
//   npm run build && node bench/store-profile.mjs [--requests 20000] [--group 25] [--synchronous NORMAL]
//     [--drop commands_key,commands_entity] [--skip command-log,fence-history] [--frames]
//
// --drop and --skip are diagnostics of what a request's store work is made
// of, never settings: --drop removes the named indexes after the migrations
// (what one B-tree written per request costs), --skip leaves out the
// command-log row or the fence-history row (what each audit row costs).
// --frames counts the WAL frames (pages written) per request instead of
// letting the checkpointer restart the WAL: the pages a COMMIT writes are
// what it costs.
//
// At FULL the COMMIT row would include the fsync, which the gateway does off
// the event loop (backgroundSync), so the default here is NORMAL.
import { existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { decide, finish } from '../dist/core/admission.js';
import { SqliteGatewayStore } from '../dist/store/sqlite/index.js';
import { option as opt } from './args.mjs';

const requests = Number(opt('requests', 20000));
const groupSize = Number(opt('group', 25));
const synchronous = opt('synchronous', 'NORMAL');
const drop = opt('drop', '').split(',').filter(Boolean);
const skip = new Set(opt('skip', '').split(',').filter(Boolean));
const frames = process.argv.includes('--frames');

const dir = mkdtempSync(join(tmpdir(), 'fencegate-store-profile-'));
const store = new SqliteGatewayStore({ path: join(dir, 'gateway.db'), synchronous, groupCommit: false, ...(frames ? { backgroundCheckpoint: false } : {}) });
// The store's own reads and writes (its private fields), exactly as admitIn / finishIn run them.
const { q, rows, db } = store;
for (const index of drop) db.exec(`DROP INDEX ${index}`);
if (frames) db.pragma('wal_autocheckpoint = 0');
const walBytes = () => (existsSync(join(dir, 'gateway.db-wal')) ? statSync(join(dir, 'gateway.db-wal')).size : 0);
const spent = new Map();
const time = (name, fn) => {
  const t0 = process.hrtime.bigint();
  const out = fn();
  spent.set(name, (spent.get(name) ?? 0n) + (process.hrtime.bigint() - t0));
  return out;
};
const owner = (k) => `owner-${k}-0000-0000-0000-000000000000`;
const body = Buffer.from('{"id":"ch_1","object":"charge"}');

/** The command-log row a finish writes (DESIGN §4.1 `commands`), as the gateway fills it. */
const command = (k, entity) => ({
  route: 'payments',
  scope: 'payments',
  entity,
  fence: BigInt(k),
  idempotencyKey: `key-${k}`,
  outcome: 'completed',
  decision: 'forwarded',
  status: 201,
  upstreamMs: 0.42,
  audit: { caller: null, method: 'POST', path: '/payments/charges', payloadSha256: 'f'.repeat(64), requestId: `req-${k}`, clientRequestId: null, tool: null },
});

function group(first, now) {
  // Admissions, as admitIn runs them: read the entity's row and the record,
  // decide (DESIGN §3.5, src/core/admission.ts), write what changed, the history row.
  time('BEGIN IMMEDIATE', () => db.exec('BEGIN IMMEDIATE'));
  time('SELECT now', () => q.now.get());
  for (let k = first; k < first + groupSize; k++) {
    const entity = `bench:${k % 1000}`;
    const input = {
      key: `key-${k}`,
      entity,
      fence: BigInt(k),
      fingerprint: 'f'.repeat(64),
      mode: 'serial',
      ownerToken: owner(k),
      lockMs: 30_000,
      retentionMs: 86_400_000,
      onUnknown: 'reject',
    };
    const state = time('admit: read entity + record', () => rows.read('payments', input.key, entity));
    const d = time('admit: decide (pure)', () => decide(state, input, now));
    time('admit: write entity + record', () => rows.apply('payments', input.key, entity, state, d.next));
    if (!skip.has('fence-history')) time('admit: fence history', () => q.fenceHistory.run(entity, d.acceptedFence, now, null, `req-${k}`));
  }
  time('COMMIT (WAL page writes)', () => db.exec('COMMIT'));
  // Finishes of the same requests, one group later (as after the upstream answered).
  time('BEGIN IMMEDIATE', () => db.exec('BEGIN IMMEDIATE'));
  time('SELECT now', () => q.now.get());
  for (let k = first; k < first + groupSize; k++) {
    const entity = `bench:${k % 1000}`;
    const input = {
      key: `key-${k}`,
      entity,
      ownerToken: owner(k),
      outcome: 'completed',
      response: { status: 201, headers: [['content-type', 'application/json']], body },
      retentionMs: 86_400_000,
    };
    const state = time('finish: read entity + record', () => rows.read('payments', input.key, entity));
    const f = time('finish: finish (pure)', () => finish(state, input, now));
    time('finish: write record + slot', () => rows.apply('payments', input.key, entity, state, f.next));
    if (!skip.has('command-log')) time('finish: command log row', () => store.logCommand(command(k, entity), 'completed', now));
  }
  time('COMMIT (WAL page writes)', () => db.exec('COMMIT'));
}

const now = Number(q.now.get().now);
let k = 1;
for (; k <= 2000; k += groupSize) group(k, now); // warm-up
spent.clear();
const t0 = process.hrtime.bigint();
const wal0 = walBytes();
for (let end = k + requests; k < end; k += groupSize) group(k, now);
const wall = Number(process.hrtime.bigint() - t0) / 1000 / requests;
// A WAL frame is a 24-byte header and one page.
const framesPerRequest = (walBytes() - wal0) / (24 + Number(db.pragma('page_size', { simple: true }))) / requests;
await store.close();
rmSync(dir, { recursive: true, force: true });

const without = [...drop.map((i) => `index ${i}`), ...[...skip].map((r) => `the ${r} row`)];
console.log(
  `SQLite store, ${synchronous}, ${requests} requests in groups of ${groupSize}: µs per request (admission + finish)${without.length ? `, without ${without.join(', ')}` : ''}`,
);
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
if (frames) console.log(`WAL frames (pages written) per request: ${framesPerRequest.toFixed(2)}`);
