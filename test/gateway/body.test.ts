import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { command, paymentsRoute, snapshot, startTestGateway, until, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

/**
 * The body reader: on Node the gateway reads the raw IncomingMessage (no
 * WHATWG stream). A body that never completes must admit nothing.
 */
let upstream: FakeUpstream;
let gw: TestGateway;
beforeAll(async () => {
  upstream = await startUpstream();
  gw = await startTestGateway({ routes: [paymentsRoute(upstream.url)] });
});
afterAll(async () => {
  await gw?.close();
  await upstream?.close();
});

describe('request bodies', () => {
  it('a client that leaves mid-body admits nothing and reaches no upstream', async () => {
    const before = snapshot(gw.sqlite);
    const { hostname, port } = new URL(gw.url);
    const socket = connect(Number(port), hostname);
    await new Promise<void>((r) => socket.once('connect', () => r()));
    const head = [
      'POST /payments/charges HTTP/1.1',
      `Host: ${hostname}:${port}`,
      'Content-Type: application/json',
      'Content-Length: 1000',
      'X-Execution-Fence: 5',
      'X-Fence-Entity: tool-job:body-1',
      'Idempotency-Key: body-abort-1',
    ].join('\r\n');
    socket.write(`${head}\r\n\r\n{"amount": 12`);
    // Let the gateway start reading, then go away with 987 bytes missing.
    await new Promise((r) => setTimeout(r, 100));
    socket.destroy();
    // The handler has answered (to nobody) once the in-flight count is back to 0.
    await until(() => gw.running.gateway.inflight() === 0, 'the aborted request to be handled');
    expect(snapshot(gw.sqlite)).toBe(before);
    expect(upstream.effects).toBe(0);

    // The same key with a whole body is then a fresh command.
    const res = await command(gw.url, '/payments/charges', { fence: 5, entity: 'tool-job:body-1', key: 'body-abort-1', body: '{"amount": 12}' });
    expect(res.status).toBe(201);
    expect(upstream.effects).toBe(1);
  });

  it('a body streamed in many chunks is forwarded byte for byte', async () => {
    const bytes = Buffer.alloc(300_000);
    for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 7919) % 256;
    const res = await command(gw.url, '/payments/charges', {
      fence: 1,
      entity: 'tool-job:body-2',
      key: 'body-big-1',
      body: bytes,
      headers: { 'content-type': 'application/octet-stream' },
    });
    expect(res.status).toBe(201);
    const call = upstream.callsFor('body-big-1')[0]!;
    expect(Buffer.compare(call.body, bytes)).toBe(0);
  });
});
