/**
 * Edges of the staged pipeline (src/http/pipeline/) that no other suite
 * pins: what a refused tool call's rejection row keeps, the decision of a
 * taken-over call that could not be sent, which paths are the admin API's,
 * and the one decision line of an auth refusal.
 */
import { createHash } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { delegate } from '../helpers/delegate.js';
import { paymentsRoute, startTestGateway } from '../helpers/gateway.js';
import { startUpstream } from '../helpers/upstream.js';
import { fenced, mcpRoute, rawPost, startMcpGateway } from '../mcp/harness.js';
import { startMcpUpstream } from '../mcp/mcp-upstream.js';
import { echoTool, rawUpstream, toolCall } from '../mcp/raw-upstream.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe('mcp rejection rows', () => {
  it('a tools/call refused for its _meta fence keeps the sha256 of the body it sent (payload_sha256): the call is its body', async () => {
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const mcp = await startMcpUpstream({ stateful: false, json: true });
    cleanups.push(() => mcp.close());
    const gw = await startTestGateway({ routes: [paymentsRoute(up.url), mcpRoute(mcp.url) as ReturnType<typeof paymentsRoute>] });
    cleanups.push(() => gw.close());
    const body = JSON.stringify({
      jsonrpc: '2.0',
      id: 7,
      method: 'tools/call',
      params: {
        name: 'create_ticket',
        arguments: { title: 't' },
        _meta: { 'io.fencegate/fence': '07', 'io.fencegate/entity': 'job', 'io.fencegate/idempotency-key': 'k' },
      },
    });
    const res = await rawPost(`${gw.url}/mcp`, body);
    await res.text();
    const [row] = gw.sqlite.db.prepare('SELECT * FROM rejections ORDER BY id').all() as Record<string, string | null>[];
    expect(row).toMatchObject({ reason: 'invalid-fence', tool: 'create_ticket' });
    expect(row!.payload_sha256).toBe(createHash('sha256').update(body).digest('hex'));
  });
});

describe('mcp admission-expired after a takeover', () => {
  it('the decision line says admission-expired-after-takeover, as every other outcome of a takeover does', async () => {
    const tool = echoTool();
    const up = await rawUpstream(tool.handler);
    cleanups.push(() => up.close());
    const gw = await startMcpGateway([mcpRoute(up.url, { timeoutMs: 300, lockMarginMs: 300 })], {
      // The admission answers forward-with-takeover after its lock has gone by (a paused replica).
      wrapStore: (s) =>
        delegate(s, {
          admit: async (i) => {
            const a = await s.admit(i);
            await new Promise((r) => setTimeout(r, i.lockMs + 100));
            return a.outcome === 'forward' ? { ...a, takeover: true } : a;
          },
        }),
    });
    cleanups.push(() => gw.close());
    const res = await rawPost(`${gw.url}/mcp`, toolCall(1, 'create_ticket', { title: 'a' }, fenced(3, 'ticket:1', 'k-exp')));
    const json = (await res.json()) as { error?: { data?: { type?: string } } };
    expect(json.error?.data?.type).toMatch(/admission-expired$/);
    expect(up.seen.length).toBe(0);
    expect(gw.decisions().map((d) => d.decision)).toEqual(['admission-expired-after-takeover']);
  });
});

describe('a catch-all route and the admin prefix', () => {
  it("a path whose %2F-decoded reading is under adminPrefix, but neither its normal form nor the admin app's reading (decodeURI keeps %2F), is proxied", async () => {
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const gw = await startTestGateway({
      routes: [paymentsRoute(up.url, { name: 'all', match: { path: '/*' }, fence: 'off', idempotency: 'off', mode: 'concurrent' })],
    });
    cleanups.push(() => gw.close());
    const res = await fetch(`${gw.url}/_fencegate%2Fhealth`, { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } });
    const text = await res.text();
    expect(res.status, text).toBe(201);
    expect(up.calls).toHaveLength(1);
    // Control: the admin app's own reading of /%5Ffencegate/health is its health endpoint, never proxied.
    const admin = await fetch(`${gw.url}/%5Ffencegate/health`);
    expect(admin.status).toBe(200);
    expect(((await admin.json()) as { status?: string }).status).toBe('ok');
    expect(up.calls).toHaveLength(1);
  });
});

describe('an auth refusal', () => {
  it("one decision line, its x-request-id the body's and the rejection row's", async () => {
    const { hsAuth } = await import('../auth/tokens.js');
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const logs: Record<string, unknown>[] = [];
    const keep = (msg: string, fields?: Record<string, unknown>) => void logs.push({ msg, ...fields });
    const gw = await startTestGateway({ routes: [paymentsRoute(up.url)], config: { auth: hsAuth() }, logger: { info: keep, warn: keep, error: keep } });
    cleanups.push(() => gw.close());
    const res = await fetch(`${gw.url}/payments/p1`, { method: 'POST', body: '{}', headers: { authorization: 'Bearer nope.nope.nope' } });
    const body = (await res.json()) as { request_id: string };
    expect(res.status).toBe(401);
    const rid = res.headers.get('x-request-id');
    expect(body.request_id).toBe(rid);
    const decisions = logs.filter((l) => l.msg === 'decision');
    expect(decisions).toHaveLength(1);
    expect(decisions[0]).toMatchObject({ decision: 'unauthorized', status: 401, route: 'payments', request_id: rid });
    const [row] = gw.sqlite.db.prepare('SELECT * FROM rejections').all() as Record<string, string | null>[];
    expect(row).toMatchObject({ reason: 'unauthorized', request_id: rid, path: '/payments/p1' });
  });
});
