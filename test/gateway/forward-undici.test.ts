import { spawn } from 'node:child_process';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { connect, createServer as createNetServer, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { buildConnector } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { createUndiciForwarder, type UndiciForwarderOptions } from '../../src/http/forward-undici.js';
import type { Forwarder, UpstreamRequest } from '../../src/http/forward.js';

// The Node forwarder (src/http/forward-undici.ts) drives undici's dispatch
// with its own handler instead of request(). These are the answers the
// gateway's outcomes rest on (DESIGN §3.7): what came back, and whether a
// request that got no answer may have reached the upstream.

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  body: string;
}

async function upstream(handle: (req: IncomingMessage, res: ServerResponse, seen: Seen) => void): Promise<{ origin: string; seen: Seen[] }> {
  const seen: Seen[] = [];
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const s = { method: req.method!, url: req.url!, headers: req.headers, body: Buffer.concat(chunks).toString() };
      seen.push(s);
      handle(req, res, s);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  cleanups.push(() => {
    server.closeAllConnections();
    return new Promise<void>((r) => server.close(() => r()));
  });
  return { origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen };
}

function forwarder(connections?: number, options: UndiciForwarderOptions = {}): Forwarder {
  const f = createUndiciForwarder({ connections, ...options });
  cleanups.push(() => f.close?.());
  return f;
}

const post = (url: string, extra: Partial<UpstreamRequest> = {}): UpstreamRequest => ({
  url,
  method: 'POST',
  headers: { 'content-type': 'application/json', 'x-fence-entity': 'e' },
  body: new TextEncoder().encode('{"amount":1}'),
  timeoutMs: 2_000,
  maxResponseBytes: 1_048_576,
  ...extra,
});

describe('undici forwarder', () => {
  it('sends method, path, query, headers and body once; collects a chunked answer and repeated headers', async () => {
    const up = await upstream((_req, res) => {
      res.setHeader('set-cookie', ['a=1', 'b=2']);
      res.setHeader('content-type', 'application/json');
      res.writeHead(201);
      res.write('{"id":');
      setTimeout(() => res.end('"ch_1"}'), 20);
    });
    const result = await forwarder().forward(post(`${up.origin}/payments/charges?x=1&y=%20`));
    expect(up.seen).toHaveLength(1);
    expect(up.seen[0]).toMatchObject({ method: 'POST', url: '/payments/charges?x=1&y=%20', body: '{"amount":1}' });
    expect(up.seen[0]!.headers).toMatchObject({ 'content-type': 'application/json', 'x-fence-entity': 'e' });
    expect(result.kind).toBe('response');
    if (result.kind !== 'response') return;
    expect(result.status).toBe(201);
    expect(new TextDecoder().decode(result.body)).toBe('{"id":"ch_1"}');
    expect(result.headers.filter(([n]) => n === 'set-cookie')).toEqual([
      ['set-cookie', 'a=1'],
      ['set-cookie', 'b=2'],
    ]);
    expect(result.headers).toContainEqual(['content-type', 'application/json']);
  });

  it('an upstream base path is kept', async () => {
    const up = await upstream((_req, res) => res.end('ok'));
    const result = await forwarder().forward(post(`${up.origin}/v2/payments/charges`, { method: 'PUT', body: null }));
    expect(result).toMatchObject({ kind: 'response', status: 200 });
    expect(up.seen[0]).toMatchObject({ method: 'PUT', url: '/v2/payments/charges', body: '' });
  });

  it('1xx informational answers are skipped: the final status and headers are the answer', async () => {
    const up = await upstream((_req, res) => {
      res.writeEarlyHints({ link: '</a.css>; rel=preload' }, () => {
        res.writeHead(202, { 'x-final': 'yes' });
        res.end('accepted');
      });
    });
    const result = await forwarder().forward(post(`${up.origin}/payments/charges`));
    expect(result).toMatchObject({ kind: 'response', status: 202 });
    if (result.kind !== 'response') return;
    expect(result.headers).toContainEqual(['x-final', 'yes']);
    expect(result.headers.some(([n]) => n === 'link')).toBe(false);
    expect(new TextDecoder().decode(result.body)).toBe('accepted');
  });

  it('HEAD and 204 give an empty body', async () => {
    const up = await upstream((req, res) => {
      res.writeHead(req.method === 'HEAD' ? 200 : 204, { 'content-length': req.method === 'HEAD' ? '5' : '0' });
      res.end();
    });
    for (const method of ['HEAD', 'DELETE']) {
      const result = await forwarder().forward(post(`${up.origin}/x`, { method, body: null }));
      expect(result.kind).toBe('response');
      if (result.kind === 'response') expect(result.body.byteLength).toBe(0);
    }
  });

  it('CONNECT is refused before anything is sent (dispatch would hand the socket over and never answer)', async () => {
    const up = await upstream((_req, res) => res.end('ok'));
    expect(await forwarder().forward(post(`${up.origin}/x`, { method: 'CONNECT', body: null }))).toEqual({ kind: 'refused', error: 'CONNECT-not-forwarded' });
    await new Promise((r) => setTimeout(r, 50));
    expect(up.seen).toEqual([]);
  });

  it('connection refused: "refused" (nothing was sent)', async () => {
    const probe = createNetServer();
    await new Promise<void>((r) => probe.listen(0, '127.0.0.1', r));
    const port = (probe.address() as AddressInfo).port;
    await new Promise<void>((r) => probe.close(() => r()));
    const result = await forwarder().forward(post(`http://127.0.0.1:${port}/x`));
    expect(result).toEqual({ kind: 'refused', error: 'ECONNREFUSED' });
  });

  it('a reset after the request was sent: "unknown", not a timeout', async () => {
    const up = await upstream((req) => req.socket.destroy());
    const result = await forwarder().forward(post(`${up.origin}/x`));
    expect(up.seen).toHaveLength(1);
    expect(result).toMatchObject({ kind: 'unknown', timedOut: false });
  });

  it('a "not connected" error code after the request was written is "unknown", not "refused"', async () => {
    // Linux reports EHOSTUNREACH on an open connection whose retransmissions
    // ran out after an ICMP unreachable. Here the socket is failed that way
    // once the upstream has the request.
    const sockets: Socket[] = [];
    const base = buildConnector({});
    const f = createUndiciForwarder({
      connect: (opts, callback) =>
        base(opts, (err, socket) => {
          if (socket) sockets.push(socket as Socket);
          callback(err, socket as never);
        }),
    });
    cleanups.push(() => f.close?.());
    const up = await upstream(() => {
      sockets[0]!.destroy(Object.assign(new Error('no route to host'), { code: 'EHOSTUNREACH' }));
    });
    const result = await f.forward(post(`${up.origin}/x`));
    expect(up.seen).toHaveLength(1);
    expect(result).toEqual({ kind: 'unknown', error: 'EHOSTUNREACH', timedOut: false });
  });

  it('the deadline covers the whole body: a trickle that keeps each chunk inside the body timeout still ends at the deadline', async () => {
    let stop = false;
    const up = await upstream((_req, res) => {
      res.writeHead(200);
      const tick = () => {
        if (stop) return res.end();
        res.write('.');
        setTimeout(tick, 40);
      };
      tick();
    });
    cleanups.push(() => void (stop = true));
    const started = Date.now();
    const result = await forwarder().forward(post(`${up.origin}/x`, { timeoutMs: 300 }));
    expect(result).toEqual({ kind: 'unknown', error: 'timeout', timedOut: true });
    // The trickle would go on forever; ending at all, well inside the 30 s
    // test timeout, is the point. The bound is loose so that a stalled CPU
    // cannot fail a forwarder that did stop at its 300 ms deadline.
    expect(Date.now() - started).toBeLessThan(10_000);
  });

  it('a request still queued for a connection at its deadline is "refused" (nothing sent) and never sent afterwards', async () => {
    let release: () => void = () => {};
    const up = await upstream((req, res) => {
      if (req.url === '/slow') release = () => res.end('slow');
      else res.end('fast');
    });
    const f = forwarder(1);
    const slow = f.forward(post(`${up.origin}/slow`, { timeoutMs: 5_000 }));
    await expect.poll(() => up.seen.length, { timeout: 10_000 }).toBe(1);
    // One connection, busy: this one waits in undici's queue past its deadline.
    const queued = await f.forward(post(`${up.origin}/queued`, { timeoutMs: 150 }));
    expect(queued).toEqual({ kind: 'refused', error: 'deadline-before-send' });
    release();
    expect(await slow).toMatchObject({ kind: 'response', status: 200 });
    // The connection is free again; the expired request must not go out on it.
    expect(await f.forward(post(`${up.origin}/after`))).toMatchObject({ kind: 'response', status: 200 });
    expect(up.seen.map((s) => s.url)).toEqual(['/slow', '/after']);
  });

  it('a connect that hangs past the deadline is "refused" (nothing sent), and the request is not sent once the connect completes', async () => {
    // An HTTP server that logs each connection and request line, stopped
    // (SIGSTOP) with its one-slot accept queue full: a new connect hangs.
    const child = spawn(
      process.execPath,
      [
        '-e',
        `const s = require('node:http').createServer((req, res) => { console.log('request ' + req.url); res.end('ok'); });
         s.on('connection', () => console.log('connection'));
         s.listen({ port: 0, host: '127.0.0.1', backlog: 1 }, () => console.log('port ' + s.address().port));`,
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    const lines: string[] = [];
    child.stdout!.setEncoding('utf8');
    child.stdout!.on('data', (d: string) => lines.push(...d.split('\n').filter(Boolean)));
    const fillers: Socket[] = [];
    cleanups.push(() => {
      for (const s of fillers) s.destroy();
      child.kill('SIGKILL');
    });
    await expect.poll(() => lines.find((l) => l.startsWith('port ')), { timeout: 5_000 }).toBeDefined();
    const port = Number(lines.find((l) => l.startsWith('port '))!.slice(5));
    child.kill('SIGSTOP');
    for (let i = 0; i < 4; i++) {
      const s = connect(port, '127.0.0.1');
      s.on('error', () => {});
      fillers.push(s);
    }
    // One connection per origin: the next request queues behind this one.
    const f = forwarder(1);
    const result = await f.forward(post(`http://127.0.0.1:${port}/hung`, { timeoutMs: 400 }));
    expect(result).toEqual({ kind: 'refused', error: 'deadline-before-send' });
    // Let the server go on. The expired request stays in undici's queue
    // until a connection is up; the next request on the same pool goes out
    // after it, so by its answer the expired one has had its chance.
    child.kill('SIGCONT');
    expect(await f.forward(post(`http://127.0.0.1:${port}/after`, { timeoutMs: 10_000 }))).toMatchObject({ kind: 'response', status: 200 });
    // The child's log line and its answer travel on different pipes: wait for the line.
    await expect.poll(() => lines.filter((l) => l.startsWith('request ')), { timeout: 5_000 }).toEqual(['request /after']);
  }, 20_000);
});

/** Writes `chunk` to `res` until the connection closes, honouring backpressure; resolves with the bytes written once `res` closes. */
function writeForever(res: ServerResponse, chunk: Buffer): Promise<number> {
  let written = 0;
  return new Promise((resolve) => {
    res.once('close', () => resolve(written));
    const pump = () => {
      while (!res.destroyed) {
        written += chunk.length;
        if (!res.write(chunk)) return void res.once('drain', pump);
      }
    };
    pump();
  });
}

describe('undici forwarder: maxResponseBytes', () => {
  const LIMIT = 64 * 1024;

  it('a content-length over the limit: "too-large" with the status, without waiting for the body', async () => {
    const up = await upstream((_req, res) => {
      // 512 MiB announced, and none of it sent: only the header can end this before the test's timeout.
      res.writeHead(201, { 'content-length': String(512 * 1024 * 1024) });
      res.flushHeaders();
    });
    const result = await forwarder().forward(post(`${up.origin}/x`, { maxResponseBytes: LIMIT, timeoutMs: 600_000 }));
    expect(result).toEqual({ kind: 'too-large', status: 201, limit: LIMIT });
    expect(up.seen).toHaveLength(1);
  });

  it('a chunked answer that crosses the limit: "too-large"', async () => {
    const up = await upstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      for (let i = 0; i < 10; i++) res.write(Buffer.alloc(16 * 1024, 0x62));
      res.end();
    });
    expect(await forwarder().forward(post(`${up.origin}/x`, { maxResponseBytes: LIMIT, timeoutMs: 60_000 }))).toEqual({
      kind: 'too-large',
      status: 200,
      limit: LIMIT,
    });
  });

  it('an endless chunked answer: "too-large" at the limit, not at the deadline, and the connection is closed', async () => {
    let closed!: Promise<number>;
    const up = await upstream((_req, res) => {
      res.writeHead(200);
      closed = writeForever(res, Buffer.alloc(1024, 0x63));
    });
    // The deadline is far past this test's own timeout: only the limit can end it in time.
    const result = await forwarder().forward(post(`${up.origin}/x`, { maxResponseBytes: LIMIT, timeoutMs: 600_000 }));
    expect(result).toEqual({ kind: 'too-large', status: 200, limit: LIMIT });
    // The upstream's writes end because the gateway hung up, not because it stopped.
    expect(await closed).toBeGreaterThan(LIMIT);
  });

  it('exactly at the limit is an answer, one byte over is not (content-length and chunked)', async () => {
    const up = await upstream((req, res) => {
      const n = Number(new URL(req.url!, 'http://x').searchParams.get('n'));
      const body = Buffer.alloc(n, 0x64);
      if (req.url!.startsWith('/length')) {
        res.writeHead(200, { 'content-length': String(n) });
        res.end(body);
      } else {
        res.writeHead(200);
        // Two chunks, so that the limit is met across a chunk boundary.
        res.write(body.subarray(0, 1000));
        res.end(body.subarray(1000));
      }
    });
    const f = forwarder();
    for (const framing of ['length', 'chunked']) {
      const at = await f.forward(post(`${up.origin}/${framing}?n=${LIMIT}`, { maxResponseBytes: LIMIT }));
      expect(at.kind, framing).toBe('response');
      if (at.kind === 'response') expect(Buffer.from(at.body).equals(Buffer.alloc(LIMIT, 0x64)), framing).toBe(true);
      expect(await f.forward(post(`${up.origin}/${framing}?n=${LIMIT + 1}`, { maxResponseBytes: LIMIT })), framing).toEqual({
        kind: 'too-large',
        status: 200,
        limit: LIMIT,
      });
    }
    // A limit of 0 takes empty answers only.
    expect(await f.forward(post(`${up.origin}/length?n=0`, { maxResponseBytes: 0 }))).toMatchObject({ kind: 'response', status: 200 });
    expect(await f.forward(post(`${up.origin}/chunked?n=1001`, { maxResponseBytes: 0 }))).toEqual({ kind: 'too-large', status: 200, limit: 0 });
  });

  it("a HEAD answer's content-length describes no bytes: not too large", async () => {
    const up = await upstream((_req, res) => {
      res.writeHead(200, { 'content-length': String(10 * LIMIT) });
      res.end();
    });
    const result = await forwarder().forward(post(`${up.origin}/x`, { method: 'HEAD', body: null, maxResponseBytes: LIMIT }));
    expect(result).toMatchObject({ kind: 'response', status: 200 });
    if (result.kind === 'response') expect(result.body.byteLength).toBe(0);
  });
});

describe('undici forwarder: startBy', () => {
  it('startBy already past: "refused" (start-deadline-passed) and nothing is sent', async () => {
    const up = await upstream((_req, res) => res.end('ok'));
    const f = forwarder(1);
    expect(await f.forward(post(`${up.origin}/late`, { startBy: performance.now() - 1 }))).toEqual({ kind: 'refused', error: 'start-deadline-passed' });
    // The next request on the same one-connection pool goes out after it had its chance.
    expect(await f.forward(post(`${up.origin}/after`, { startBy: performance.now() + 60_000 }))).toMatchObject({ kind: 'response', status: 200 });
    expect(up.seen.map((s) => s.url)).toEqual(['/after']);
  });

  it('checked when the request would start: one queued past its startBy is refused, not sent', async () => {
    let release: () => void = () => {};
    const up = await upstream((req, res) => {
      if (req.url === '/slow') release = () => res.end('slow');
      else res.end('fast');
    });
    const f = forwarder(1);
    const slow = f.forward(post(`${up.origin}/slow`, { timeoutMs: 5_000 }));
    await expect.poll(() => up.seen.length, { timeout: 10_000 }).toBe(1);
    // Queued behind /slow on the one connection, with a start bound that passes while it waits.
    const queued = f.forward(post(`${up.origin}/queued`, { timeoutMs: 5_000, startBy: performance.now() + 100 }));
    await new Promise((r) => setTimeout(r, 200));
    release();
    expect(await queued).toEqual({ kind: 'refused', error: 'start-deadline-passed' });
    expect(await slow).toMatchObject({ kind: 'response', status: 200 });
    expect(await f.forward(post(`${up.origin}/after`))).toMatchObject({ kind: 'response', status: 200 });
    expect(up.seen.map((s) => s.url)).toEqual(['/slow', '/after']);
  });
});

describe('undici forwarder: an answer already in the socket when the deadline comes due', () => {
  /** Blocks this process's event loop, as a GC or VM pause would (a stopped process, in one file). */
  const block = (ms: number) => {
    const until = performance.now() + ms;
    while (performance.now() < until);
  };

  // The upstream writes its answer, then the loop is blocked past the
  // deadline before this process reads it. When the loop runs again, the due
  // deadline timer comes first (libuv runs timers before it polls sockets).
  async function answeredDuringPause(options: UndiciForwarderOptions) {
    const up = await upstream((_req, res) => {
      res.writeHead(201, { 'content-type': 'application/json' });
      res.end('{"id":"ch_1"}');
      // After the answer's bytes were written (res.end uncorks on the next tick).
      setImmediate(() => block(400));
    });
    return { up, result: await forwarder(undefined, options).forward(post(`${up.origin}/x`, { timeoutMs: 150 })) };
  }

  it('is read and returned, not turned into a timeout', async () => {
    const { up, result } = await answeredDuringPause({});
    expect(up.seen).toHaveLength(1);
    expect(result).toMatchObject({ kind: 'response', status: 201 });
    if (result.kind === 'response') expect(new TextDecoder().decode(result.body)).toBe('{"id":"ch_1"}');
  });

  it('negative control: without the grace turns the same answer is lost as "unknown" (timeout)', async () => {
    const { result } = await answeredDuringPause({ deadlineGraceTurns: 0 });
    expect(result).toEqual({ kind: 'unknown', error: 'timeout', timedOut: true });
  });
});
