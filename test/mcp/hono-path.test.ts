import { afterEach, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { createFetchForwarder } from '../../src/http/forward-fetch.js';
import { createGateway } from '../../src/http/gateway.js';
import { silentLogger } from '../../src/http/logger.js';
import { SqliteGatewayStore } from '../../src/store/sqlite/gateway-store.js';
import { connectClient, fenced, mcpRoute, textOf } from './harness.js';
import { startMcpUpstream } from './mcp-upstream.js';

// The other way in: the Hono app (`app.fetch`, as on Workers) with the fetch
// forwarder, its streamed answers as web Responses. The SDK client calls
// `app.fetch` directly; the upstream is the real SDK server on loopback.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

it('through app.fetch and the fetch forwarder: progress streamed while the tool runs, one execution, replay on a new session, stale fence refused', async () => {
  const up = await startMcpUpstream({ stateful: true, json: false });
  cleanups.push(() => up.close());
  const config = parseConfig({ store: { sqlite: ':memory:' }, routes: [mcpRoute(up.url)] });
  const gateway = createGateway({
    config,
    store: new SqliteGatewayStore({ path: ':memory:' }),
    forwarder: createFetchForwarder(),
    env: {},
    logger: silentLogger,
  });
  cleanups.push(() => gateway.close());
  const viaApp = ((input: string | URL | Request, init?: RequestInit) => Promise.resolve(gateway.app.fetch(new Request(input, init)))) as typeof fetch;
  const connect = async () => {
    const c = await connectClient('http://gateway.test/mcp', { fetch: viaApp });
    cleanups.push(() => c.close());
    return c.client;
  };

  let open!: () => void;
  up.gate = new Promise<void>((r) => (open = r));
  const agent = await connect();
  const progress: number[] = [];
  const call = { name: 'slow_report', arguments: { steps: 2 }, _meta: fenced(4, 'job', 'hono-1') };
  // The gate opens on the first notification: only a streamed one can open it.
  const first = await agent.callTool(call, undefined, {
    onprogress: (p) => {
      progress.push(p.progress);
      open();
    },
  });
  expect(progress).toEqual([1, 2]);
  expect(textOf(first)).toBe('report of 2 steps');

  const again = await (await connect()).callTool(call);
  expect(again).toEqual(first);
  expect(up.callsOf('slow_report')).toHaveLength(1);

  await expect(agent.callTool({ name: 'create_ticket', arguments: { title: 'late' }, _meta: fenced(3, 'job', 'hono-2') })).rejects.toThrow(/stale-fence/);
  expect(up.tickets).toHaveLength(0);
});
