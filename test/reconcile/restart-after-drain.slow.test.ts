import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { createFetchForwarder } from '../../src/http/forward-fetch.js';
import { silentLogger } from '../../src/http/logger.js';
import { createReconcileQuery } from '../../src/http/pipeline/reconcile.js';
import { createBackgroundReconciler } from '../../src/http/reconciler.js';
import { startGatewayProc, type GatewayProc } from '../faults/toolkit/gateway-proc.js';
import { paymentsRoute, recordRows, startTestGateway, until, type TestGateway } from '../helpers/gateway.js';
import { tempDir } from '../helpers/temp.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// DESIGN §3.12 "Shutdown and restart": what a SIGTERM drain could not write
// is settled after the restart. A drain that cannot reach its store leaves
// the attempt's record `in_progress`, locked until the admission's lock ends;
// the restarted gateway's background pass has such records (their lock
// expired by the database clock) marked `outcome_unknown`, then asks the
// upstream's status query about them like any other lost answer.

const STATUS_BODY = JSON.stringify({ id: 'ch_1', state: 'paid' });

/** The upstream: commands are held until the gate opens; the status query finds every command. */
function behave(up: FakeUpstream, gate: Promise<void>) {
  up.behave((call) =>
    call.method === 'GET' ? { kind: 'respond', status: 200, headers: { 'content-type': 'application/json' }, body: STATUS_BODY } : { kind: 'hold', gate },
  );
}

const route = (upstream: string, reconcileInterval = '200ms') =>
  paymentsRoute(upstream, {
    match: { path: '/payments/*', methods: ['POST'] },
    // A lock of 2.5 s: it runs out soon after the restart.
    timeoutMs: 2_000,
    lockMarginMs: 500,
    reconcile: { path: '/status?key={key}', interval: reconcileInterval, settleTime: '0s' },
  });

const pay = (url: string, key: string, signal?: AbortSignal) =>
  fetch(`${url}/payments/e1`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-fence-entity': 'e1', 'x-execution-fence': '1', 'idempotency-key': key },
    body: '{"amount":1}',
    ...(signal !== undefined ? { signal } : {}),
  });

const stateOf = (dbPath: string, key: string): string | undefined => {
  const db = new Database(dbPath, { readonly: true, timeout: 5_000 });
  try {
    return (db.prepare('SELECT state FROM idempotency_records WHERE key = ?').get(key) as { state: string } | undefined)?.state;
  } finally {
    db.close();
  }
};

describe('after a drain that could not write its finish, the restarted gateway settles the record', () => {
  const tmp = tempDir('fencegate-restart-');
  let gw: GatewayProc | null = null;
  let up: FakeUpstream | null = null;
  afterEach(async () => {
    await gw?.close();
    await up?.close();
    gw = null;
    up = null;
  });
  afterAll(() => tmp.cleanup());

  it('a child gateway: SIGTERM with the store locked away, the finish unwritten; after the restart the pass marks the record unknown, the status query completes it', async () => {
    up = await startUpstream();
    let open!: () => void;
    behave(up, new Promise<void>((r) => (open = r)));
    const dbPath = join(tmp.dir, 'gateway.db');
    gw = await startGatewayProc({
      store: { sqlite: dbPath },
      routes: [route(up.url)],
      dir: tmp.dir,
      // The sweeper must not be what marks the record: the reconcile pass is.
      config: { drainTimeout: '1s', sweepInterval: '1h' },
    });
    const key = `drain-${randomUUID()}`;
    const caller = pay(gw.url, key, AbortSignal.timeout(30_000)).catch(() => null);
    await up.waitForCalls(1);

    // The store goes away (another connection holds SQLite's write lock), then SIGTERM, then the upstream answers.
    const locker = new Database(dbPath, { timeout: 5_000 });
    locker.exec('BEGIN IMMEDIATE');
    try {
      const proc = gw.proc;
      proc.proc.kill('SIGTERM');
      open();
      await proc.waitFor((m) => m.msg === 'finish-unwritten', 'the drain giving up on the finish', 20_000);
      // A supervisor's kill after the grace, should the store close still wait for the lock.
      const exited = await Promise.race([proc.exited.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), 3_000))]);
      if (!exited) await proc.kill();
    } finally {
      locker.exec('ROLLBACK');
      locker.close();
    }
    await caller;
    // What the drain left: the attempt in progress, under its lock.
    expect(stateOf(dbPath, key)).toBe('in_progress');

    await gw.restart();
    await until(() => stateOf(dbPath, key) === 'completed', 'the restarted gateway settling the record', { timeoutMs: 30_000 });
    const res = await pay(gw.url, key);
    expect(res.status).toBe(200);
    expect(res.headers.get('fencegate-reconciled')).toBe('true');
    expect(await res.text()).toBe(STATUS_BODY);
    expect(up.calls.filter((c) => c.method === 'POST')).toHaveLength(1);
  });
});

describe('the pass marks dead attempts before it lists (negative control in one process)', () => {
  let gw: TestGateway | null = null;
  let up: FakeUpstream | null = null;
  afterEach(async () => {
    await gw?.close();
    await up?.close();
  });

  it('the reconciler alone never sees an in-progress record whose lock expired; the gateway pass marks it unknown and settles it', async () => {
    up = await startUpstream();
    behave(up, new Promise<void>(() => {}));
    // The background pass an hour away: the test runs it.
    gw = await startTestGateway({ routes: [route(up.url, '1h')], config: { sweepInterval: '1h' } });
    // An attempt admitted by a gateway that then died (or whose drain could not finish it): a short lock, never finished.
    const key = `dead-${randomUUID()}`;
    const admission = await gw.sqlite.admit({
      scope: 'payments',
      key,
      entity: 'e1',
      fence: 1n,
      fingerprint: 'f'.repeat(64),
      mode: 'concurrent',
      ownerToken: randomUUID(),
      lockMs: 1,
      retentionMs: 86_400_000,
      onUnknown: 'reject',
      audit: { requestId: 'req-dead', clientRequestId: null, caller: null, method: 'POST', path: '/payments/e1', payloadSha256: '' },
    });
    expect(admission.outcome).toBe('forward');
    await new Promise((r) => setTimeout(r, 20));

    // The control: the reconciler's own pass lists outcome_unknown records only.
    const query = createReconcileQuery({ store: gw.sqlite, forwarder: createFetchForwarder(), logger: silentLogger, headers: new Map() });
    const alone = createBackgroundReconciler({ routes: gw.config.routes, store: gw.sqlite, query, logger: silentLogger });
    expect((await alone.pass()).seen).toBe(0);
    expect(recordRows(gw.sqlite, key).map((r) => r.state)).toEqual(['in_progress']);

    const pass = await gw.running.gateway.reconcile();
    expect(pass.markedDead).toBe(1);
    expect(pass.asked).toEqual({ found: 1 });
    expect(recordRows(gw.sqlite, key).map((r) => r.state)).toEqual(['completed']);
  });
});
