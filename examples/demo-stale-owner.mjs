#!/usr/bin/env node
// The seed's scenario, narrated step by step with real processes:
//
//   W1 claims a job and heartbeats; its payment requests leave W1 and get
//   stuck in the network; W1 freezes (SIGSTOP) — or, on PostgreSQL, loses its
//   database connection; its lease expires; W2 claims the job with token+1
//   and pays through the gateway; then W1's old requests arrive and W1 comes
//   back. The database refuses W1's extend and its result, the gateway
//   refuses W1's late requests (409 stale-fence, in the audit log), and the
//   payment APIs saw one charge and one payout.
//
//   npm run build && node examples/demo-stale-owner.mjs              (SQLite, temporary files)
//   node examples/demo-stale-owner.mjs --postgres postgres://postgres@127.0.0.1:5432/test
//
// Exits 0 when every refusal happened and there was exactly one payment of
// each kind, 1 otherwise. The tested version: test/faults/stale-owner.test.ts.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import Database from 'better-sqlite3';
import { parseConfig } from '../dist/config/load.js';
import { startGateway } from '../dist/entry/node.js';
import { createJsonLogger } from '../dist/http/logger.js';
import { createPostgresJobStore, createSqliteJobStore } from '../dist/lease/index.js';

const { values } = parseArgs({ options: { postgres: { type: 'string' } } });

/** A failure of the demo's own set-up (a database it cannot reach): said in one line, not a stack trace. */
class DemoError extends Error {}

/** The connection string without its password. */
function redacted(url) {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return '(unparsable URL)';
  }
}
const here = fileURLToPath(new URL('.', import.meta.url));
const t0 = Date.now();
let step = 0;
const tty = process.stdout.isTTY;
const paint = (code, s) => (tty ? `\x1b[${code}m${s}\x1b[0m` : s);
const say = (text) => console.log(`${paint(2, `${String(((Date.now() - t0) / 1000).toFixed(1)).padStart(5)}s`)}  ${paint(1, `${++step}.`.padEnd(3))} ${text}`);
const detail = (text) => console.log(`${' '.repeat(11)}${paint(2, text)}`);
const ok = (text) => console.log(`${' '.repeat(11)}${paint(32, '✔')} ${text}`);
const bad = (text) => console.log(`${' '.repeat(11)}${paint(31, '✘')} ${text}`);

const cleanup = [];
let failures = 0;
const check = (cond, good, wrong = good) => (cond ? ok(good) : (failures++, bad(wrong)));

/** A TCP path with two faults: hold (bytes wait "in the network") and cut (connections reset). */
function faultyPath(targetPort, name) {
  const held = [];
  const open = new Set();
  let holding = false;
  let cut = false;
  const server = createServer((client) => {
    client.on('error', () => {});
    if (cut) return client.resetAndDestroy();
    const link = { client, upstream: null, chunks: [], answer: null };
    open.add(link);
    const forward = () => {
      link.upstream = connect(targetPort, '127.0.0.1');
      link.upstream.on('error', () => {});
      link.upstream.on('data', (d) => {
        link.answer ??= /^HTTP\/1\.[01] (\d{3})/.exec(d.toString('latin1'))?.[1] ?? null;
        if (!client.destroyed) client.write(d);
      });
      link.upstream.on('close', () => client.destroy());
      for (const c of link.chunks.splice(0)) link.upstream.write(c);
    };
    if (holding) held.push(link);
    else forward();
    link.release = forward;
    client.on('data', (d) => (link.upstream ? link.upstream.write(d) : link.chunks.push(d)));
    client.on('close', () => open.delete(link));
  });
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => {
      cleanup.push(
        () => new Promise((r) => server.close(r)),
        () => open.forEach((l) => (l.client.destroy(), l.upstream?.destroy())),
      );
      resolve({
        port: server.address().port,
        name,
        held,
        hold: () => (holding = true),
        /** Held connections that carry a request (a client may also open and drop empty ones). */
        requests: () => held.filter((l) => l.chunks.length > 0 || l.upstream !== null),
        /** Delivers the held requests, late; returns them. */
        release() {
          holding = false;
          const carrying = held.filter((l) => l.chunks.length > 0);
          for (const l of held) if (l.chunks.length === 0) l.client.destroy();
          for (const l of carrying) l.release();
          return carrying;
        },
        cut: () => ((cut = true), open.forEach((l) => (l.client.resetAndDestroy(), l.upstream?.resetAndDestroy()))),
        restore: () => (cut = false),
      });
    }),
  );
}

/** The payment APIs: NOT idempotent, they count every request as a payment and note its fence. */
async function startPaymentApis() {
  const payments = [];
  const server = createHttpServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const p = {
        id: `${req.url.startsWith('/payouts') ? 'po' : 'ch'}_${payments.length + 1}`,
        path: req.url,
        fence: req.headers['x-execution-fence'],
        key: req.headers['idempotency-key'],
      };
      payments.push(p);
      res.writeHead(201, { 'content-type': 'application/json' });
      res.end(JSON.stringify(p));
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  cleanup.push(() => new Promise((r) => (server.closeAllConnections(), server.close(r))));
  return { url: `http://127.0.0.1:${server.address().port}`, payments };
}

/** A worker process; resolves messages as they come. */
function startWorker(workerId, store, gateway) {
  const proc = spawn(process.execPath, [join(here, 'demo-stale-owner.worker.mjs'), JSON.stringify({ workerId, store, gateway })], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const seen = [];
  const waiters = new Set();
  createInterface({ input: proc.stdout }).on('line', (line) => {
    let m;
    try {
      m = JSON.parse(line);
    } catch {
      return;
    }
    seen.push(m);
    for (const w of waiters) w();
  });
  cleanup.unshift(() => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGCONT');
      proc.kill('SIGKILL');
    }
  });
  return {
    proc,
    send: (line) => proc.stdin.write(`${line}\n`),
    /** The first message matching `pred` (already seen or coming), within `ms`. */
    next: (pred, what, ms = 30_000) =>
      new Promise((resolve, reject) => {
        const check = () => {
          const m = seen.find(pred);
          if (!m) return;
          waiters.delete(check);
          clearTimeout(timer);
          resolve(m);
        };
        const timer = setTimeout(() => (waiters.delete(check), reject(new Error(`${workerId}: no ${what} within ${ms} ms`))), ms);
        waiters.add(check);
        check();
      }),
    seen,
  };
}

async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-demo-'));
  cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
  const apis = await startPaymentApis();

  // --- the databases ------------------------------------------------------
  let jobs, gatewayStore, w1Store, w2Store, dbPath;
  if (values.postgres) {
    const pg = (await import('pg')).default;
    const schema = `fg_demo_${randomBytes(4).toString('hex')}`;
    const admin = new pg.Client({ connectionString: values.postgres });
    // One line for an unreachable server or a missing database, as the gateway's own start-up errors are.
    await admin.connect().catch((err) => {
      throw new DemoError(`cannot connect to PostgreSQL at ${redacted(values.postgres)}: ${err.message}`);
    });
    await admin.query(`CREATE SCHEMA ${schema}`);
    cleanup.push(async () => {
      await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await admin.end();
    });
    const url = new URL(values.postgres);
    url.searchParams.set('options', `-c search_path=${schema}`);
    jobs = await createPostgresJobStore({ connectionString: url.toString() });
    dbPath = await faultyPath(Number(url.port || 5432), 'W1 ↔ PostgreSQL');
    const viaPath = new URL(url);
    viaPath.hostname = '127.0.0.1';
    viaPath.port = String(dbPath.port);
    gatewayStore = { postgres: url.toString(), poolSize: 4 };
    w1Store = { postgres: viaPath.toString() };
    w2Store = { postgres: url.toString() };
  } else {
    const file = join(dir, 'jobs.db');
    jobs = createSqliteJobStore({ path: file });
    gatewayStore = { sqlite: join(dir, 'gateway.db'), synchronous: 'NORMAL' };
    w1Store = w2Store = { sqlite: file };
  }
  cleanup.unshift(() => jobs.close());

  // --- the gateway ----------------------------------------------------------
  const route = (name, path, idempotency) => ({
    name,
    match: { path, methods: ['POST'] },
    upstream: apis.url,
    entity: { header: 'X-Fence-Entity' },
    fence: 'required',
    idempotency,
  });
  const config = parseConfig({
    listen: { host: '127.0.0.1', port: 0 },
    store: gatewayStore,
    routes: [route('payments', '/payments/*', 'required'), route('payouts', '/payouts/*', 'off')],
  });
  const gateway = await startGateway({ config, logger: createJsonLogger({ level: 'silent' }) });
  cleanup.unshift(() => gateway.close());
  say(`fencegate gateway on ${gateway.url} (${values.postgres ? 'PostgreSQL' : 'SQLite'} store) in front of two payment APIs that are NOT idempotent:`);
  detail('/payments/* takes an Idempotency-Key; /payouts/* takes none, so only the fence guards it');

  const { job } = await jobs.enqueue({ kind: 'payment', idempotencyKey: 'invoice-42', payload: { amount: 1200 } });
  const entity = job.jobKey;
  say(`job ${job.id} enqueued: pay invoice 42 (fence entity ${entity})`);

  // --- W1 claims, heartbeats, sends, and is lost ----------------------------
  const w1Net = await faultyPath(Number(new URL(gateway.url).port), 'W1 → gateway');
  w1Net.hold();
  const w1 = startWorker('w1', w1Store, `http://127.0.0.1:${w1Net.port}`);
  const c1 = await w1.next((m) => m.ev === 'job_claimed', 'claim');
  say(`W1 claims job ${job.id}: fencing token ${c1.token}, lease 1.5 s`);
  await w1.next((m) => m.ev === 'heartbeat_ok', 'heartbeat');
  detail('W1 heartbeats (its own thread and connection extend the lease)');
  await w1.next((m) => m.ev === 'tool_request_started' && w1.seen.filter((x) => x.ev === 'tool_request_started').length >= 2, 'requests');
  for (let i = 0; i < 100 && w1Net.requests().length < 2; i++) await new Promise((r) => setTimeout(r, 20));
  say(`W1 sends its charge and its payout with fence ${c1.token}: they get stuck in the network`);

  if (dbPath) {
    dbPath.cut();
    say('W1 loses PostgreSQL: its connections are reset, new ones refused');
    const lost = await w1.next((m) => m.ev === 'heartbeat_lost', 'lease loss');
    detail(`W1's heartbeats fail; at its conservative deadline it gives the lease up (${lost.cause})`);
  } else {
    // Never freeze W1 inside a write transaction (that would lock W2 out, which is not this story).
    const probe = new Database(w1Store.sqlite, { timeout: 0 });
    for (let i = 0; ; i++) {
      w1.proc.kill('SIGSTOP');
      try {
        probe.exec('BEGIN IMMEDIATE; ROLLBACK');
        break;
      } catch {
        w1.proc.kill('SIGCONT');
        if (i > 20) throw new Error('could not stop W1 outside a write');
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    probe.close();
    say('W1 freezes (SIGSTOP): a GC pause, a paused VM — no heartbeats, no progress');
  }

  // --- W2 takes over ------------------------------------------------------------
  const w2 = startWorker('w2', w2Store, gateway.url);
  const c2 = await w2.next((m) => m.ev === 'job_claimed', 'claim');
  say(`W1's lease expires (database clock); W2 claims job ${job.id} with token ${c2.token} (previous owner ${c2.previousOwner})`);
  await w2.next((m) => m.ev === 'result_committed', 'result');
  say(`W2 pays through the gateway (fence ${c2.token}) and commits its result`);
  for (const p of apis.payments) detail(`payment API: ${p.id} ${p.path} with fence ${p.fence}`);

  // --- W1's past catches up ---------------------------------------------------------
  const late = w1Net.release();
  for (let i = 0; i < 250 && late.some((l) => l.answer === null); i++) await new Promise((r) => setTimeout(r, 20));
  say("The network delivers W1's old requests to the gateway, late");
  check(late.length === 2, 'both of them', `${late.length} of them`);
  for (const l of late) check(l.answer === '409', `refused: 409 stale-fence (fence ${c1.token} < ${c2.token}), never forwarded`, `answered ${l.answer}`);

  if (dbPath) dbPath.restore();
  else w1.proc.kill('SIGCONT');
  say(`W1 comes back (${dbPath ? 'database reachable again' : 'SIGCONT'})`);
  const rejected = await w1.next((m) => m.ev === 'result_rejected', 'result_rejected');
  check(rejected.reason === 'lease_lost', `W1's runner: result_rejected (${rejected.reason}); its result is not stored`);
  w1.send(`extend ${job.id} ${c1.token}`);
  const ext = await w1.next((m) => m.type === 'extend', 'extend');
  check(!ext.ok, `W1 tries to extend its lease with token ${c1.token}: refused by the database (${ext.reason})`, 'W1 extended a lease it no longer owns');
  w1.send(`complete ${job.id} ${c1.token}`);
  const done = await w1.next((m) => m.type === 'complete', 'complete');
  check(!done.ok, `W1 tries to write its result with token ${c1.token}: refused by the database (${done.reason})`, 'W1 wrote a stale result');

  // --- what an auditor sees ----------------------------------------------------------
  const audit = await (await fetch(`${gateway.url}/_fencegate/v1/rejections?entity=${encodeURIComponent(entity)}`)).json();
  say(`The audit log (GET /_fencegate/v1/rejections?entity=${entity}):`);
  for (const r of audit.items) detail(`${r.at}  ${r.reason}  ${r.method} ${r.path}  presented ${r.presented_fence}, current ${r.current_fence}`);
  check(audit.items.filter((r) => r.reason === 'stale-fence').length === 2, 'both late requests are on record');

  const final = await jobs.get(job.id);
  say(`The job: ${final.state}, token ${final.fencingToken}, result written by ${final.result?.worker}`);
  const charges = apis.payments.filter((p) => p.path.startsWith('/payments'));
  const payouts = apis.payments.filter((p) => p.path.startsWith('/payouts'));
  check(
    charges.length === 1 && payouts.length === 1,
    `the payment APIs saw exactly one charge and one payout, both with fence ${c2.token}`,
    `${charges.length} charges and ${payouts.length} payouts`,
  );
  console.log(failures === 0 ? paint(32, '\nOne payment. The stale owner was refused everywhere.') : paint(31, `\n${failures} expectation(s) failed.`));
}

try {
  await main();
} catch (err) {
  failures++;
  if (err instanceof DemoError) console.error(`demo: ${err.message}`);
  else console.error(err);
} finally {
  for (const fn of cleanup) {
    try {
      await fn();
    } catch {
      // best effort
    }
  }
}
process.exit(failures === 0 ? 0 : 1);
