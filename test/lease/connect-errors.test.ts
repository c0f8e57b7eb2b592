/**
 * One rule for "the request never left this machine" (src/protocol/connect-errors.ts),
 * on every side that needs it: real `fetch` errors from loopback servers that
 * refuse or reset, the MCP SDK's real Client against a server that is gone,
 * and `fencedMcp` / `fencedFetch` mapping a maybe-sent failure to
 * OutcomeUnknownError. The control (connect-errors-control.test.ts) switches
 * the rule to "never sent" for everything and shows the reset case then
 * escapes as a plain, retryable error.
 */
import { createServer as createHttpServer } from 'node:http';
import { createServer, type AddressInfo } from 'node:net';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { causeCode, neverConnected } from '../../src/protocol/connect-errors.js';
import { OutcomeUnknownError } from '../../src/lease/errors.js';
import { createFencedFetch } from '../../src/lease/fenced-fetch.js';
import { startFaultUpstreams, type FaultUpstreams } from '../workers/fault-upstream.js';
import { fenceContext } from './helpers/fence-context.js';
import { fencedMcp, McpRefusalError } from '../../src/lease/mcp.js';
import { connectClient, startTicketServer } from './helpers/mcp-server.js';

let faults: FaultUpstreams;
let resetUrl: string;
let closedUrl: string;

beforeAll(async () => {
  faults = await startFaultUpstreams();
  // Reads the request, then resets the connection: the request has arrived.
  resetUrl = `${faults.urls.http}/rst-after`;
  const closed = createServer();
  await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
  closedUrl = `http://127.0.0.1:${(closed.address() as AddressInfo).port}/x`;
  await new Promise((r) => closed.close(r));
});
afterAll(async () => {
  await faults.close();
});

const context = () => fenceContext({ kind: 'ticket', jobKey: 'tool-job:connect-errors:1', fenceKey: 'tool-job:connect-errors:1' });

const fetchError = (url: string) =>
  fetch(url, { method: 'POST', body: '{}' }).then(
    () => null,
    (e: unknown) => e,
  );

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
      const err = await fencedMcp(client, ctx)
        .callTool({ name: 'search_tickets', arguments: { q: 'x' } })
        .catch((e: unknown) => e);
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

/**
 * A Streamable HTTP MCP endpoint that answers initialize, and every
 * tools/call as `answer` says, counting the calls that reached it: what a
 * server, or something in front of it, can do after the call arrived.
 */
async function oddServer(answer: 'status-504' | 'cut-json' | 'app-error' | 'off-schema') {
  let calls = 0;
  const http = createHttpServer((req, res) => {
    let text = '';
    req.on('data', (c: Buffer) => (text += c.toString('utf8')));
    req.on('end', () => {
      if (req.method !== 'POST') return void res.writeHead(405).end();
      const msg = JSON.parse(text) as { id?: number; method: string };
      if (msg.method === 'initialize') {
        res.writeHead(200, { 'content-type': 'application/json' });
        return void res.end(
          JSON.stringify({
            jsonrpc: '2.0',
            id: msg.id,
            result: { protocolVersion: '2025-06-18', capabilities: { tools: {} }, serverInfo: { name: 'odd', version: '1' } },
          }),
        );
      }
      if (msg.method === 'tools/list') {
        // One tool with an output schema, which the SDK's Client checks each result against.
        const tool = {
          name: 'create_ticket',
          inputSchema: { type: 'object' },
          outputSchema: { type: 'object', properties: { id: { type: 'string' } }, required: ['id'] },
        };
        res.writeHead(200, { 'content-type': 'application/json' });
        return void res.end(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { tools: [tool] } }));
      }
      if (msg.method !== 'tools/call') return void res.writeHead(202).end();
      calls++;
      if (answer === 'status-504') return void res.writeHead(504, { 'content-type': 'text/plain' }).end('gateway timeout');
      res.writeHead(200, { 'content-type': 'application/json' });
      if (answer === 'cut-json') return void res.end('{"jsonrpc":"2.0","id":');
      if (answer === 'off-schema') {
        // The tool ran; its structured result has a number where the schema says string.
        return void res.end(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { content: [], structuredContent: { id: 5 } } }));
      }
      // An application's own JSON-RPC error code, outside the reserved range.
      res.end(JSON.stringify({ jsonrpc: '2.0', id: msg.id, error: { code: 4001, message: 'ticket quota exceeded', data: { type: 'quota' } } }));
    });
  });
  await new Promise<void>((r) => http.listen(0, '127.0.0.1', r));
  const client = new Client({ name: 'connect-errors-test', version: '1' });
  await client.connect(new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${(http.address() as AddressInfo).port}/mcp`)));
  return {
    client,
    calls: () => calls,
    async close() {
      await client.close().catch(() => {});
      http.closeAllConnections();
      await new Promise((r) => http.close(r));
    },
  };
}

describe('fencedMcp with the real SDK Client: after the call arrived, never a plain error', () => {
  for (const answer of ['status-504', 'cut-json'] as const) {
    test(`${answer}: the server had the call, so the outcome is unknown`, async () => {
      const server = await oddServer(answer);
      try {
        const { ctx } = context();
        const err = await fencedMcp(server.client, ctx)
          .callTool({ name: 'create_ticket', arguments: {} })
          .catch((e: unknown) => e);
        expect(server.calls()).toBe(1);
        expect(err).toBeInstanceOf(OutcomeUnknownError);
      } finally {
        await server.close();
      }
    });
  }

  test("a result the SDK's own output-schema check refuses: the tool ran, so unknown, never a refusal", async () => {
    const server = await oddServer('off-schema');
    try {
      await server.client.listTools(); // the Client learns the tool's output schema here
      const { ctx } = context();
      const err = await fencedMcp(server.client, ctx)
        .callTool({ name: 'create_ticket', arguments: {} })
        .catch((e: unknown) => e);
      expect(server.calls()).toBe(1);
      expect(err).toBeInstanceOf(OutcomeUnknownError);
      // What the SDK threw: an McpError with a server-error code, which alone would read as the server's refusal.
      const cause = (err as { cause?: { name?: string; code?: number; message?: string } }).cause;
      expect(cause?.name).toBe('McpError');
      expect(cause?.code).toBe(-32602);
      expect(cause?.message).toMatch(/Structured content does not match the tool's output schema/);
    } finally {
      await server.close();
    }
  });

  test('a Client that is not connected, or closed: a LeaseError before the step starts, no request started', async () => {
    const { ctx, events } = context();
    const never = new Client({ name: 'connect-errors-test', version: '1' });
    await expect(fencedMcp(never, ctx).callTool({ name: 'create_ticket', arguments: {} })).rejects.toMatchObject({ name: 'LeaseError', code: 'invalid_input' });
    const server = await oddServer('app-error');
    await server.client.close();
    await expect(fencedMcp(server.client, ctx).callTool({ name: 'create_ticket', arguments: {} })).rejects.toMatchObject({
      name: 'LeaseError',
      code: 'invalid_input',
    });
    expect(server.calls()).toBe(0);
    expect(events.map((e) => e.type)).not.toContain('tool_request_started');
    await server.close();
  });

  test("an application's own JSON-RPC error code is the server's answer: McpRefusalError, not unknown", async () => {
    const server = await oddServer('app-error');
    try {
      const { ctx } = context();
      const err = await fencedMcp(server.client, ctx)
        .callTool({ name: 'create_ticket', arguments: {} })
        .catch((e: unknown) => e);
      expect(server.calls()).toBe(1);
      expect(err).toBeInstanceOf(McpRefusalError);
      expect((err as McpRefusalError).rpcCode).toBe(4001);
      expect((err as McpRefusalError).code).toBe('quota');
    } finally {
      await server.close();
    }
  });
});
