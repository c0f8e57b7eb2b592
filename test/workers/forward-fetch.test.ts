/**
 * The fetch forwarder's refused / unknown / response distinction and its
 * content-encoding rule, under Node's own fetch (undici). Under workerd the
 * same forwarder is exercised end to end by worker.workerd.ts.
 */
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createFetchForwarder } from '../../src/http/forward-fetch.js';
import type { UpstreamRequest } from '../../src/http/forward.js';
import { freePort, startUpstream, type FakeUpstream } from '../helpers/upstream.js';

describe('createFetchForwarder (Node fetch)', () => {
  let upstream: FakeUpstream;
  const forwarder = createFetchForwarder();
  const req = (path: string, over: Partial<UpstreamRequest> = {}): UpstreamRequest => ({
    url: `${upstream.url}${path}`,
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': 'k-1', 'cf-connecting-ip': '192.0.2.1' },
    body: new TextEncoder().encode('{"amount":1}'),
    timeoutMs: 2_000,
    maxResponseBytes: 1_048_576,
    ...over,
  });

  beforeAll(async () => {
    upstream = await startUpstream();
  });
  afterAll(async () => {
    await upstream.close();
  });

  it('returns the response with its headers; cf-* headers are not forwarded', async () => {
    const r = await forwarder.forward(req('/a'));
    expect(r).toMatchObject({ kind: 'response', status: 201 });
    const call = upstream.calls.at(-1)!;
    expect(call.headers['idempotency-key']).toBe('k-1');
    expect(call.headers['cf-connecting-ip']).toBeUndefined();
    expect(call.body.toString()).toBe('{"amount":1}');
  });

  it('drops content-encoding when fetch decoded the body', async () => {
    upstream.behave(() => ({
      kind: 'respond',
      status: 200,
      headers: { 'content-type': 'text/plain', 'content-encoding': 'gzip' },
      body: gzipSync('plain text'),
    }));
    try {
      const r = await forwarder.forward(req('/gz'));
      if (r.kind !== 'response') throw new Error(r.kind);
      expect(new TextDecoder().decode(r.body)).toBe('plain text');
      expect(r.headers.find(([n]) => n === 'content-encoding')).toBeUndefined();
    } finally {
      upstream.behave(null);
    }
  });

  it('passes redirects through instead of following them', async () => {
    upstream.behave(() => ({ kind: 'respond', status: 302, headers: { location: '/elsewhere' } }));
    try {
      expect(await forwarder.forward(req('/r'))).toMatchObject({ kind: 'response', status: 302 });
      expect(upstream.calls.filter((c) => c.url === '/elsewhere')).toEqual([]);
    } finally {
      upstream.behave(null);
    }
  });

  it('a connection refused is "refused" (nothing sent); a reset or a timeout is "unknown"', async () => {
    const port = await freePort();
    expect(await forwarder.forward(req('/x', { url: `http://127.0.0.1:${port}/x` }))).toMatchObject({ kind: 'refused', error: 'ECONNREFUSED' });
    upstream.behave(() => ({ kind: 'reset' }));
    try {
      expect(await forwarder.forward(req('/reset'))).toMatchObject({ kind: 'unknown', timedOut: false });
    } finally {
      upstream.behave(null);
    }
    upstream.behave(() => ({ kind: 'hang' }));
    try {
      expect(await forwarder.forward(req('/hang', { timeoutMs: 200 }))).toEqual({ kind: 'unknown', error: 'timeout', timedOut: true });
    } finally {
      upstream.behave(null);
    }
  });

  it('EHOSTUNREACH and ENETUNREACH are "unknown": fetch cannot say whether the request was written first', async () => {
    for (const code of ['EHOSTUNREACH', 'ENETUNREACH']) {
      const failing = createFetchForwarder({
        fetch: async (request) => {
          await request.arrayBuffer();
          throw new TypeError('fetch failed', { cause: Object.assign(new Error('no route'), { code }) });
        },
      });
      expect(await failing.forward(req('/x'))).toEqual({ kind: 'unknown', error: code, timedOut: false });
    }
  });

  it("Cloudflare's edge statuses: 521 refused, 524 unknown, only when the edge says so (server: cloudflare)", async () => {
    upstream.behave(() => ({ kind: 'respond', status: 521, headers: { server: 'cloudflare' }, body: 'origin down' }));
    try {
      expect(await forwarder.forward(req('/cf'))).toEqual({ kind: 'refused', error: 'cloudflare-521' });
    } finally {
      upstream.behave(null);
    }
    upstream.behave(() => ({ kind: 'respond', status: 521, body: 'my own odd status' }));
    try {
      expect(await forwarder.forward(req('/odd'))).toMatchObject({ kind: 'response', status: 521 });
    } finally {
      upstream.behave(null);
    }
    upstream.behave(() => ({ kind: 'respond', status: 524, headers: { server: 'cloudflare' } }));
    try {
      // 524: the origin got the request and did not answer in time: unknown, never a stored answer.
      expect(await forwarder.forward(req('/524'))).toEqual({ kind: 'unknown', error: 'cloudflare-524', timedOut: true });
    } finally {
      upstream.behave(null);
    }
  });
});

describe('createFetchForwarder (Node fetch): maxResponseBytes and startBy', () => {
  const LIMIT = 64 * 1024;
  const forwarder = createFetchForwarder();
  let origin: string;
  let seen: string[] = [];
  /** Per path: what the upstream does. `closed` resolves with the bytes written once the gateway hung up. */
  let closed: Promise<number> = Promise.resolve(0);
  let server: ReturnType<typeof createServer>;

  const writeForever = (res: ServerResponse, chunk: Buffer): Promise<number> => {
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
  };

  beforeAll(async () => {
    server = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        const url = new URL(req.url!, 'http://x');
        seen.push(url.pathname);
        const n = Number(url.searchParams.get('n') ?? 0);
        switch (url.pathname) {
          case '/announced':
            res.writeHead(201, { 'content-length': String(512 * 1024 * 1024) });
            res.flushHeaders();
            return;
          case '/endless':
            res.writeHead(200);
            closed = writeForever(res, Buffer.alloc(1024, 0x63));
            return;
          case '/length':
            res.writeHead(200, { 'content-length': String(n) });
            return res.end(Buffer.alloc(n, 0x64));
          case '/chunked':
            res.writeHead(200);
            res.write(Buffer.alloc(Math.min(n, 1000), 0x64));
            return res.end(Buffer.alloc(Math.max(0, n - 1000), 0x64));
          case '/gzip':
            // A few hundred bytes on the wire, n once decoded.
            res.writeHead(200, { 'content-encoding': 'gzip' });
            return res.end(gzipSync(Buffer.alloc(n, 0x65)));
          default:
            return res.end('ok');
        }
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  });

  const at = (path: string, over: Partial<UpstreamRequest> = {}): UpstreamRequest => ({
    url: `${origin}${path}`,
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: new TextEncoder().encode('{}'),
    timeoutMs: 600_000,
    maxResponseBytes: LIMIT,
    ...over,
  });

  it('a content-length over the limit: "too-large" without waiting for the body', async () => {
    // Only the header can end this before the test's timeout: the body never comes.
    expect(await forwarder.forward(at('/announced'))).toEqual({ kind: 'too-large', status: 201, limit: LIMIT });
  });

  it('an endless chunked answer: "too-large" at the limit, and the stream is cancelled', async () => {
    expect(await forwarder.forward(at('/endless'))).toEqual({ kind: 'too-large', status: 200, limit: LIMIT });
    expect(await closed).toBeGreaterThan(LIMIT);
  });

  it('exactly at the limit is an answer, one byte over is not; decoded bytes are what counts', async () => {
    for (const framing of ['/length', '/chunked', '/gzip']) {
      const r = await forwarder.forward(at(`${framing}?n=${LIMIT}`));
      expect(r.kind, framing).toBe('response');
      if (r.kind === 'response') expect(r.body.byteLength, framing).toBe(LIMIT);
      expect(await forwarder.forward(at(`${framing}?n=${LIMIT + 1}`)), framing).toEqual({ kind: 'too-large', status: 200, limit: LIMIT });
    }
  });

  it('startBy already past: "refused" (start-deadline-passed), nothing sent', async () => {
    seen = [];
    expect(await forwarder.forward(at('/late', { startBy: performance.now() - 1 }))).toEqual({ kind: 'refused', error: 'start-deadline-passed' });
    expect(await forwarder.forward(at('/after', { startBy: performance.now() + 60_000 }))).toMatchObject({ kind: 'response', status: 200 });
    expect(seen).toEqual(['/after']);
  });
});
