import { afterEach, expect, it } from 'vitest';
import { mintFence } from '../../src/protocol/fence-token.js';
import { connectClient, fenced, mcpRoute, startMcpGateway } from './harness.js';
import { startMcpUpstream } from './mcp-upstream.js';

// Signed fences (DESIGN §7) on an mcp route: the `_meta` fence is the JWS,
// checked by the same signed-fence check as a plain route's header.

const SECRET = 'fence-secret-0123456789-abcdefghijklmnopq';
const GIANT = '9223372036854775807';
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

it('a signed _meta fence passes; a bare giant integer and an expired fence are refused before the server; unsigned, the giant one runs', async () => {
  const up = await startMcpUpstream({ stateful: false, json: true });
  cleanups.push(() => up.close());
  const signed = await startMcpGateway([mcpRoute(up.url)], { config: { fence: { signed: { secret: SECRET } } } });
  cleanups.push(() => signed.close());
  const unsigned = await startMcpGateway([mcpRoute(up.url)]);
  cleanups.push(() => unsigned.close());
  const agent = async (url: string) => {
    const c = await connectClient(`${url}/mcp`);
    cleanups.push(() => c.close());
    return c.client;
  };
  const now = Math.floor(Date.now() / 1000);
  const jws = await mintFence({ ent: 'job-1', fence: 3, sub: 'worker-a', exp: now + 60 }, { secret: SECRET });
  const expired = await mintFence({ ent: 'job-1', fence: 4, sub: 'worker-a', exp: now - 60 }, { secret: SECRET });

  const a = await agent(signed.url);
  await a.callTool({ name: 'create_ticket', arguments: { title: 'signed' }, _meta: fenced(jws, 'job-1', 'k-1') });
  await expect(a.callTool({ name: 'create_ticket', arguments: { title: 'forged' }, _meta: fenced(GIANT, 'job-1', 'k-2') })).rejects.toMatchObject({
    code: -32007,
    data: { type: 'invalid-fence-signature', status: 401, entity: 'job-1' },
  });
  await expect(a.callTool({ name: 'create_ticket', arguments: { title: 'late' }, _meta: fenced(expired, 'job-1', 'k-3') })).rejects.toMatchObject({
    code: -32002,
    data: { type: 'fence-expired' },
  });
  expect(up.tickets.map((t) => t.title)).toEqual(['signed']);
  expect(signed.sqlite.db.prepare('SELECT reason FROM rejections ORDER BY id').all()).toEqual([
    { reason: 'invalid-fence-signature' },
    { reason: 'fence-expired' },
  ]);

  // The control: without signed fences the forged giant fence is a fence like any other.
  const b = await agent(unsigned.url);
  await b.callTool({ name: 'create_ticket', arguments: { title: 'forged' }, _meta: fenced(GIANT, 'job-1', 'k-2') });
  expect(up.tickets.map((t) => t.title)).toEqual(['signed', 'forged']);
});
