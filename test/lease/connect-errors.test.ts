/**
 * One rule for "the request never left this machine" (src/protocol/connect-errors.ts),
 * on every side that needs it: real `fetch` errors from loopback servers that
 * refuse or reset, the MCP SDK's real Client against a server that is gone,
 * and `fencedMcp` / `fencedFetch` mapping a maybe-sent failure to
 * OutcomeUnknownError. The control (connect-errors-control.test.ts) switches
 * the rule to "never sent" for everything and shows the reset case then
 * escapes as a plain, retryable error.
 */
import { createServer, type AddressInfo, type Server } from 'node:net';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { causeCode, neverConnected } from '../../src/protocol/connect-errors.js';
import { OutcomeUnknownError } from '../../src/lease/errors.js';
import { createFencedFetch, type FenceContext } from '../../src/lease/fenced-fetch.js';
import { fencedMcp } from '../../src/lease/mcp.js';
import { connectClient, startTicketServer } from './helpers/mcp-server.js';

let resetServer: Server;
let resetUrl: string;
let closedUrl: string;

beforeAll(async () => {
  // Reads the request, then resets the connection: the request has arrived.
  resetServer = createServer((socket) => socket.once('data', () => socket.resetAndDestroy()));
  await new Promise<void>((r) => resetServer.listen(0, '127.0.0.1', r));
  resetUrl = `http://127.0.0.1:${(resetServer.address() as AddressInfo).port}/x`;
  const closed = createServer();
  await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
  closedUrl = `http://127.0.0.1:${(closed.address() as AddressInfo).port}/x`;
  await new Promise((r) => closed.close(r));
});
afterAll(async () => {
  await new Promise((r) => resetServer.close(r));
});

function context(): { ctx: FenceContext; lost: string[] } {
  const lost: string[] = [];
  const ctx: FenceContext = {
    workerId: 'w1',
    jobId: 1,
    kind: 'ticket',
    fencingToken: 3,
    jobKey: 'tool-job:connect-errors:1',
    fenceKey: 'tool-job:connect-errors:1',
    signal: new AbortController().signal,
    leaseUntil: () => new Date('2030-01-01T00:00:30Z'),
    assertCanStart: () => {},
    markLost: (cause) => lost.push(cause),
    emit: () => {},
  };
  return { ctx, lost };
}

const fetchError = (url: string) => fetch(url, { method: 'POST', body: '{}' }).then(() => null, (e: unknown) => e);

describe('never connected, or maybe sent', () => {
  test('a refused connect is never-connected; a reset after the request arrived is not', async () => {
    const refused = await fetchError(closedUrl);
    expect(causeCode(refused)).toBe('ECONNREFUSED');
    expect(neverConnected(refused)).toBe(true);

    const reset = await fetchError(resetUrl);
    expect(reset).not.toBeNull();
    expect(causeCode(reset)).not.toBeNull();
    expect(neverConnected(reset)).toBe(false);
    expect(neverConnected(new Error('no code at all'))).toBe(false);
  });

  test('fencedFetch: the reset is outcome unknown, the refused connect a plain error', async () => {
    const { ctx } = context();
    await expect(createFencedFetch(ctx)(resetUrl, { method: 'POST', body: '{}', step: 'charge' })).rejects.toBeInstanceOf(OutcomeUnknownError);
    const refused = await createFencedFetch(ctx)(closedUrl, { method: 'POST', body: '{}', step: 'charge' }).catch((e: unknown) => e);
    expect(refused).not.toBeInstanceOf(OutcomeUnknownError);
    expect(causeCode(refused)).toBe('ECONNREFUSED');
  });

  test('fencedMcp with the real SDK Client: a server that is gone is a plain connect error, never outcome unknown', async () => {
    const server = await startTicketServer();
    const client = await connectClient(server.url);
    try {
      await server.close();
      const { ctx, lost } = context();
      const err = await fencedMcp(client, ctx).callTool({ name: 'search_tickets', arguments: { q: 'x' } }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(Error);
      expect(err).not.toBeInstanceOf(OutcomeUnknownError);
      expect(neverConnected(err)).toBe(true);
      expect(lost).toEqual([]);
    } finally {
      await client.close().catch(() => {});
    }
  });

  test('fencedMcp: a transport that failed after the call may have been sent (the reset) is outcome unknown', async () => {
    const reset = await fetchError(resetUrl);
    // A structural client whose transport met that reset, as the SDK's Streamable HTTP transport rethrows it.
    const client = { callTool: () => Promise.reject(reset) };
    const { ctx } = context();
    await expect(fencedMcp(client, ctx).callTool({ name: 'create_ticket', arguments: {} })).rejects.toBeInstanceOf(OutcomeUnknownError);
  });
});
