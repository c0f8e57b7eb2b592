import { connect, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { bearer, hsAuth, token } from '../auth/tokens.js';
import { sendBytes, type RawAnswer } from '../faults/toolkit/raw-socket.js';
import { command, paymentsRoute, snapshot, startTestGateway, until, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// What the Node listener must not leave to Node's HTTP server defaults.
// Real gateway on loopback, real SQLite file, recording upstream, bytes on a
// raw socket.
//
// - Node's parser keeps header fields up to the server's cap and drops the
//   rest without a word: a check that reads a header past it sees nothing.
//   A request that reaches the cap is refused (431), never decided on a
//   partial view (DESIGN §3.3).
// - A client that half-closes after its request (nc, some HTTP/1.0 clients,
//   shutdown(SHUT_WR)) still wants the answer: its FIN says it sends no more,
//   not that it stopped listening. A real disconnect still does not cancel
//   the upstream call, and the outcome is stored either way (DESIGN §3.6).

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(config: Record<string, unknown> = {}, route: Record<string, unknown> = {}): Promise<{ up: FakeUpstream; gw: TestGateway }> {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const gw = await startTestGateway({ routes: [paymentsRoute(up.url, route)], config });
  cleanups.push(() => gw.close());
  return { up, gw };
}

/** A fenced POST, then `filler` short header fields, then Transfer-Encoding, and a chunked body. */
function cappedRequest(gw: TestGateway, filler: number, transferEncoding: string): string {
  const { host } = new URL(gw.url);
  const lines = [
    'POST /payments/charges HTTP/1.1',
    `Host: ${host}`,
    'Content-Type: application/json',
    'Connection: close',
    'X-Execution-Fence: 1',
    'X-Fence-Entity: e',
    'Idempotency-Key: k',
  ];
  for (let i = 0; i < filler; i++) lines.push(`f${i}: x`);
  lines.push(`Transfer-Encoding: ${transferEncoding}`);
  const body = '{"amount":1}';
  return `${lines.join('\r\n')}\r\n\r\n${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
}

describe('a request at the parser header cap', () => {
  it('Transfer-Encoding "gzip, chunked" behind 1100 filler fields: 431 headers-too-large, problem+json, not forwarded, nothing stored', async () => {
    const { up, gw } = await setup();
    const before = snapshot(gw.sqlite);
    const res = await sendBytes(gw.url, cappedRequest(gw, 1100, 'gzip, chunked'));
    expect(res.status, res.raw.slice(0, 300)).toBe(431);
    expect(res.headers['content-type']).toBe('application/problem+json');
    expect(JSON.parse(res.text)).toMatchObject({ type: expect.stringMatching(/\/headers-too-large$/), status: 431 });
    expect(up.calls).toHaveLength(0);
    expect(snapshot(gw.sqlite)).toBe(before);
  });

  it('with caller auth (the Hono way in): the same 431 before the token is looked at', async () => {
    const { up, gw } = await setup({ auth: hsAuth() });
    const res = await sendBytes(gw.url, cappedRequest(gw, 1100, 'gzip, chunked'));
    expect(res.status, res.raw.slice(0, 300)).toBe(431);
    expect(JSON.parse(res.text)).toMatchObject({ type: expect.stringMatching(/\/headers-too-large$/) });
    expect(up.calls).toHaveLength(0);
  });

  it('control: the same request without filler is 400 invalid-request (the check the cap hid)', async () => {
    const { up, gw } = await setup();
    const res = await sendBytes(gw.url, cappedRequest(gw, 0, 'gzip, chunked'));
    expect(res.status).toBe(400);
    expect(JSON.parse(res.text)).toMatchObject({ type: expect.stringMatching(/\/invalid-request$/) });
    expect(up.calls).toHaveLength(0);
  });

  it('a server with its own maxHeadersCount (50): its cap counts, 60 filler fields are 431 and 30 are forwarded', async () => {
    const { up, gw } = await setup();
    gw.running.server.maxHeadersCount = 50;
    const over = await sendBytes(gw.url, cappedRequest(gw, 60, 'chunked'));
    expect(over.status, over.raw.slice(0, 300)).toBe(431);
    expect(up.calls).toHaveLength(0);
    const under = await sendBytes(gw.url, cappedRequest(gw, 30, 'chunked'));
    expect(under.status, under.raw.slice(0, 300)).toBe(201);
    expect(up.calls).toHaveLength(1);
  });

  it('control: 900 filler fields (under the cap) and a plain chunked body are forwarded, every field seen', async () => {
    const { up, gw } = await setup();
    const res = await sendBytes(gw.url, cappedRequest(gw, 900, 'chunked'));
    expect(res.status, res.raw.slice(0, 300)).toBe(201);
    expect(up.calls).toHaveLength(1);
    expect(up.calls[0]!.headers['f899']).toBe('x');
    expect(up.calls[0]!.headers['idempotency-key']).toBe('k');
  });
});

function request(gw: TestGateway, key: string, extra: string[] = []): string {
  const { host } = new URL(gw.url);
  const body = '{"amount":1200}';
  return [
    'POST /payments/charges HTTP/1.1',
    `Host: ${host}`,
    'Content-Type: application/json',
    'X-Execution-Fence: 1',
    'X-Fence-Entity: e',
    `Idempotency-Key: ${key}`,
    `Content-Length: ${body.length}`,
    ...extra,
    '',
    body,
  ].join('\r\n');
}

/** Holds the upstream's answers until the returned function is called. */
function holdAnswers(up: FakeUpstream): () => void {
  const gate = up.gate();
  up.behave(() => ({ kind: 'hold', gate: gate.promise }));
  return () => {
    up.behave(null);
    gate.open();
  };
}

/** The gateway's side of its next connection: once it has read the client's FIN (so the upstream answers after it), and once it is closed. */
function nextConnection(gw: TestGateway): { fin: Promise<void>; closed: Promise<void> } {
  const socket = new Promise<Socket>((resolve) => gw.running.server.once('connection', resolve));
  return {
    fin: socket.then((s) => new Promise<void>((r) => s.once('end', () => r()))),
    closed: socket.then((s) => new Promise<void>((r) => s.once('close', () => r()))),
  };
}

/** Sends `bytes` and half-closes; the upstream answers only once the gateway has read the FIN. */
async function halfClosedExchange(gw: TestGateway, up: FakeUpstream, bytes: string): Promise<RawAnswer> {
  const release = holdAnswers(up);
  const { fin } = nextConnection(gw);
  const answer = sendBytes(gw.url, bytes, { then: 'end', timeoutMs: 30_000 });
  await up.waitForCalls(1);
  await fin;
  release();
  return answer;
}

/**
 * Once the held call has answered: the retry with the same key is its replay,
 * not a second effect (it waits, Prefer: wait, for a finish that may land
 * just after the upstream answered).
 */
async function expectReplayed(gw: TestGateway, up: FakeUpstream, key: string): Promise<void> {
  await up.waitFor(() => up.calls[0]!.finished, 'the held call answered');
  const again = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key, headers: { prefer: 'wait=10' } });
  expect(again.status).toBe(201);
  expect(again.headers.get('idempotent-replayed')).toBe('true');
  expect(up.effects).toBe(1);
}

describe('a client that half-closes after its request', () => {
  it('gets the whole answer (201 and its body) after its FIN, and the outcome is stored', async () => {
    const { up, gw } = await setup();
    const res = await halfClosedExchange(gw, up, request(gw, 'half-1'));
    expect(res.status, res.raw.slice(0, 300)).toBe(201);
    expect(JSON.parse(res.text)).toMatchObject({ effect: 1, key: 'half-1' });
    await expectReplayed(gw, up, 'half-1');
  });

  it('the same with caller auth (the Hono way in)', async () => {
    const { up, gw } = await setup({ auth: hsAuth() });
    const auth = bearer(await token({ sub: 'billing' })).authorization;
    const res = await halfClosedExchange(gw, up, request(gw, 'half-2', [`Authorization: ${auth}`]));
    expect(res.status, res.raw.slice(0, 300)).toBe(201);
    expect(JSON.parse(res.text)).toMatchObject({ effect: 1, key: 'half-2' });
  });

  it('a client that closes (FIN) and leaves: the upstream call completes, the outcome is stored, the connection closes once the answer is written', async () => {
    const { up, gw } = await setup();
    const release = holdAnswers(up);
    const { fin, closed } = nextConnection(gw);
    const socket = connect(Number(new URL(gw.url).port), '127.0.0.1');
    socket.on('error', () => {});
    socket.write(request(gw, 'left-1'));
    await up.waitForCalls(1);
    socket.destroy();
    await fin;
    release();
    await expectReplayed(gw, up, 'left-1');
    // The left connection is closed, not kept for a client that is gone.
    await closed;
  });

  it('control: a client that resets after its request gets nothing, the upstream call still completes and its outcome is replayed', async () => {
    const { up, gw } = await setup();
    const release = holdAnswers(up);
    const answer = sendBytes(gw.url, request(gw, 'gone-1'), { then: 'destroy', timeoutMs: 30_000 });
    await up.waitForCalls(1);
    expect((await answer).status).toBe(0);
    release();
    await expectReplayed(gw, up, 'gone-1');
  });
});

describe('a client that stops reading its answer (writeStallTimeout)', () => {
  // An answer larger than the kernel's socket buffers on loopback, so that
  // most of it waits in the gateway's memory for a client that takes none.
  const BIG = Buffer.alloc(8 * 1024 * 1024, 'a');
  const connections = (gw: TestGateway) => new Promise<number>((r) => gw.running.server.getConnections((_e, n) => r(n)));

  it('half-closed or not: every such connection is destroyed, the outcomes are stored and replayed to a reading retry', async () => {
    // 1s: the stall this test means to expire; nothing else here is timed.
    const { up, gw } = await setup({ writeStallTimeout: '1s' }, { maxResponseBytes: 16 * 1024 * 1024 });
    up.behave(() => ({ kind: 'respond', status: 201, body: BIG }));
    const port = Number(new URL(gw.url).port);
    const clients: Socket[] = [];
    for (let i = 0; i < 6; i++) {
      const s = connect({ port, host: '127.0.0.1', allowHalfOpen: true });
      s.on('error', () => {});
      s.pause(); // never reads
      s.write(request(gw, `stall-${i}`).replace('X-Fence-Entity: e', `X-Fence-Entity: e${i}`));
      if (i % 2 === 0) s.end(); // half the clients half-close after the request
      clients.push(s);
      cleanups.push(() => void s.destroy());
    }
    await up.waitForCalls(6);
    await until(async () => (await connections(gw)) === 0, 'the gateway to drop the stalled connections');
    // Control: a client that reads gets the whole 8 MB replay under the same timeout.
    const again = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e0', key: 'stall-0', headers: { prefer: 'wait=10' } });
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect((await again.arrayBuffer()).byteLength).toBe(BIG.length);
    expect(up.effects).toBe(6);
  });

  it('a client that reads the answer slowly, some of it every interval, is never cut off: it gets all of it', async () => {
    // The answer is one write, whose queued length stays whole until all of it is taken: the
    // stall check must see the bytes taken within it, or this reader is cut at the first check.
    const { up, gw } = await setup({ writeStallTimeout: '1s' }, { maxResponseBytes: 16 * 1024 * 1024 });
    up.behave(() => ({ kind: 'respond', status: 201, body: BIG }));
    const s = connect({ port: Number(new URL(gw.url).port), host: '127.0.0.1' });
    cleanups.push(() => void s.destroy());
    s.pause();
    s.write(request(gw, 'slow-reader', ['Connection: close']));
    let got = 0;
    const ended = new Promise<string>((resolve) => {
      s.on('end', () => resolve('end'));
      s.on('error', (e) => resolve(`error ${e.message}`));
      s.on('close', () => resolve('close'));
    });
    // Two reads every 50 ms (about 2.5 MB/s): some of the answer every interval, never all of it at once.
    let reads = 0;
    s.on('data', (chunk: Buffer) => {
      got += chunk.length;
      if (++reads % 2 === 0) s.pause();
    });
    const reader = setInterval(() => s.resume(), 50);
    cleanups.push(() => clearInterval(reader));
    expect(await ended).toBe('end');
    clearInterval(reader);
    expect(got).toBeGreaterThan(BIG.length);
    expect(up.effects).toBe(1);
  });

  it('the default is 30s, and less than 1s stops start-up', async () => {
    const { gw } = await setup();
    expect(gw.config.writeStallTimeout).toBe(30_000);
    await expect(setup({ writeStallTimeout: '500ms' })).rejects.toThrow(/writeStallTimeout.*at least 1s/s);
  });
});
