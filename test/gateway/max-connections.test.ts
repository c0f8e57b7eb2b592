import { connect, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { createJsonLogger } from '../../src/http/logger.js';
import { command, paymentsRoute, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream } from '../helpers/upstream.js';

// `maxConnections`: real sockets on 127.0.0.1 against the gateway as
// `fencegate serve` runs it. The connection over the cap is closed without
// an answer; the ones under it keep working; a freed place is reused.

const cleanups: (() => Promise<void> | void)[] = [];
const sockets: Socket[] = [];
afterEach(async () => {
  for (const s of sockets.splice(0)) s.destroy();
  for (const c of cleanups.splice(0).reverse()) await c();
});

interface Conn {
  socket: Socket;
  /** Everything received so far. */
  received(): string;
  /** Resolves when the server has closed the connection. */
  closed: Promise<void>;
}

async function open(url: string): Promise<Conn> {
  const { hostname, port } = new URL(url);
  const socket = connect(Number(port), hostname);
  sockets.push(socket);
  let data = '';
  socket.setEncoding('latin1').on('data', (c: string) => (data += c));
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  socket.on('error', () => {});
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  return { socket, received: () => data, closed };
}

const GET_HEALTH = 'GET /_fencegate/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n';
const payment = (key: string) => {
  const body = '{"amount":1200}';
  return `POST /payments/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Execution-Fence: 1\r\nX-Fence-Entity: ${key}\r\nIdempotency-Key: ${key}\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
};

/** One keep-alive request on the connection; resolves with the status once the whole answer is in. */
async function send(conn: Conn, request = GET_HEALTH): Promise<number> {
  const start = conn.received().length;
  conn.socket.write(request);
  for (;;) {
    const text = conn.received().slice(start);
    const head = text.indexOf('\r\n\r\n');
    if (head >= 0) {
      const length = /\r\ncontent-length: *(\d+)/i.exec(text.slice(0, head));
      if (length && text.length >= head + 4 + Number(length[1])) return Number(/^HTTP\/1\.1 (\d{3})/.exec(text)![1]);
    }
    const more = new Promise<void>((resolve) => conn.socket.once('data', () => resolve()));
    const gone = conn.closed.then(() => 'closed' as const);
    if ((await Promise.race([more, gone])) === 'closed' && conn.received().length === start) throw new Error('connection closed without an answer');
  }
}

async function gatewayWith(maxConnections: number | undefined, logs: string[] = []): Promise<TestGateway> {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const gw = await startTestGateway({
    routes: [paymentsRoute(up.url)],
    config: maxConnections === undefined ? {} : { maxConnections },
    logger: createJsonLogger({ write: (l) => logs.push(l) }),
  });
  cleanups.unshift(() => gw.close());
  // Held connections must not time out idle (5 s by default) on a slow machine.
  gw.running.server.keepAliveTimeout = 120_000;
  return gw;
}

/** Until the server counts `n` connections (it learns of a close a moment after the client). */
async function connectionsReach(gw: TestGateway, n: number): Promise<void> {
  for (let i = 0; i < 500; i++) {
    const count = await new Promise<number>((resolve, reject) => gw.running.server.getConnections((err, c) => (err ? reject(err) : resolve(c))));
    if (count === n) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`the server never counted ${n} connections`);
}

describe('maxConnections', () => {
  it('defaults to 10000 and is validated', () => {
    const route = paymentsRoute('http://127.0.0.1:9');
    expect(parseConfig({ routes: [route] }).maxConnections).toBe(10_000);
    expect(() => parseConfig({ routes: [route], maxConnections: 0 })).toThrow(/maxConnections/);
    expect(() => parseConfig({ routes: [route], maxConnections: 1.5 })).toThrow(/maxConnections/);
  });

  it('cap + 1: the extra connection is closed without an answer, the others keep working, a freed place is reused', async () => {
    const logs: string[] = [];
    const gw = await gatewayWith(3, logs);
    const held = [await open(gw.url), await open(gw.url), await open(gw.url)];
    for (const c of held) expect(await send(c)).toBe(200);
    await connectionsReach(gw, 3);

    const extra = await open(gw.url); // the kernel accepts; the gateway closes it at once
    extra.socket.write(payment('over-the-cap'));
    await extra.closed;
    expect(extra.received()).toBe('');
    expect(logs.map((l) => JSON.parse(l)).filter((l) => l.msg === 'connections-dropped')).toMatchObject([{ level: 'warn', max_connections: 3, dropped: 1 }]);

    // The three under the cap: still served, proxied commands included.
    for (const c of held) expect(await send(c)).toBe(200);
    expect(await send(held[1]!, payment('under-the-cap'))).toBe(201);
    expect(held.every((c) => !c.socket.destroyed)).toBe(true);

    // One leaves: its place is free again.
    held[0]!.socket.end();
    await held[0]!.closed;
    await connectionsReach(gw, 2);
    const next = await open(gw.url);
    expect(await send(next)).toBe(200);
    const res = await command(gw.url, '/payments/x', { fence: 1, entity: 'e', key: 'k' }).catch((err: unknown) => err);
    // fetch opens a 4th connection: over the cap again, refused before anything was admitted.
    expect(res).toBeInstanceOf(Error);
    // Only the command sent under the cap was ever admitted.
    expect(gw.sqlite.db.prepare('SELECT key FROM idempotency_records').all()).toEqual([{ key: 'under-the-cap' }]);
  });

  it('negative control: with a cap one higher, the same fourth connection is answered', async () => {
    const gw = await gatewayWith(4);
    const held = [await open(gw.url), await open(gw.url), await open(gw.url)];
    for (const c of held) expect(await send(c)).toBe(200);
    await connectionsReach(gw, 3);
    const fourth = await open(gw.url);
    expect(await send(fourth)).toBe(200);
  });
});
