// How a waiter on one gateway replica learns that the request it waits for
// (serial slot, Prefer: wait) finished on ANOTHER replica: LISTEN/NOTIFY vs
// bounded polling, on the PostgreSQL store. Chooses the default of
// src/store/postgres/wakeups.ts (the numbers are in docs/performance.md).
//
//   node bench/postgres-wait.mjs [--rounds 200] [--finishes 2000]   (after npm run build)
//
// Two stores on one fresh schema play two replicas. Per round: replica A
// holds an entity's serial slot; replica B loops admit → entity-busy →
// waitForChange, as the gateway does; after a random 0–50 ms A finishes.
// Measured: from A's finish resolving to B's admission answering `forward`,
// and how many admissions B ran while waiting. Then the cost of the NOTIFY
// itself: sequential admit+finish pairs with and without it, ratio in the
// same run.
import { randomBytes, randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { createPostgresStore } from '../dist/store/postgres/index.js';
import { entityTopic } from '../dist/store/types.js';
import { option } from './args.mjs';

const opt = (name, dflt) => {
  const v = option(name);
  return v === undefined ? dflt : Number(v);
};
const rounds = opt('rounds', 200);
const finishes = opt('finishes', 2000);
const url = process.env.FENCEGATE_BENCH_POSTGRES_URL ?? process.env.FENCEGATE_TEST_POSTGRES_URL;
if (!url) {
  console.error('set FENCEGATE_BENCH_POSTGRES_URL (or FENCEGATE_TEST_POSTGRES_URL)');
  process.exit(2);
}

const schema = `fg_bench_${randomBytes(5).toString('hex')}`;
const admin = new pg.Client({ connectionString: url });
await admin.connect();
await admin.query(`CREATE SCHEMA ${schema}`);

const audit = () => ({ requestId: randomUUID(), caller: null, method: 'POST', path: '/p', payloadSha256: 'ab'.repeat(32) });
const command = (entity) => ({
  scope: 'bench',
  key: randomUUID(),
  entity,
  fence: null,
  fingerprint: 'fp',
  mode: 'serial',
  ownerToken: randomUUID(),
  lockMs: 30_000,
  retentionMs: 3_600_000,
  onUnknown: 'reject',
  audit: audit(),
});
const done = (c) => ({
  scope: c.scope,
  key: c.key,
  entity: c.entity,
  ownerToken: c.ownerToken,
  audit: c.audit,
  outcome: 'completed',
  retentionMs: c.retentionMs,
  response: { status: 200, headers: [], body: new Uint8Array(16) },
});
const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function wakeups(label, options) {
  const a = await createPostgresStore({ connectionString: url, schema, ...options });
  const b = await createPostgresStore({ connectionString: url, schema, migrate: false, ...options });
  const lat = [];
  const polls = [];
  for (let i = 0; i < rounds; i++) {
    const entity = `e-${randomUUID()}`;
    const holder = command(entity);
    if ((await a.admit(holder)).outcome !== 'forward') throw new Error('holder not admitted');
    let finishedAt = 0;
    let admissions = 0;
    const waiter = (async () => {
      const c = command(entity);
      for (;;) {
        const r = await b.admit(c);
        admissions++;
        if (r.outcome === 'forward') return performance.now();
        await b.waitForChange(entityTopic(entity), 10_000);
      }
    })();
    await sleep(Math.random() * 50);
    await a.finish(done(holder));
    finishedAt = performance.now();
    const forwardedAt = await waiter;
    lat.push(Math.max(0, forwardedAt - finishedAt));
    polls.push(admissions - 1);
  }
  await a.close();
  await b.close();
  const busy = polls.reduce((s, x) => s + x, 0) / polls.length;
  console.log(
    `${label.padEnd(16)} from the finish to the waiter's forward: p50 ${pct(lat, 50).toFixed(1)} ms, p99 ${pct(lat, 99).toFixed(1)} ms (busy answers per wait: ${busy.toFixed(2)})`,
  );
}

/** ms per admit+finish pair on `s`, `n` sequential pairs. */
async function pairs(s, n) {
  const t0 = performance.now();
  for (let i = 0; i < n; i++) {
    const c = command(`f-${i % 100}`);
    await s.admit(c);
    await s.finish(done(c));
  }
  return (performance.now() - t0) / n;
}

try {
  await wakeups('LISTEN/NOTIFY', { listen: true, pollMs: 60_000 });
  await wakeups('polling 50 ms', { listen: false, pollMs: 50 });
  await wakeups('polling 250 ms', { listen: false, pollMs: 250 });
  // The NOTIFY's own cost: both stores open side by side (one connection
  // each, plus the listener), blocks alternated so that drift on a shared
  // box hits both; the median block is compared.
  const notifying = await createPostgresStore({ connectionString: url, schema, migrate: false, poolSize: 1, listen: true });
  const silent = await createPostgresStore({ connectionString: url, schema, migrate: false, poolSize: 1, listen: false });
  await pairs(notifying, 200);
  await pairs(silent, 200);
  const withN = [];
  const without = [];
  const block = Math.max(50, Math.floor(finishes / 10));
  for (let k = 0; k < 10; k++) {
    withN.push(await pairs(notifying, block));
    without.push(await pairs(silent, block));
  }
  await notifying.close();
  await silent.close();
  const med = (xs) => pct(xs, 50);
  console.log(
    `admit+finish pair (median of 10 blocks of ${block}): with NOTIFY ${med(withN).toFixed(3)} ms, without ${med(without).toFixed(3)} ms, ratio ${(med(withN) / med(without)).toFixed(3)}`,
  );
} finally {
  await admin.query(`DROP SCHEMA ${schema} CASCADE`);
  await admin.end();
}
