/**
 * The Node column of docs/deploy-workers.md's table of upstream failures:
 * the same failing upstreams as the workerd probe (fault-upstream.ts), met
 * by the Node gateway's forwarder (undici) and by the fetch forwarder on
 * Node's own fetch. Each result is printed (`PROBE node …`) and pinned.
 */
import { createServer, type AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createFetchForwarder } from '../../src/http/forward-fetch.js';
import type { Forwarder, UpstreamRequest, UpstreamResult } from '../../src/http/forward.js';
import { createUndiciForwarder } from '../../src/http/forward-undici.js';
import { startFaultUpstreams, type FaultUpstreams } from './fault-upstream.js';

let faults: FaultUpstreams;
let refusedUrl: string;
const undici = createUndiciForwarder();
const nodeFetch = createFetchForwarder();

beforeAll(async () => {
  faults = await startFaultUpstreams();
  const probe = createServer();
  await new Promise<void>((r) => probe.listen(0, '127.0.0.1', r));
  refusedUrl = `http://127.0.0.1:${(probe.address() as AddressInfo).port}`;
  await new Promise<void>((r) => probe.close(() => r()));
});
afterAll(async () => {
  await undici.close?.();
  await faults.close();
});

async function forward(name: string, forwarder: Forwarder, url: string, over: Partial<UpstreamRequest> = {}): Promise<UpstreamResult> {
  const r = await forwarder.forward({
    url,
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: new TextEncoder().encode('{}'),
    timeoutMs: 1_500,
    maxResponseBytes: 1024,
    ...over,
  });
  console.log(`PROBE node ${name} ${url.replace(/127\.0\.0\.1:\d+/, 'upstream')} ${JSON.stringify(r)}`);
  return r;
}

describe('upstream failures on Node: refused only where nothing can have been sent', () => {
  for (const [name, forwarder] of [
    ['undici', undici],
    ['fetch', nodeFetch],
  ] as const) {
    it(`${name}: connection refused is refused (ECONNREFUSED)`, async () => {
      expect(await forward(name, forwarder, `${refusedUrl}/x`)).toEqual({ kind: 'refused', error: 'ECONNREFUSED' });
    });

    it(`${name}: a reset on accept, RST or FIN after the request, a reset mid-body, an answer that is not HTTP: unknown`, async () => {
      for (const url of [
        `${faults.urls.rstOnAccept}/x`,
        `${faults.urls.http}/rst-after`,
        `${faults.urls.http}/fin-after`,
        `${faults.urls.http}/rst-partial`,
        `${faults.urls.http}/garbage`,
      ]) {
        expect(await forward(name, forwarder, url), url).toMatchObject({ kind: 'unknown', timedOut: false });
      }
    });

    it(`${name}: a timeout after sending is unknown (timeout)`, async () => {
      expect(await forward(name, forwarder, `${faults.urls.http}/hang`, { timeoutMs: 300 })).toEqual({ kind: 'unknown', error: 'timeout', timedOut: true });
    });

    // undici on Node: a certificate the client refuses ends the handshake
    // before any request byte is written (no 0-RTT), so nothing was sent
    // (DESIGN §3.7); the fetch forwarder (Workers) cannot tell that code
    // apart and stays unknown.
    it(`${name}: an untrusted TLS certificate is ${name === 'undici' ? 'refused (the handshake ended before any request byte)' : 'unknown (fetch cannot tell where it failed)'}`, async (ctx) => {
      if (faults.urls.tls === null) return ctx.skip();
      const r = await forward(name, forwarder, `${faults.urls.tls}/ok`);
      if (name === 'undici') expect(r).toMatchObject({ kind: 'refused', error: expect.stringMatching(/CERT/) });
      else expect(r).toMatchObject({ kind: 'unknown', timedOut: false });
    });

    it(`${name}: an answer over maxResponseBytes is too-large with its status`, async () => {
      expect(await forward(name, forwarder, `${faults.urls.http}/ok`, { maxResponseBytes: 1 })).toEqual({ kind: 'too-large', status: 200, limit: 1 });
    });
  }
});
