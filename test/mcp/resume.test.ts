import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { afterEach, describe, expect, it } from 'vitest';
import type { Forwarder } from '../../src/http/forward.js';
import { createUndiciForwarder } from '../../src/http/forward-undici.js';
import { fenced, mcpRoute, rawPost, startCutProxy, startMcpGateway, textOf, type McpGateway } from './harness.js';
import { startResumableUpstream, type ResumableUpstream } from './resumable-upstream.js';
import { until } from '../helpers/gateway.js';

// A decided tools/call whose answer does not come on its POST's stream
// (docs/mcp.md "Resumed streams and cancels"): a server that closes the
// stream with a retry hint (SSE polling), a client that resumes with GET and
// Last-Event-ID, a client that cancels. Real SDK client and server on both
// sides; each path with its negative control.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A forwarder whose own resuming GETs (not the ones it passes for clients) are refused: the gateway's resume switched off. */
function withoutGatewayResume(inner: Forwarder): Forwarder {
  return {
    forward: (r) => inner.forward(r),
    forwardStreaming: async (r, streamIf) => {
      if (r.method === 'GET' && r.passThrough !== true && r.headers['last-event-id'] !== undefined) return { kind: 'refused', error: 'switched-off' };
      return inner.forwardStreaming!(r, streamIf);
    },
    close: () => inner.close?.() ?? Promise.resolve(),
  };
}

async function setup(options: { timeoutMs?: number; gatewayResume?: boolean } = {}): Promise<{ up: ResumableUpstream; gw: McpGateway; url: string }> {
  const up = await startResumableUpstream();
  cleanups.push(() => up.close());
  const forwarder = options.gatewayResume === false ? withoutGatewayResume(createUndiciForwarder()) : undefined;
  const gw = await startMcpGateway([mcpRoute(up.url, { timeoutMs: options.timeoutMs ?? 10_000 })], forwarder ? { forwarder } : {});
  cleanups.push(() => gw.close());
  return { up, gw, url: `${gw.url}/mcp` };
}

/** The SDK's client; `retries` reconnections of a broken stream (GET with Last-Event-ID). */
async function agent(url: string, retries = 0): Promise<{ client: Client; transport: StreamableHTTPClientTransport }> {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    reconnectionOptions: { maxRetries: retries, initialReconnectionDelay: 100, maxReconnectionDelay: 100, reconnectionDelayGrowFactor: 1 },
  });
  const client = new Client({ name: 'agent', version: '1.0.0' });
  client.onerror = () => {};
  await client.connect(transport);
  cleanups.push(() => client.close().catch(() => {}));
  return { client, transport };
}

const call = (name: string, key: string) => ({ name, arguments: { title: 'printer on fire' }, _meta: fenced(1, 'job', key) });

/** The JSON-RPC error code (or `result`) a retry of `key` gets now, on a fresh session. */
async function retryOutcome(url: string, name: string, key: string): Promise<number | string> {
  const { client } = await agent(url);
  try {
    return textOf(await client.callTool(call(name, key)));
  } catch (err) {
    return (err as { code: number }).code;
  }
}

const gateOf = (up: ResumableUpstream) => {
  let open!: () => void;
  up.gate = new Promise<void>((r) => (open = r));
  return open;
};

describe('a server that closes the call stream with a retry hint (SSE polling)', () => {
  it('the gateway resumes it upstream, the caller gets the result on its POST, and the key is completed', async () => {
    const { up, gw, url } = await setup();
    const open = gateOf(up);
    const { client } = await agent(url);
    const result = client.callTool(call('polling_ticket', 'job-1:poll'));
    await up.started;
    await until(() => up.resumes().length > 0, 'a resuming GET');
    open();
    expect(textOf(await result)).toBe('T-1');
    // The GET was the gateway's: the session, the Last-Event-ID of the priming event it saw.
    const resume = up.resumes()[0]!;
    expect(resume.headers['mcp-session-id']).toBeTruthy();
    expect(gw.decisions().some((d) => d.decision === 'forwarded' && (d as { resumes?: number }).resumes! >= 1)).toBe(true);
    expect(await retryOutcome(url, 'polling_ticket', 'job-1:poll')).toBe('T-1');
    expect(up.tickets).toHaveLength(1);
  });

  it('negative control: without the gateway resume the caller gets -32009 and a retry -32005', async () => {
    const { up, url } = await setup({ gatewayResume: false });
    const open = gateOf(up);
    const { client } = await agent(url);
    const result = client.callTool(call('polling_ticket', 'job-2:poll')).then(
      () => 0,
      (err) => (err as { code: number }).code,
    );
    await up.started;
    expect(await result).toBe(-32009);
    open();
    await until(() => up.tickets.length === 1, 'the ticket');
    expect(await retryOutcome(url, 'polling_ticket', 'job-2:poll')).toBe(-32005);
  });
});

describe('a client that resumes its stream with GET and Last-Event-ID', () => {
  it('the GET is tied to the call: the answer it carries is recorded under the key', async () => {
    // The gateway's own resume is off: only the tie can record the answer.
    const { up, gw, url } = await setup({ gatewayResume: false });
    const cut = await startCutProxy(gw.url);
    cleanups.push(() => cut.close());
    const open = gateOf(up);
    const { client } = await agent(`${cut.url}/mcp`, 3);
    let lastEventId: string | undefined;
    const result = client.callTool(call('create_ticket', 'job-3:create'), undefined, { onresumptiontoken: (t: string) => void (lastEventId = t) });
    await up.started;
    // The priming event (its id) has reached the client: its connection breaks, it resumes with GET + Last-Event-ID.
    await until(() => lastEventId !== undefined, 'an event id');
    cut.cutAll();
    await until(() => up.resumes().length > 0, 'a resuming GET');
    open();
    expect(textOf(await result)).toBe('T-1');
    expect(await retryOutcome(url, 'create_ticket', 'job-3:create')).toBe('T-1');
    expect(up.tickets).toHaveLength(1);
  });

  it('negative control: a resuming GET the gateway does not see leaves the key unknown', async () => {
    const { up, gw, url } = await setup({ gatewayResume: false });
    const open = gateOf(up);
    const { client, transport } = await agent(url);
    let lastEventId: string | undefined;
    const result = client
      .callTool(call('create_ticket', 'job-4:create'), undefined, { onresumptiontoken: (t: string) => void (lastEventId = t) })
      .catch((err) => (err as { code: number }).code);
    await up.started;
    await until(() => lastEventId !== undefined, 'an event id');
    // The same resume, sent past the gateway: the server moves the call's stream to it.
    const sid = transport.sessionId!;
    const direct = await fetch(`${up.url}/mcp`, {
      headers: { accept: 'text/event-stream', 'mcp-session-id': sid, 'last-event-id': lastEventId!, 'mcp-protocol-version': '2025-11-25' },
    });
    open();
    const text = await direct.text();
    expect(text).toContain('T-1');
    expect(await result).toBe(-32009);
    expect(await retryOutcome(url, 'create_ticket', 'job-4:create')).toBe(-32005);
    void gw;
  });
});

describe('a call the client cancels', () => {
  it('the SDK timeout sends notifications/cancelled: withheld, the late answer is recorded, a retry waits then gets the replay', async () => {
    const { up, gw, url } = await setup();
    const open = gateOf(up);
    const { client } = await agent(url);
    const timedOut = await client.callTool(call('create_ticket', 'job-5:create'), undefined, { timeout: 300 }).then(
      () => 0,
      (err) => (err as { code: number }).code,
    );
    expect(timedOut).toBe(-32001);
    // The SDK sends its cancel as it rejects.
    await until(() => gw.decisions().some((d) => d.decision === 'cancel-withheld'), 'the withheld cancel');
    expect(up.cancels()).toHaveLength(0);
    // Meanwhile a retry is told the call is in progress.
    expect(await retryOutcome(url, 'create_ticket', 'job-5:create')).toBe(-32004);
    open();
    await until(() => up.tickets.length === 1, 'the ticket');
    await until(async () => (await retryOutcome(url, 'create_ticket', 'job-5:create')) === 'T-1', 'the replay');
    expect(up.tickets).toHaveLength(1);
  });

  it('the client going away: the call is read on and recorded; a retry meanwhile is in progress, then the replay', async () => {
    const { up, gw, url } = await setup();
    const cut = await startCutProxy(gw.url);
    cleanups.push(() => cut.close());
    const open = gateOf(up);
    const { client } = await agent(`${cut.url}/mcp`);
    const result = client.callTool(call('create_ticket', 'job-7:create')).catch(() => 'cut');
    await up.started;
    cut.cutAll();
    expect(await result).toBe('cut');
    expect(await retryOutcome(url, 'create_ticket', 'job-7:create')).toBe(-32004);
    open();
    await until(async () => (await retryOutcome(url, 'create_ticket', 'job-7:create')) === 'T-1', 'the replay');
    expect(up.tickets).toHaveLength(1);
  });

  it('negative control: the cancel reaching the server leaves the key unknown', async () => {
    const { up, url } = await setup({ timeoutMs: 1500 });
    const open = gateOf(up);
    const { client, transport } = await agent(url);
    const result = client.callTool(call('create_ticket', 'job-6:create')).catch((err) => (err as { code: number }).code);
    await up.started;
    const id = JSON.parse(up.requests.filter((r) => r.body.includes('job-6:create')).at(-1)!.body).id;
    // The cancel the gateway would withhold, sent past it.
    const res = await rawPost(
      `${up.url}/mcp`,
      JSON.stringify({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: id, reason: 'timeout' } }),
      { 'mcp-session-id': transport.sessionId!, 'mcp-protocol-version': '2025-11-25' },
    );
    expect(res.status).toBe(202);
    open();
    expect(await result).toBe(-32009);
    expect(up.tickets).toHaveLength(1);
    expect(await retryOutcome(url, 'create_ticket', 'job-6:create')).toBe(-32005);
  });
});
