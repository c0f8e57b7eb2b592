/**
 * The MCP tool in the rejection log (DESIGN §4 `rejections.tool`): a
 * tools/call refused for a stale fence, through a real Node gateway on
 * loopback with the SDK's MCP server as the upstream, on the SQLite store and
 * on PostgreSQL. Its row names the tool; `GET <adminPrefix>/v1/rejections?tool=`
 * (JSON, NDJSON and CSV) finds it; the same refusal on a plain HTTP route
 * has tool null and never matches the filter.
 *
 * Negative control: a store wrapper that drops `audit.tool` from the
 * admission (as if the MCP pipeline did not set it): the row then has no
 * tool and the filter finds nothing, so the assertions above can fail.
 */
import { randomUUID } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import type { GatewayStore } from '../../src/store/types.js';
import { delegate } from '../helpers/delegate.js';
import { command, paymentsRoute, startTestGateway } from '../helpers/gateway.js';
import { startPgTestGateway } from '../helpers/pg-gateway.js';
import { POSTGRES_URL } from '../helpers/postgres.js';
import { startUpstream } from '../helpers/upstream.js';
import { fenced, mcpRoute, rawPost } from '../mcp/harness.js';
import { startMcpUpstream } from '../mcp/mcp-upstream.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

type Wrap = (store: GatewayStore) => GatewayStore;
const STORES: {
  name: string;
  skip: boolean;
  start: (routes: ReturnType<typeof paymentsRoute>[], wrapStore?: Wrap) => Promise<{ url: string; close(): Promise<void> }>;
}[] = [
  { name: 'SQLite', skip: false, start: (routes, wrapStore) => startTestGateway({ routes, ...(wrapStore ? { wrapStore } : {}) }) },
  {
    name: 'PostgreSQL',
    skip: !POSTGRES_URL,
    start: (routes, wrapStore) => startPgTestGateway({ routes, prefix: 'fg_tool', ...(wrapStore ? { wrapStore } : {}) }),
  },
];

/** Drops the tool from every admission: the MCP pipeline's `audit.tool`, switched off. */
const withoutTool: Wrap = (store) => delegate(store, { admit: (i) => store.admit({ ...i, audit: { ...i.audit, tool: null } }) });

async function setup(start: (typeof STORES)[number]['start'], wrap?: Wrap) {
  const mcp = await startMcpUpstream({ stateful: false, json: true });
  cleanups.push(() => mcp.close());
  const plain = await startUpstream();
  cleanups.push(() => plain.close());
  const gw = await start([mcpRoute(mcp.url) as ReturnType<typeof paymentsRoute>, paymentsRoute(plain.url)], wrap);
  cleanups.push(() => gw.close());
  const entity = `job-${randomUUID().slice(0, 8)}`;
  const call = (fence: number, key: string) =>
    rawPost(
      `${gw.url}/mcp`,
      JSON.stringify({
        jsonrpc: '2.0',
        id: 1,
        method: 'tools/call',
        params: { name: 'create_ticket', arguments: { title: key }, _meta: fenced(fence, entity, key) },
      }),
    );
  // A tools/call with fence 5, then one with the stale fence 3.
  expect(await (await call(5, `new-${entity}`)).text()).toContain('"result"');
  const stale = (await (await call(3, `old-${entity}`)).json()) as { error: { data: { type: string } } };
  expect(stale.error.data.type).toMatch(/stale-fence$/);
  // The same refusal on a plain route.
  expect((await command(gw.url, '/payments/p1', { fence: 5, entity, key: `p-new-${entity}` })).status).toBeLessThan(300);
  expect((await command(gw.url, '/payments/p1', { fence: 3, entity, key: `p-old-${entity}` })).status).toBe(409);
  const v1 = (query: string, accept = 'application/json') => fetch(`${gw.url}/_fencegate/v1/rejections?${query}`, { headers: { accept } });
  const items = async (query: string) => {
    const res = await v1(query);
    expect(res.status, await res.clone().text()).toBe(200);
    return ((await res.json()) as { items: Record<string, unknown>[] }).items;
  };
  return { entity, v1, items };
}

describe.each(STORES)('rejections.tool through the gateway ($name)', ({ skip, start }) => {
  it.skipIf(skip)(
    "a refused tools/call names its tool; ?tool= finds it in JSON, NDJSON and CSV; a plain route's row has tool null and is excluded",
    async () => {
      const { entity, v1, items } = await setup(start);
      const both = await items(`entity=${entity}&reason=stale-fence`);
      expect(both.map((r) => [r.path, r.tool])).toEqual([
        ['/payments/p1', null],
        ['/mcp', 'create_ticket'],
      ]);
      const byTool = await items(`entity=${entity}&tool=create_ticket`);
      expect(byTool).toHaveLength(1);
      expect(byTool[0]).toMatchObject({ reason: 'stale-fence', tool: 'create_ticket', entity, presented_fence: '3', current_fence: '5', path: '/mcp' });
      expect(await items(`entity=${entity}&tool=no_such_tool`)).toEqual([]);

      const nd = (await (await v1(`entity=${entity}&tool=create_ticket`, 'application/x-ndjson')).text()).trim().split('\n');
      expect(nd.map((l) => JSON.parse(l).tool)).toEqual(['create_ticket']);
      const csv = (await (await v1(`entity=${entity}&tool=create_ticket&format=csv`)).text()).trim().split('\r\n');
      const cols = csv[0]!.split(',');
      expect(csv).toHaveLength(2);
      expect(csv[1]!.split(',')[cols.indexOf('tool')]).toBe('create_ticket');
    },
  );

  it.skipIf(skip)('negative control: with the tool dropped from the admission, the row has none and the filter finds nothing', async () => {
    const { entity, items } = await setup(start, withoutTool);
    expect((await items(`entity=${entity}&reason=stale-fence`)).map((r) => r.tool)).toEqual([null, null]);
    expect(await items(`entity=${entity}&tool=create_ticket`)).toEqual([]);
  });
});
