/**
 * `fencegate audit --tool <name>` (the compiled CLI, `npm run build` first),
 * against a real gateway on loopback (`--url`: the flag becomes `?tool=`) and
 * straight against its SQLite file (`--db`): only the refused tools/call of
 * that tool, never the plain route's refusal of the same entity (tool null).
 * Negative control: without `--tool` both rows are listed, so a flag that
 * were dropped on the way would fail the filtered assertions.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { CLI, killAll as killChildren, runNode } from '../helpers/child.js';
import { command, paymentsRoute, startTestGateway } from '../helpers/gateway.js';
import { startUpstream } from '../helpers/upstream.js';
import { fenced, mcpRoute, rawPost } from '../mcp/harness.js';
import { startMcpUpstream } from '../mcp/mcp-upstream.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  await killChildren();
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe('fencegate audit --tool', () => {
  it('lists only the refused calls of that tool, over the API and from the store', async () => {
    const mcp = await startMcpUpstream({ stateful: false, json: true });
    cleanups.push(() => mcp.close());
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const gw = await startTestGateway({ routes: [paymentsRoute(up.url), mcpRoute(mcp.url) as ReturnType<typeof paymentsRoute>] });
    cleanups.push(() => gw.close());
    const entity = 'job-cli';
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
    expect(await (await call(5, 'a')).text()).toContain('"result"');
    expect(await (await call(3, 'b')).text()).toContain('stale-fence');
    expect((await command(gw.url, '/payments/p', { fence: 3, entity, key: 'c' })).status).toBe(409);

    const tools = async (...args: string[]) => {
      const r = await runNode([CLI, 'audit', ...args, '--entity', entity, '--format', 'ndjson']);
      expect(r.code, r.stderr).toBe(0);
      return r.stdout
        .trim()
        .split('\n')
        .map((l) => (JSON.parse(l) as { tool: string | null }).tool);
    };
    for (const where of [
      ['--url', gw.url],
      ['--db', gw.dbPath],
    ]) {
      expect(await tools(...where)).toEqual([null, 'create_ticket']);
      expect(await tools(...where, '--tool', 'create_ticket')).toEqual(['create_ticket']);
    }
    const none = await runNode([CLI, 'audit', '--db', gw.dbPath, '--tool', 'no_such_tool', '--format', 'ndjson']);
    expect([none.code, none.stdout]).toEqual([0, '']);
  });
});
