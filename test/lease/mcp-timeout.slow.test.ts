/**
 * fencedMcp's request timeout against a real gateway route and a real SDK
 * server (DESIGN §6.4): aligned with the route's, the handler hears the
 * gateway's recorded answer at the route's deadline (-32009), not the
 * client's own timeout; the client's own timeout, shorter, is an
 * OutcomeUnknownError whose cancel the gateway withholds.
 */
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { afterEach, describe, expect, test } from 'vitest';
import { OutcomeUnknownError } from '../../src/lease/errors.js';
import { fencedMcp, McpRefusalError } from '../../src/lease/mcp.js';
import { mcpRoute, startMcpGateway } from '../mcp/harness.js';
import { startResumableUpstream } from '../mcp/resumable-upstream.js';
import { until } from '../helpers/gateway.js';
import { fenceContext } from './helpers/fence-context.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup() {
  const up = await startResumableUpstream();
  cleanups.push(() => up.close());
  // A tool that does not answer within the route's deadline.
  up.gate = new Promise(() => {});
  const gw = await startMcpGateway([mcpRoute(up.url, { timeoutMs: 1_000 })]);
  cleanups.push(() => gw.close());
  const client = new Client({ name: 'agent', version: '1.0.0' });
  client.onerror = () => {};
  await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp`)));
  cleanups.push(() => client.close().catch(() => {}));
  return { up, gw, client };
}

describe('fencedMcp and the route deadline', () => {
  test("with routeTimeoutMs the handler gets the gateway's recorded -32009, and no cancel is sent", async () => {
    const { up, gw, client } = await setup();
    const { ctx } = fenceContext({ waitableMs: () => 60_000 });
    const err = await fencedMcp(client, ctx, { routeTimeoutMs: 1_000 })
      .callTool({ name: 'create_ticket', arguments: { title: 'x' } })
      .catch((e) => e);
    expect(err).toBeInstanceOf(McpRefusalError);
    expect(err.rpcCode).toBe(-32009);
    expect(gw.decisions().some((d) => d.decision === 'cancel-withheld')).toBe(false);
    expect(up.cancels()).toHaveLength(0);
  });

  test('negative control: a client timeout shorter than the route gives up first: outcome unknown, its cancel withheld', async () => {
    const { up, gw, client } = await setup();
    const { ctx } = fenceContext({ waitableMs: () => 60_000 });
    const err = await fencedMcp(client, ctx, { routeTimeoutMs: 1_000 })
      .callTool({ name: 'create_ticket', arguments: { title: 'x' } }, undefined, { timeout: 200 })
      .catch((e) => e);
    expect(err).toBeInstanceOf(OutcomeUnknownError);
    await until(() => gw.decisions().some((d) => d.decision === 'cancel-withheld'), 'the withheld cancel');
    expect(up.cancels()).toHaveLength(0);
  });
});
