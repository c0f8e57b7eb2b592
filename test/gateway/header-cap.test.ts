import { afterEach, describe, expect, it } from 'vitest';
import { hsAuth } from '../auth/tokens.js';
import { sendBytes } from '../faults/toolkit/raw-socket.js';
import { paymentsRoute, snapshot, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// Node's HTTP parser keeps header fields up to the server's cap and drops
// the rest without a word: a check that reads a header past it sees nothing.
// A request that reaches the cap is refused (431), never decided on a
// partial view. Real gateway on loopback, real SQLite file, recording
// upstream, bytes written on a raw socket.

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(config: Record<string, unknown> = {}): Promise<{ up: FakeUpstream; gw: TestGateway }> {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const gw = await startTestGateway({ routes: [paymentsRoute(up.url)], config });
  cleanups.push(() => gw.close());
  return { up, gw };
}

/** A fenced POST, then `filler` short header fields, then Transfer-Encoding, and a chunked body. */
function request(gw: TestGateway, filler: number, transferEncoding: string): string {
  const { host } = new URL(gw.url);
  const lines = ['POST /payments/charges HTTP/1.1', `Host: ${host}`, 'Content-Type: application/json', 'Connection: close', 'X-Execution-Fence: 1', 'X-Fence-Entity: e', 'Idempotency-Key: k'];
  for (let i = 0; i < filler; i++) lines.push(`f${i}: x`);
  lines.push(`Transfer-Encoding: ${transferEncoding}`);
  const body = '{"amount":1}';
  return `${lines.join('\r\n')}\r\n\r\n${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
}

describe('a request at the parser header cap', () => {
  it('Transfer-Encoding "gzip, chunked" behind 1100 filler fields: 431 headers-too-large, problem+json, not forwarded, nothing stored', async () => {
    const { up, gw } = await setup();
    const before = snapshot(gw.sqlite);
    const res = await sendBytes(gw.url, request(gw, 1100, 'gzip, chunked'));
    expect(res.status, res.raw.slice(0, 300)).toBe(431);
    expect(res.headers['content-type']).toBe('application/problem+json');
    expect(JSON.parse(res.text)).toMatchObject({ type: expect.stringMatching(/\/headers-too-large$/), status: 431 });
    expect(up.calls).toHaveLength(0);
    expect(snapshot(gw.sqlite)).toBe(before);
  });

  it('with caller auth (the Hono way in): the same 431 before the token is looked at', async () => {
    const { up, gw } = await setup({ auth: hsAuth() });
    const res = await sendBytes(gw.url, request(gw, 1100, 'gzip, chunked'));
    expect(res.status, res.raw.slice(0, 300)).toBe(431);
    expect(JSON.parse(res.text)).toMatchObject({ type: expect.stringMatching(/\/headers-too-large$/) });
    expect(up.calls).toHaveLength(0);
  });

  it('control: the same request without filler is 400 invalid-request (the check the cap hid)', async () => {
    const { up, gw } = await setup();
    const res = await sendBytes(gw.url, request(gw, 0, 'gzip, chunked'));
    expect(res.status).toBe(400);
    expect(JSON.parse(res.text)).toMatchObject({ type: expect.stringMatching(/\/invalid-request$/) });
    expect(up.calls).toHaveLength(0);
  });

  it('control: 900 filler fields (under the cap) and a plain chunked body are forwarded, every field seen', async () => {
    const { up, gw } = await setup();
    const res = await sendBytes(gw.url, request(gw, 900, 'chunked'));
    expect(res.status, res.raw.slice(0, 300)).toBe(201);
    expect(up.calls).toHaveLength(1);
    expect(up.calls[0]!.headers['f899']).toBe('x');
    expect(up.calls[0]!.headers['idempotency-key']).toBe('k');
  });
});
