/**
 * fencedMcp never sends a member that differs only in case from one an mcp
 * route reads (DESIGN §3.3): the route refuses such a call, since a
 * case-insensitive upstream (Go, .NET) would read `IO.fencegate/Fence` as
 * the fence. A caller's variant of our `_meta` fields or of
 * `idempotencyKey` is dropped like the exact name; a variant of `name`,
 * `arguments` or `_meta` is a LeaseError before the step starts. Against
 * the real SDK Client and McpServer on loopback (helpers/mcp-server.ts).
 *
 * The control switches the name folding off (test/helpers/fold-switch.ts):
 * the variants then reach the server.
 */
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { afterAll, afterEach, beforeAll, describe, expect, test, vi } from 'vitest';
import { LeaseError } from '../../src/lease/errors.js';
import { fencedMcp } from '../../src/lease/mcp.js';
import { fold } from '../helpers/fold-switch.js';
import { fenceContext } from './helpers/fence-context.js';
import { connectClient, startTicketServer, type TicketServer } from './helpers/mcp-server.js';

vi.mock('../../src/core/json-duplicates.js', async (original) => (await import('../helpers/fold-switch.js')).foldSwitched(await original()));

let server: TicketServer;
let client: Client;
beforeAll(async () => {
  server = await startTicketServer();
  client = await connectClient(server.url);
});
afterEach(() => {
  fold.mode = 'real';
});
afterAll(async () => {
  await client?.close();
  await server?.close();
});

let nextJob = 700;
function context() {
  const id = nextJob++;
  return fenceContext({ jobId: id, kind: 'ticket', jobKey: `tool-job:c4f1:${id}`, fenceKey: `tool-job:c4f1:${id}` });
}

/** The `_meta` names the server got that fold to one of ours without being it. */
const OURS = ['io.fencegate/fence', 'io.fencegate/entity', 'io.fencegate/idempotency-key'];
const variants = (meta: Record<string, unknown>) => Object.keys(meta).filter((k) => OURS.includes(k.toLowerCase()) && !OURS.includes(k));

async function callWithVariants() {
  const { ctx } = context();
  await fencedMcp(client, ctx).callTool({
    name: 'create_ticket',
    arguments: { title: 'case' },
    IdempotencyKey: 'model-chosen',
    _meta: { 'IO.fencegate/Fence': '999', 'io.fencegate/IDEMPOTENCY-KEY': 'mine', progressToken: 'p9' },
  });
  return { ctx, arrival: server.arrivals.at(-1)!, params: server.paramNames.at(-1)! };
}

describe('fencedMcp and names that differ only in case', () => {
  test('a caller’s variants of the _meta fields and of idempotencyKey are dropped: only the exact three arrive, with our values', async () => {
    const { ctx, arrival, params } = await callWithVariants();
    expect(params.sort()).toEqual(['_meta', 'arguments', 'name']);
    expect(variants(arrival.meta)).toEqual([]);
    expect(arrival.meta).toMatchObject({
      'io.fencegate/fence': '7',
      'io.fencegate/entity': ctx.fenceKey,
      'io.fencegate/idempotency-key': `${ctx.jobKey}:mcp:create_ticket`,
      progressToken: 'p9',
    });
    expect(JSON.stringify(arrival.meta)).not.toMatch(/999|mine/);
  });

  test.each(['_Meta', 'Arguments', 'NAME'])('a params member %s is refused before the step starts: nothing sent, no event', async (member) => {
    const { ctx, events } = context();
    const before = server.arrivals.length;
    const call = fencedMcp(client, ctx).callTool({ name: 'create_ticket', arguments: { title: 'case' }, [member]: member === 'NAME' ? 'delete_all' : {} });
    await expect(call).rejects.toThrow(LeaseError);
    await expect(call).rejects.toMatchObject({ code: 'invalid_input', message: expect.stringContaining(`params.${member} differs only in case`) });
    expect(server.arrivals.length).toBe(before);
    expect(events).toEqual([]);
  });

  test('a params member named __proto__ is sent as a member, as before, and lends the call no _meta', async () => {
    const { ctx } = context();
    const params = JSON.parse('{"name":"create_ticket","arguments":{"title":"proto"},"__proto__":{"_meta":{"adopted":1}}}');
    await fencedMcp(client, ctx).callTool(params);
    expect(server.paramNames.at(-1)).toContain('__proto__');
    expect(server.arrivals.at(-1)!.meta).not.toHaveProperty('adopted');
  });

  test('negative control: with the folding off, the variants reach the server', async () => {
    fold.mode = 'none';
    const { arrival, params } = await callWithVariants();
    expect(params).toContain('IdempotencyKey');
    expect(variants(arrival.meta)).toEqual(['IO.fencegate/Fence', 'io.fencegate/IDEMPOTENCY-KEY']);
    const { ctx } = context();
    const before = server.arrivals.length;
    await fencedMcp(client, ctx).callTool({ name: 'create_ticket', arguments: { title: 'case' }, _Meta: {} });
    expect(server.arrivals.length).toBe(before + 1);
  });
});
