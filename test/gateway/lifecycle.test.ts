import Database from 'better-sqlite3';
import { connect } from 'node:net';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { command, effectOf, paymentsRoute, recordRows, startTestGateway, tempDir, until } from '../helpers/gateway.js';
import { CLI, killChildren, startGatewayChild, writeJson } from '../helpers/child.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  await killChildren();
  for (const c of cleanups.splice(0)) await c();
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
    socket.destroy();
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
  it('SIGTERM while a request is in flight: the request completes, new connections are refused, the process exits 0', async () => {
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
    expect(child.url).not.toMatch(/:8080$/);

    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise }));
    const inFlight = command(child.url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    await up.waitForCalls(1);

    child.proc.kill('SIGTERM');
    const line = await child.waitForLine((l) => l.msg === 'shutting-down', 'shutting-down');
    expect(line).toMatchObject({ signal: 'SIGTERM', inflight: 1 });
    await expect(fetch(`${child.url}/_fencegate/health`)).rejects.toThrow();

    gate.open();
    const res = await inFlight;
    expect(res.status).toBe(201);
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
