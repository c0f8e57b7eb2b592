/**
 * The fetch forwarder's refused / unknown / response distinction and its
 * content-encoding rule, under Node's own fetch (undici). Under workerd the
 * same forwarder is exercised end to end by worker.workerd.ts.
 */
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
    upstream.behave(() => ({ kind: 'respond', status: 200, headers: { 'content-type': 'text/plain', 'content-encoding': 'gzip' }, body: gzipSync('plain text') }));
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
