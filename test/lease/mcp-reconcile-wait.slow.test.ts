/**
 * fencedMcp waiting on an MCP route's reconciliation (DESIGN §3.12, §6.4),
 * end to end: the SDK client through a gateway route with `reconcile` (a
 * status tool of the real SDK server). A call whose answer was lost is sent
 * again under the same step; the route answers -32005 with its hint while
 * the status tool lags (until that first -32005); fencedMcp waits within the lease and sends the same
 * call again, and gets the reconciled answer. Without `reconcile` the -32005
 * has no hint and goes to the handler at once.
 */
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { afterEach, describe, expect, test } from 'vitest';
import { RECONCILED_META } from '../../src/http/mcp/reconcile.js';
import { fencedMcp, MCP_RECONCILED_META, McpRefusalError } from '../../src/lease/mcp.js';
import { until } from '../helpers/gateway.js';
import { startMcpGateway, type McpGateway } from '../mcp/harness.js';
import { PAYMENT_RECONCILE, paymentRoute, startTaskUpstream, type TaskUpstream } from '../mcp/task-upstream.js';
import { fenceContext } from './helpers/fence-context.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const RECONCILE = { ...PAYMENT_RECONCILE, settleTime: '30s' };

async function setup(reconcile: boolean): Promise<{ up: TaskUpstream; gw: McpGateway; client: Client }> {
  const up = await startTaskUpstream({ json: true });
  cleanups.push(() => up.close());
  const gw = await startMcpGateway([paymentRoute(up.url, reconcile ? { reconcile: RECONCILE } : {})]);
  cleanups.push(() => gw.close());
  const client = new Client({ name: 'agent', version: '1.0.0' });
  client.onerror = () => {};
  await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp`)));
  cleanups.push(() => client.close().catch(() => {}));
  return { up, gw, client };
}

describe('fencedMcp and an mcp route that reconciles', () => {
  test('the marker is the route one', () => {
    expect(MCP_RECONCILED_META).toBe(RECONCILED_META);
  });

  for (const reconcile of [true, false]) {
    test(
      reconcile
        ? 'a lost call sent again: -32005 with the hint is waited out, the same call sent again, the reconciled answer returned'
        : 'negative control: a route without reconcile: the -32005 has no hint and goes to the handler at once',
      async () => {
        const { up, gw, client } = await setup(reconcile);
        const { ctx, events } = fenceContext({ waitableMs: () => 60_000 });
        // The status tool catches up once the route has answered -32005 once (the gateway's background pass asks it too).
        const catchingUp = {
          callTool: (...args: Parameters<Client['callTool']>) =>
            client.callTool(...args).catch((err: { code?: number }) => {
              if (err.code === -32005) up.lagging = false;
              throw err;
            }),
        };
        const mcp = fencedMcp(catchingUp, ctx, { routeTimeoutMs: 300 });
        const key = `${ctx.jobKey}:mcp:pay`;
        const pay = () => mcp.callTool({ name: 'pay', arguments: { ref: key, amount: 7 } });
        // The server charges, then its answer is lost at the route's deadline.
        up.payGate = new Promise(() => {});
        await expect(pay()).rejects.toBeInstanceOf(McpRefusalError);
        await until(async () => (await gw.sqlite.getRecords(key))[0]?.state === 'outcome_unknown', 'the answer is lost');
        up.payGate = null;
        // The status tool does not show the charge yet.
        up.lagging = true;
        const again = await pay().catch((e) => e);
        if (reconcile) {
          expect(again).toMatchObject({ structuredContent: { found: true, ref: key } });
          const reconciled = events.filter((e) => e.type === 'outcome_reconciled');
          expect(reconciled).toHaveLength(1);
          expect(reconciled[0]).toMatchObject({ idempotencyKey: key, step: 'mcp:pay' });
          expect((reconciled[0] as { waits: number }).waits).toBeGreaterThanOrEqual(1);
        } else {
          expect(again).toBeInstanceOf(McpRefusalError);
          expect(again.code).toBe('outcome-unknown');
          expect(again.data.reconciling).toBeUndefined();
          expect(events.some((e) => e.type === 'outcome_reconciled')).toBe(false);
        }
        expect(up.paid).toEqual([key]);
      },
    );
  }
});
