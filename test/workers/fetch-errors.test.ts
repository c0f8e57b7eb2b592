/**
 * How the fetch forwarder classifies what `fetch` throws (DESIGN §3.7:
 * released vs outcome_unknown), under Node. The workerd shapes are the ones
 * recorded by the probe under workerd (upstream-errors.workerd.ts), fed in
 * through the forwarder's `fetch` option; the gateway-level check runs the
 * real Node fetch against a loopback upstream that resets after reading the
 * request, on a real SQLite store, with its negative control.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { classifyFetchError, createFetchForwarder } from '../../src/http/forward-fetch.js';
import type { Forwarder, UpstreamRequest } from '../../src/http/forward.js';
import { createGateway } from '../../src/http/gateway.js';
import { silentLogger } from '../../src/http/logger.js';
import { SqliteGatewayStore } from '../../src/store/sqlite/gateway-store.js';
import { paymentsRoute, recordRows } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

/** What workerd 1.20260426 throws, as the probe recorded it (message and own properties). */
const workerd = {
  connectionLost: () => Object.assign(new Error('Network connection lost.'), { remote: true, retryable: true }),
  internal: () => Object.assign(new Error('internal error; reference = 95d2l4609q5gs2c6b1klqalt'), { remote: true }),
  timeout: () => Object.assign(new DOMException('The operation was aborted due to timeout', 'TimeoutError'), { retryable: true }),
};
/** What Node's fetch (undici) throws: `TypeError: fetch failed` with the socket's code in `cause`. */
const nodeFetch = (code: string) => new TypeError('fetch failed', { cause: Object.assign(new Error(code), { code }) });

const request: UpstreamRequest = {
  url: 'http://127.0.0.1:9/x',
  method: 'POST',
  headers: { 'content-type': 'application/json' },
  body: new TextEncoder().encode('{}'),
  timeoutMs: 2_000,
  maxResponseBytes: 1024,
};

describe('classifyFetchError', () => {
  it('refused only for the codes a failed connect alone raises (Node fetch)', () => {
    for (const code of ['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EADDRNOTAVAIL', 'UND_ERR_CONNECT_TIMEOUT']) {
      expect(classifyFetchError(nodeFetch(code), false), code).toEqual({ kind: 'refused', error: code });
    }
    for (const code of ['ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET', 'EHOSTUNREACH', 'ENETUNREACH']) {
      expect(classifyFetchError(nodeFetch(code), false), code).toEqual({ kind: 'unknown', error: code, timedOut: false });
    }
  });

  it('every workerd error is unknown: its refused connect looks exactly like a reset after sending', () => {
    expect(classifyFetchError(workerd.connectionLost(), false)).toEqual({ kind: 'unknown', error: 'Network connection lost.', timedOut: false });
    expect(classifyFetchError(workerd.internal(), false)).toMatchObject({ kind: 'unknown', timedOut: false });
    expect(classifyFetchError(workerd.timeout(), true)).toEqual({ kind: 'unknown', error: 'timeout', timedOut: true });
  });

  it('the forwarder uses it for errors of fetch and of reading the body', async () => {
    const thrown = createFetchForwarder({
      fetch: async (req) => {
        await req.arrayBuffer(); // workerd reads the body in every case the probe saw
        throw workerd.connectionLost();
      },
    });
    expect(await thrown.forward(request)).toEqual({ kind: 'unknown', error: 'Network connection lost.', timedOut: false });
    const midBody = createFetchForwarder({
      fetch: async () => new Response(new ReadableStream({ pull: (c) => c.error(workerd.connectionLost()) }), { status: 200 }),
    });
    expect(await midBody.forward(request)).toEqual({ kind: 'unknown', error: 'Network connection lost.', timedOut: false });
  });
});

describe('a reset after sending, through the gateway (real Node fetch, real SQLite, loopback upstream)', () => {
  let upstream: FakeUpstream;
  let n = 0;
  beforeAll(async () => {
    upstream = await startUpstream();
    upstream.behave(() => ({ kind: 'reset' }));
  });
  afterAll(async () => {
    await upstream.close();
  });

  /** The safety check: the record is outcome_unknown (504), and the retry is refused, never re-sent. */
  async function resetIsOutcomeUnknown(forwarder: Forwarder): Promise<void> {
    const config = parseConfig({ store: { sqlite: ':memory:' }, routes: [paymentsRoute(upstream.url, { timeoutMs: 2_000 })] });
    const sqlite = new SqliteGatewayStore({ path: ':memory:' });
    const gateway = createGateway({ config, store: sqlite, forwarder, env: {}, logger: silentLogger });
    const key = `reset-${++n}`;
    const send = () =>
      gateway.app.request('/payments/charges', {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-execution-fence': '1', 'x-fence-entity': `e-${key}`, 'idempotency-key': key },
        body: '{"amount":1}',
      });
    try {
      const first = await send();
      expect(first.status).toBe(504);
      expect(recordRows(sqlite, key).map((r) => r.state)).toEqual(['outcome_unknown']);
      expect((await send()).status).toBe(409);
      expect(upstream.callsFor(key)).toHaveLength(1);
    } finally {
      await gateway.close();
    }
  }

  it('is outcome_unknown (504); the retry is 409 outcome-unknown and the upstream got it once', async () => {
    await resetIsOutcomeUnknown(createFetchForwarder());
  });

  it('negative control: with the classification forced to "refused", the same check fails (the retry is re-sent)', async () => {
    const forced = createFetchForwarder({ classifyError: () => ({ kind: 'refused', error: 'forced' }) });
    await expect(resetIsOutcomeUnknown(forced)).rejects.toThrow(/expected 502 to be 504/);
  });
});
