/**
 * The MCP tool in the rejection log on D1 (DESIGN §4 `rejections.tool`),
 * end to end through the Worker's own `fetch` inside workerd with the local
 * D1 of wrangler.toml: a plain route raises the entity's fence to 5, a
 * tools/call with fence 3 is refused as stale-fence, and so is a plain
 * request with fence 3. `?tool=` finds the call's row only; the plain row has
 * tool null. The malformed-fence 400 of a tools/call is logged with its tool.
 *
 * Negative control: the same filter with a tool name that was never called
 * finds nothing, and the plain row (tool null) is never returned by `?tool=`.
 */
import { createExecutionContext, waitOnExecutionContext } from 'cloudflare:test';
import { env } from 'cloudflare:workers';
import { describe, expect, inject, it } from 'vitest';
import worker, { type WorkerEnv } from '../../src/entry/worker.js';

const upstreamUrl = inject('upstreamUrl');
let n = 0;
const uniq = (what: string) => `${what}-${Date.now().toString(36)}-${++n}`;

const config = JSON.stringify({
  store: { d1: 'DB' },
  routes: [
    { name: 'payments', match: { path: '/payments/*', methods: ['POST'] }, upstream: upstreamUrl, timeoutMs: 1_500 },
    { name: 'tickets', protocol: 'mcp', match: { path: '/mcp' }, upstream: upstreamUrl, timeoutMs: 1_500 },
  ],
});
const workerEnv: WorkerEnv = { ...env, FENCEGATE_CONFIG: config, FENCEGATE_LOG_LEVEL: 'error', FENCEGATE_ADMIN: 'on' };

async function call(path: string, init: RequestInit = {}): Promise<Response> {
  const ctx = createExecutionContext();
  const res = await worker.fetch(new Request(`http://localhost${path}`, init), workerEnv, ctx);
  const body = await res.arrayBuffer();
  await waitOnExecutionContext(ctx);
  return new Response(res.status === 204 ? null : body, { status: res.status, headers: res.headers });
}

const pay = (entity: string, fence: string): RequestInit => ({
  method: 'POST',
  headers: { 'content-type': 'application/json', 'x-execution-fence': fence, 'x-fence-entity': entity, 'idempotency-key': uniq('k') },
  body: '{"amount":1}',
});

const toolsCall = (entity: string, fence: string): RequestInit => ({
  method: 'POST',
  headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
  body: JSON.stringify({
    jsonrpc: '2.0',
    id: 1,
    method: 'tools/call',
    params: {
      name: 'create_ticket',
      arguments: { title: 't' },
      _meta: { 'io.fencegate/fence': fence, 'io.fencegate/entity': entity, 'io.fencegate/idempotency-key': uniq('k') },
    },
  }),
});

async function rejections(query: string): Promise<Record<string, unknown>[]> {
  const res = await call(`/_fencegate/v1/rejections?${query}`);
  expect(res.status, await res.clone().text()).toBe(200);
  return ((await res.json()) as { items: Record<string, unknown>[] }).items;
}

describe('rejections.tool on D1, through the Worker', () => {
  it("a stale tools/call names its tool; ?tool= finds it and never the plain route's row", async () => {
    const entity = uniq('job');
    expect((await call('/payments/p', pay(entity, '5'))).status).toBe(201);
    const stale = (await (await call('/mcp', toolsCall(entity, '3'))).json()) as { error: { data: { type: string } } };
    expect(stale.error.data.type).toMatch(/stale-fence$/);
    expect((await call('/payments/p', pay(entity, '3'))).status).toBe(409);

    expect((await rejections(`entity=${entity}`)).map((r) => [r.reason, r.path, r.tool])).toEqual([
      ['stale-fence', '/payments/p', null],
      ['stale-fence', '/mcp', 'create_ticket'],
    ]);
    const byTool = await rejections(`entity=${entity}&tool=create_ticket`);
    expect(byTool).toHaveLength(1);
    expect(byTool[0]).toMatchObject({ tool: 'create_ticket', presented_fence: '3', current_fence: '5' });
    expect(await rejections(`entity=${entity}&tool=no_such_tool`)).toEqual([]);
  });

  it('a tools/call with a malformed fence is logged (400 invalid-fence) with its tool and the value presented', async () => {
    const entity = uniq('job');
    const res = (await (await call('/mcp', toolsCall(entity, '+7'))).json()) as { error: { data: { type: string; request_id: string } } };
    expect(res.error.data.type).toMatch(/invalid-fence$/);
    const rows = (await rejections('reason=invalid-fence&tool=create_ticket')).filter((r) => r.request_id === res.error.data.request_id);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ reason: 'invalid-fence', tool: 'create_ticket', path: '/mcp' });
    expect(rows[0]!.detail).toContain('presented "+7"');
  });
});
