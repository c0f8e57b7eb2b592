import { connect, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { bearer, hsAuth, token } from '../auth/tokens.js';
import { sendBytes } from '../faults/toolkit/raw-socket.js';
import { command, paymentsRoute, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// A client that half-closes after its request (nc, some HTTP/1.0 clients,
// shutdown(SHUT_WR)) still wants the answer: its FIN says it sends no more,
// not that it stopped listening. A real disconnect still does not cancel
// the upstream call (DESIGN §3.6), and the outcome is stored either way.
// Real gateway on loopback, real SQLite file, raw socket, recording upstream
// held until the client's FIN is in.

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
  return { fin: socket.then((s) => new Promise<void>((r) => s.once('end', () => r()))), closed: socket.then((s) => new Promise<void>((r) => s.once('close', () => r()))) };
}

describe('a client that half-closes after its request', () => {
  it('gets the whole answer (201 and its body) after its FIN, and the outcome is stored', async () => {
    const { up, gw } = await setup();
    const release = holdAnswers(up);
    const { fin } = nextConnection(gw);
    const answer = sendBytes(gw.url, request(gw, 'half-1'), { then: 'end', timeoutMs: 30_000 });
    await up.waitForCalls(1);
    await fin;
    release();
    const res = await answer;
    expect(res.status, res.raw.slice(0, 300)).toBe(201);
    expect(JSON.parse(res.text)).toMatchObject({ effect: 1, key: 'half-1' });
    // Stored: the retry is the replay, not a second effect.
    const again = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'half-1' });
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(up.effects).toBe(1);
  });

  it('the same with caller auth (the Hono way in)', async () => {
    const { up, gw } = await setup({ auth: hsAuth() });
    const release = holdAnswers(up);
    const auth = bearer(await token({ sub: 'billing' })).authorization;
    const { fin } = nextConnection(gw);
    const answer = sendBytes(gw.url, request(gw, 'half-2', [`Authorization: ${auth}`]), { then: 'end', timeoutMs: 30_000 });
    await up.waitForCalls(1);
    await fin;
    release();
    const res = await answer;
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
    await up.waitFor(() => up.calls[0]!.finished, 'the held call answered');
    const again = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'left-1', headers: { prefer: 'wait=10' } });
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(up.effects).toBe(1);
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
    await up.waitFor(() => up.calls[0]!.finished, 'the held call answered');
    // The finish may land just after the upstream answered: the retry waits for it (Prefer: wait) and is the replay either way.
    const again = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'gone-1', headers: { prefer: 'wait=10' } });
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(up.effects).toBe(1);
  });
});
