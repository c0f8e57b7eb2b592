import Database from 'better-sqlite3';
import { connect } from 'node:net';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { SqliteGatewayStore } from '../../src/store/sqlite/gateway-store.js';
import { command, effectOf, expectProblem, paymentsRoute, recordRows, startTestGateway, tempDir, until } from '../helpers/gateway.js';
import { CLI, killAll as killChildren, startGatewayChild, writeJson, type Proc as Child } from '../helpers/child.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0)) await c();
});
afterAll(async () => {
  await killChildren();
});

async function upstream(): Promise<FakeUpstream> {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  return up;
}

describe('a caller that disconnects mid-call does not cancel the upstream call (DESIGN §3.6)', () => {
  it('the outcome is stored, and the retry with the same key gets the replay', async () => {
    const up = await upstream();
    const gw = await startTestGateway({ routes: [paymentsRoute(up.url)] });
    cleanups.push(() => gw.close());
    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise }));

    // A bare socket, so that the disconnect is exactly when the test says.
    const { port } = new URL(gw.url);
    const socket = connect(Number(port), '127.0.0.1');
    socket.on('error', () => {});
    const body = '{"amount":1200}';
    socket.write(
      'POST /payments/charges HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nX-Execution-Fence: 1\r\n' +
        `X-Fence-Entity: e\r\nIdempotency-Key: k\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
    );
    await up.waitForCalls(1);
    // A reset: a FIN alone is a half-close, which the gateway answers
    // (node-listener.slow.test.ts, where a caller that sends FIN and leaves is too).
    socket.resetAndDestroy();
    // The gateway has seen the caller go: its only connection is closed.
    await until(
      () => new Promise<boolean>((resolve) => gw.running.server.getConnections((_e, count) => resolve(count === 0))),
      'the caller connection to close',
    );
    expect(up.calls[0]!.finished).toBe(false);

    gate.open();
    await until(() => recordRows(gw.sqlite, 'k')[0]?.state === 'completed', 'the outcome to be stored');
    const retry = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect((await effectOf(retry)).effect).toBe(1);
    expect(up.effects).toBe(1);
  });
});

describe('clean shutdown', () => {
  it('SIGTERM while a request is in flight: the request completes, the probes are answered (alive, not ready), the process exits 0', async () => {
    const up = await upstream();
    const tmp = tempDir();
    cleanups.push(() => tmp.cleanup());
    const db = join(tmp.dir, 'gw.db');
    const config = writeJson(join(tmp.dir, 'config.json'), {
      listen: { host: '127.0.0.1', port: 8080 },
      store: { sqlite: join(tmp.dir, 'not-used.db') },
      routes: [paymentsRoute(up.url)],
    });
    // --port and --db override the file, as an operator would.
    const child = await startGatewayChild([CLI, 'serve', '--config', config, '--port', '0', '--db', db]);
    cleanups.unshift(() => void child.proc.kill('SIGKILL'));
    expect(child.url).not.toMatch(/:8080$/);

    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise }));
    const inFlight = command(child.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    await up.waitForCalls(1);

    child.proc.kill('SIGTERM');
    const line = await child.waitForLine((l) => l.msg === 'shutting-down', 'shutting-down');
    expect(line).toMatchObject({ signal: 'SIGTERM', inflight: 1 });
    // The listener stays open through the drain, so probes are answered: alive, not ready.
    expect((await fetch(`${child.url}/_fencegate/health`)).status).toBe(200);
    expect((await fetch(`${child.url}/_fencegate/ready`)).status).toBe(503);

    gate.open();
    const res = await inFlight;
    expect(res.status).toBe(201);
    // The caller is told not to reuse the connection.
    expect(res.headers.get('connection')).toBe('close');
    expect((await effectOf(res)).effect).toBe(1);
    expect(await child.exited).toEqual({ code: 0, signal: null });
    await child.waitForLine((l) => l.msg === 'stopped', 'stopped');

    // The outcome reached the store before it closed.
    const conn = new Database(db, { readonly: true });
    try {
      expect(conn.prepare("SELECT state, status FROM idempotency_records WHERE key = 'k'").get()).toEqual({ state: 'completed', status: 201 });
    } finally {
      conn.close();
    }
  });
});

describe('a signal delivered twice at once (Ctrl-C through a wrapper such as npm start)', () => {
  async function holdOne() {
    const up = await upstream();
    const tmp = tempDir();
    cleanups.push(() => tmp.cleanup());
    const db = join(tmp.dir, 'gw.db');
    const config = writeJson(join(tmp.dir, 'config.json'), { store: { sqlite: db }, routes: [paymentsRoute(up.url)] });
    const child = await startGatewayChild([CLI, 'serve', '--config', config, '--port', '0']);
    cleanups.unshift(() => void child.proc.kill('SIGKILL'));
    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise }));
    const inFlight = command(child.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    await up.waitForCalls(1);
    return { child, gate, inFlight, db };
  }

  it('is one shutdown: the held request still completes and is recorded, the process exits 0', async () => {
    const { child, gate, inFlight, db } = await holdOne();
    child.proc.kill('SIGINT');
    child.proc.kill('SIGINT');
    await child.waitForLine((l) => l.msg === 'shutting-down', 'shutting-down');
    await new Promise((r) => setTimeout(r, 200));
    gate.open();
    expect((await inFlight).status).toBe(201);
    expect(await child.exited).toEqual({ code: 0, signal: null });
    const conn = new Database(db, { readonly: true });
    try {
      expect(conn.prepare("SELECT state FROM idempotency_records WHERE key = 'k'").get()).toEqual({ state: 'completed' });
    } finally {
      conn.close();
    }
  });

  it('control: the same signal sent again a second later forces the exit (code 1), before the held request is done', async () => {
    const { child, gate, inFlight } = await holdOne();
    // The forced exit cuts the held request's connection: its rejection is expected, and handled from here on.
    const cut = inFlight.then(
      () => 'answered',
      () => 'cut',
    );
    child.proc.kill('SIGINT');
    await child.waitForLine((l) => l.msg === 'shutting-down', 'shutting-down');
    await new Promise((r) => setTimeout(r, 1200));
    child.proc.kill('SIGINT');
    expect(await child.exited).toEqual({ code: 1, signal: null });
    gate.open();
    expect(await cut).toBe('cut');
  });
});

describe('clean shutdown of a large answer', () => {
  it('close() while a 16 MiB answer is in flight: the caller receives all of it', async () => {
    const up = await upstream();
    // Over the 1 MiB default of maxResponseBytes: this route allows it.
    const gw = await startTestGateway({ routes: [paymentsRoute(up.url, { maxResponseBytes: 32 * 1024 * 1024 })] });
    cleanups.push(() => gw.close());
    const big = Buffer.alloc(16 * 1024 * 1024, 7);
    const gate = up.gate();
    up.behave(() => ({
      kind: 'hold',
      gate: gate.promise,
      then: { kind: 'respond', status: 200, headers: { 'content-type': 'application/octet-stream' }, body: big },
    }));
    const inFlight = command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    await up.waitForCalls(1);

    const closing = gw.running.close();
    gate.open();
    const res = await inFlight;
    expect(res.status).toBe(200);
    // Larger than the socket buffers: the end is still being written when the handler returns.
    expect(Buffer.from(await res.arrayBuffer()).equals(big)).toBe(true);
    await closing;
  });
});

describe('kill -9 while the upstream call hangs', () => {
  // A gateway process is killed with SIGKILL while its upstream calls hang.
  // Nothing in it can clean up: only the locks it wrote (upstream timeout +
  // margin, on the database clock) and the next gateway on the same file
  // decide what happens to its records (G4).

  let up: FakeUpstream;
  let tmp: ReturnType<typeof tempDir>;
  let db: string;
  let restarted: Child & { url: string };

  // Short locks so that the test waits about a second for the expiry.
  const lock = { timeoutMs: 1_000, lockMarginMs: 300, maxWaitMs: 30_000 };
  const config = (sweepInterval: string) => ({
    listen: { host: '127.0.0.1', port: 0 },
    store: { sqlite: db, synchronous: 'NORMAL' },
    sweepInterval,
    routes: [
      paymentsRoute('UPSTREAM', { ...lock, onUnknown: 'reject' }),
      paymentsRoute('UPSTREAM', { ...lock, name: 'idempotent-upstream', match: { path: '/retrying/*' }, onUnknown: 'retry' }),
    ],
  });
  const hanging = [
    { path: '/payments/charges', entity: 'job-a', key: 'crash-reject' },
    { path: '/retrying/charges', entity: 'job-b', key: 'crash-retry' },
    { path: '/payments/charges', entity: 'job-c', key: 'crash-never-retried-1' },
    { path: '/payments/charges', entity: 'job-d', key: 'crash-never-retried-2' },
  ];

  function inProgress(): number {
    const conn = new Database(db, { readonly: true, fileMustExist: true });
    try {
      return (conn.prepare("SELECT count(*) AS n FROM idempotency_records WHERE state = 'in_progress'").get() as { n: number }).n;
    } finally {
      conn.close();
    }
  }

  beforeAll(async () => {
    tmp = tempDir();
    db = join(tmp.dir, 'crash.db');
    up = await startUpstream();
    const withUpstream = (c: ReturnType<typeof config>) => JSON.parse(JSON.stringify(c).replaceAll('UPSTREAM', up.url));
    // The first gateway's sweeper must not run (it dies anyway); the second's runs often.
    const first = await startGatewayChild([CLI, 'serve', '--config', writeJson(join(tmp.dir, 'first.json'), withUpstream(config('1h')))]);
    up.behave((call) => (call.seq <= hanging.length ? { kind: 'hang' } : undefined));
    const inFlight = hanging.map((h) =>
      command(first.url, h.path, { fence: 1, entity: h.entity, key: h.key }).then(
        (res) => res.status,
        (err: Error) => err,
      ),
    );
    await up.waitForCalls(hanging.length);
    expect(inProgress()).toBe(hanging.length);

    first.proc.kill('SIGKILL');
    expect((await first.exited).signal).toBe('SIGKILL');
    // The callers lost their connection: they do not know what happened.
    for (const r of await Promise.all(inFlight)) expect(r).toBeInstanceOf(Error);

    restarted = await startGatewayChild([CLI, 'serve', '--config', writeJson(join(tmp.dir, 'second.json'), withUpstream(config('100ms')))]);
  });

  afterAll(async () => {
    restarted?.proc.kill('SIGKILL');
    await restarted?.exited;
    await up?.close();
    tmp?.cleanup();
  });

  it('after the lock expires, a retry gets 409 outcome-unknown, and it is logged', async () => {
    // Prefer: wait lets the retry ride out the dead gateway's lock instead of sleeping here.
    const res = await command(restarted.url, '/payments/charges', { fence: 1, entity: 'job-a', key: 'crash-reject', headers: { prefer: 'wait=30' } });
    await expectProblem(res, 409, 'outcome-unknown', { idempotency_key: 'crash-reject' });
    expect(up.callsFor('crash-reject')).toHaveLength(1);
    const log: any = await (await fetch(`${restarted.url}/_fencegate/v1/rejections?reason=outcome-unknown&entity=job-a`)).json();
    expect(log.items).toMatchObject([{ reason: 'outcome-unknown', idempotency_key: 'crash-reject' }]);
    // The entity itself is not stuck: the dead gateway's serial slot expired too.
    expect((await command(restarted.url, '/payments/charges', { fence: 2, entity: 'job-a', key: 'after-crash' })).status).toBe(201);
  });

  it('with onUnknown "retry", the retry is forwarded once more, and then replayed', async () => {
    const res = await command(restarted.url, '/retrying/charges', { fence: 1, entity: 'job-b', key: 'crash-retry', headers: { prefer: 'wait=30' } });
    expect(res.status).toBe(201);
    const first = await effectOf(res);
    expect(up.callsFor('crash-retry')).toHaveLength(2);

    const again = await command(restarted.url, '/retrying/charges', { fence: 1, entity: 'job-b', key: 'crash-retry' });
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(await effectOf(again)).toEqual(first);
    expect(up.callsFor('crash-retry')).toHaveLength(2);
  });

  it('the sweeper leaves nothing in_progress, including records nobody retried', async () => {
    await until(() => inProgress() === 0, 'no in_progress record left');
    for (const key of ['crash-never-retried-1', 'crash-never-retried-2']) {
      const info: any = await (await fetch(`${restarted.url}/_fencegate/v1/idempotency/${key}`)).json();
      expect(info.records).toMatchObject([{ state: 'outcome_unknown' }]);
    }
    await restarted.waitForLine((l) => l.msg === 'sweep' && l.unknownRecords > 0, 'a sweep that marked records outcome_unknown');
    // A sweep through the store interface finds nothing more to do.
    const store = new SqliteGatewayStore({ path: db });
    try {
      expect((await store.sweep({ rejectionRetentionMs: 86_400_000 })).unknownRecords).toBe(0);
    } finally {
      await store.close();
    }
    expect(inProgress()).toBe(0);
  });
});
