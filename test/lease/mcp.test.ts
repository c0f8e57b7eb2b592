/**
 * fencedMcp against a plain FenceContext and a real MCP server (the SDK's
 * McpServer and StreamableHTTP transports) on loopback, with a test-only
 * fencing check in front of it (test/lease/helpers/mcp-server.ts).
 */
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { LeaseLostError, OutcomeUnknownError, OwnershipUnknownError } from '../../src/lease/errors.js';
import type { FenceContext } from '../../src/lease/fenced-fetch.js';
import { fencedMcp, McpRefusalError, type McpClientLike } from '../../src/lease/mcp.js';
import { fenceContext } from './helpers/fence-context.js';
import { connectClient, startTicketServer, type TicketServer } from './helpers/mcp-server.js';

let server: TicketServer;
let client: Client;

beforeAll(async () => {
  server = await startTicketServer();
  client = await connectClient(server.url);
});
afterEach(() => {
  server.fencing = true;
});
afterAll(async () => {
  await client?.close();
  await server?.close();
});

/** Each test its own job (entity), so the server's highest-fence table does not leak between tests. */
let nextJob = 100;
function context(overrides: Partial<FenceContext> = {}) {
  const id = nextJob++;
  return fenceContext({ jobId: id, kind: 'ticket', jobKey: `tool-job:5f0c9e:${id}`, fenceKey: `tool-job:5f0c9e:${id}`, ...overrides });
}

const meta = (m: Record<string, unknown>) => ({
  fence: m['io.fencegate/fence'],
  entity: m['io.fencegate/entity'],
  key: m['io.fencegate/idempotency-key'],
});

describe('fencedMcp', () => {
  test('each tools/call carries the fence, the entity and the step key in _meta, the same on a retry and on a later attempt', async () => {
    const { ctx, events } = context();
    const mcp = fencedMcp(client, ctx);
    const result = await mcp.callTool({ name: 'create_ticket', arguments: { title: 'Printer on fire' }, _meta: { progressToken: 'p1' } });
    expect(result.structuredContent).toEqual({ id: expect.stringMatching(/^T-/) });
    const first = server.arrivals.at(-1)!;
    expect(meta(first.meta)).toEqual({ fence: '7', entity: ctx.fenceKey, key: `${ctx.jobKey}:mcp:create_ticket` });
    expect(first.meta.progressToken).toBe('p1'); // the caller's own _meta stays
    expect(first.arguments).toEqual({ title: 'Printer on fire' }); // `step` never goes on the wire
    expect(events).toEqual([
      expect.objectContaining({ type: 'tool_request_started', step: 'mcp:create_ticket', idempotencyKey: `${ctx.jobKey}:mcp:create_ticket` }),
    ]);

    // A retry in the same attempt, and the next attempt (token 8) of the same job: same key.
    await mcp.callTool({ name: 'create_ticket', arguments: { title: 'Printer on fire' } });
    await fencedMcp(client, { ...ctx, fencingToken: 8 }).callTool({ name: 'create_ticket', arguments: { title: 'Printer on fire' } });
    const keys = server.arrivals.slice(-3).map((a) => meta(a.meta).key);
    expect(new Set(keys)).toEqual(new Set([`${ctx.jobKey}:mcp:create_ticket`]));
    expect(server.arrivals.slice(-3).map((a) => meta(a.meta).fence)).toEqual(['7', '7', '8']);
  });

  test('a named step gives a second call of the same tool its own key; the caller cannot overwrite the fence fields', async () => {
    const { ctx } = context();
    const mcp = fencedMcp(client, ctx);
    await mcp.callTool({ name: 'create_ticket', step: 'ticket-a', arguments: { title: 'a' } });
    await mcp.callTool({
      name: 'create_ticket',
      step: 'ticket-b',
      arguments: { title: 'b' },
      _meta: { 'io.fencegate/fence': '999', 'io.fencegate/idempotency-key': 'mine' },
    });
    expect(server.arrivals.slice(-2).map((a) => meta(a.meta))).toEqual([
      { fence: '7', entity: ctx.fenceKey, key: `${ctx.jobKey}:ticket-a` },
      { fence: '7', entity: ctx.fenceKey, key: `${ctx.jobKey}:ticket-b` },
    ]);
  });

  test('a signed fence goes in _meta as the signer returns it', async () => {
    server.fencing = false; // the test-only check reads decimal fences; the gateway verifies signed ones (DESIGN §7)
    const { ctx } = context();
    const claims: unknown[] = [];
    await fencedMcp(client, ctx, {
      fenceSigner: (c) => {
        claims.push(c);
        return `signed.${c.ent}.${c.fence}`;
      },
    }).callTool({ name: 'search_tickets', arguments: { q: 'x' } });
    expect(meta(server.arrivals.at(-1)!.meta).fence).toBe(`signed.${ctx.fenceKey}.7`);
    expect(claims).toEqual([{ ent: ctx.fenceKey, fence: 7, sub: 'w1', exp: 1893456030 }]);
  });

  test('refuses to start while ownership is unknown: nothing reaches the server', async () => {
    const before = server.arrivals.length;
    const { ctx, events } = context({
      assertCanStart: () => {
        throw new OwnershipUnknownError('confirmed for 10 ms');
      },
    });
    await expect(fencedMcp(client, ctx).callTool({ name: 'create_ticket', arguments: { title: 'x' } })).rejects.toBeInstanceOf(OwnershipUnknownError);
    expect(server.arrivals.length).toBe(before);
    expect(events).toEqual([]);

    // Negative control: the same call with the gate open does reach the server.
    await fencedMcp(client, { ...ctx, assertCanStart: () => {} }).callTool({ name: 'create_ticket', arguments: { title: 'x' } });
    expect(server.arrivals.length).toBe(before + 1);
  });

  test('stale-fence (-32001) is lease loss: markLost, LeaseLostError, and the tool never ran', async () => {
    const newer = context({ fencingToken: 8 });
    await fencedMcp(client, newer.ctx).callTool({ name: 'create_ticket', arguments: { title: 'new owner' } });
    const ticketsBefore = server.tickets.length;

    const stale = context({ fencingToken: 7, jobKey: newer.ctx.jobKey, fenceKey: newer.ctx.fenceKey });
    const err = await fencedMcp(client, stale.ctx)
      .callTool({ name: 'create_ticket', arguments: { title: 'late' } })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(LeaseLostError);
    expect(stale.lost).toEqual(['stale_fence']);
    expect(server.tickets.length).toBe(ticketsBefore);
    expect(server.refusals.at(-1)).toMatchObject({ entity: newer.ctx.fenceKey, presented: 7, current: 8 });

    // Negative control: with the server's fencing check off, the same late call creates a second ticket.
    server.fencing = false;
    const again = context({ fencingToken: 7, jobKey: newer.ctx.jobKey, fenceKey: newer.ctx.fenceKey });
    await fencedMcp(client, again.ctx).callTool({ name: 'create_ticket', arguments: { title: 'late' } });
    expect(server.tickets.length).toBe(ticketsBefore + 1);
    expect(again.lost).toEqual([]);
  });

  test('fence-expired (-32002) with its data.type, or data.type alone, is lease loss too; other refusals are McpRefusalError with data', async () => {
    for (const error of [
      { code: -32002, message: 'fence-expired: the signed fence expired', data: { type: 'fence-expired', status: 409 } },
      { code: -32099, message: 'stale-fence', data: { type: 'stale-fence' } },
    ]) {
      const { ctx, lost } = context();
      server.failNext(error);
      await expect(fencedMcp(client, ctx).callTool({ name: 'create_ticket', arguments: { title: 'x' } })).rejects.toBeInstanceOf(LeaseLostError);
      expect(lost).toEqual(['stale_fence']);
      // An expired fence is said to be one, never "a newer owner".
      server.failNext(error);
      await expect(fencedMcp(client, context().ctx).callTool({ name: 'create_ticket', arguments: { title: 'x' } })).rejects.toThrow(
        error.data.type === 'fence-expired' ? /as expired \(fence-expired\)/ : /a newer owner holds it/,
      );
    }

    const { ctx, lost } = context();
    const data = { type: 'idempotency-key-reused', title: 'Idempotency key reused', status: 422, idempotency_key: `${ctx.jobKey}:mcp:create_ticket` };
    server.failNext({ code: -32003, message: 'idempotency-key-reused: the key was used with another request', data });
    const err = (await fencedMcp(client, ctx)
      .callTool({ name: 'create_ticket', arguments: { title: 'x' } })
      .catch((e: unknown) => e)) as McpRefusalError;
    expect(err).toBeInstanceOf(McpRefusalError);
    expect(err).toMatchObject({ code: 'idempotency-key-reused', rpcCode: -32003, data });
    expect(err.message).toContain('idempotency-key-reused');
    expect(lost).toEqual([]);
  });

  test('-32001 / -32002 without the route\'s data.type (MCP\'s "Resource not found" is -32002) is a refusal, never lease loss', async () => {
    for (const error of [
      { code: -32002, message: 'Resource not found', data: { uri: 'file:///x' } },
      { code: -32002, message: 'Resource not found' },
      { code: -32001, message: 'a tool server error', data: { reason: 'x' } },
    ]) {
      const { ctx, lost } = context();
      server.failNext(error);
      const err = await fencedMcp(client, ctx)
        .callTool({ name: 'create_ticket', arguments: { title: 'x' } })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(McpRefusalError);
      expect(err).toMatchObject({ rpcCode: error.code, code: 'jsonrpc_error' });
      expect(lost).toEqual([]);
    }
  });

  test('a caller-set params.idempotencyKey is dropped: only the derived _meta key is sent', async () => {
    const { ctx } = context();
    let sent: Record<string, unknown> | undefined;
    const spy: McpClientLike = { callTool: async (p) => ((sent = p as Record<string, unknown>), { content: [] }) };
    await fencedMcp(spy, ctx).callTool({ name: 'create_ticket', arguments: { title: 'x' }, idempotencyKey: 'model-chosen' });
    expect(sent).not.toHaveProperty('idempotencyKey');
    expect((sent!._meta as Record<string, unknown>)['io.fencegate/idempotency-key']).toBe(`${ctx.jobKey}:mcp:create_ticket`);
    expect(JSON.stringify(sent)).not.toContain('model-chosen');
  });

  test("the SDK's own timeout (also code -32001, but data { timeout }) is outcome unknown, not lease loss", async () => {
    const { ctx, lost } = context();
    const release = server.hold();
    try {
      const err = await fencedMcp(client, ctx)
        .callTool({ name: 'search_tickets', arguments: { q: 'x' } }, undefined, { timeout: 100 })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OutcomeUnknownError);
      expect(lost).toEqual([]);
    } finally {
      release();
    }
  });

  test('losing the lease aborts a call in flight with the lease error', async () => {
    const { ctx, controller, lost } = context();
    const release = server.hold();
    try {
      const pending = fencedMcp(client, ctx).callTool({ name: 'search_tickets', arguments: { q: 'x' } });
      setTimeout(() => controller.abort(new LeaseLostError('gone')), 50);
      await expect(pending).rejects.toThrow('gone');
      expect(lost).toEqual([]); // the runner already knew; only a gateway refusal calls markLost
    } finally {
      release();
    }
  });

  test('a tool name that cannot be a step needs an explicit step; the structural type takes any { callTool }', async () => {
    const sent: unknown[] = [];
    const fake: McpClientLike = { callTool: async (params) => (sent.push(params), { content: [] }) };
    const { ctx } = context();
    await expect(fencedMcp(fake, ctx).callTool({ name: 'tickets/create' })).rejects.toThrow(/step must match/);
    expect(sent).toEqual([]);
    await fencedMcp(fake, ctx).callTool({ name: 'tickets/create', step: 'create' });
    expect(sent).toEqual([
      {
        name: 'tickets/create',
        _meta: { 'io.fencegate/fence': '7', 'io.fencegate/entity': ctx.fenceKey, 'io.fencegate/idempotency-key': `${ctx.jobKey}:create` },
      },
    ]);
  });
});
