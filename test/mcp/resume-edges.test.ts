import { afterEach, describe, expect, it } from 'vitest';
import { cancelledRequestId, InFlightCalls, MAX_EVENT_IDS } from '../../src/http/mcp/resume.js';
import { SseSplitter } from '../../src/http/mcp/sse.js';
import { decisionOutcomeOf, outcomeOf, rejectionReasonOf } from '../../src/http/metrics-spec.js';
import { fenced, mcpRoute, rawPost, startMcpGateway } from './harness.js';
import { rawUpstream, type RawUpstream } from './raw-upstream.js';

// The resumed-stream machinery (docs/mcp.md "Resumed streams and cancels")
// against what an SDK server never sends: a resume the server refuses, a
// server that keeps closing the stream, a resume that carries another id's
// answer; and its pieces alone.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const encoder = new TextEncoder();
const SESSION = 'sess-1';
const callBody = (key: string) =>
  JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'create_ticket', arguments: { title: 'x' }, _meta: fenced(1, 'job', key) } });

async function gateway(up: RawUpstream, timeoutMs = 1_500) {
  const gw = await startMcpGateway([mcpRoute(up.url, { timeoutMs })]);
  cleanups.push(() => gw.close());
  return gw;
}

/** The JSON-RPC messages of an event-stream (or JSON) answer. */
async function messages(res: Response): Promise<{ id?: unknown; result?: unknown; error?: { code: number } }[]> {
  const text = await res.text();
  if (!(res.headers.get('content-type') ?? '').includes('event-stream')) return [JSON.parse(text)];
  return text
    .split('\n')
    .filter((l) => l.startsWith('data: ') && l.length > 6)
    .map((l) => JSON.parse(l.slice(6)));
}

/** A POST answered with a priming event (id, retry) and then closed: SSE polling. */
function closeWithHint(res: import('node:http').ServerResponse, retry = 50) {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'mcp-session-id': SESSION });
  res.end(`id: ev-1\nretry: ${retry}\ndata: \n\n`);
}

describe('the gateway resuming a closed stream, against hostile servers', () => {
  it('a resume the server refuses (404) ends the call unknown, -32009', async () => {
    const up = await rawUpstream((req, res) => {
      if (req.method === 'POST') return closeWithHint(res);
      res.writeHead(404, { 'content-type': 'application/json' }).end('{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"no session"}}');
    });
    cleanups.push(() => up.close());
    const gw = await gateway(up);
    const res = await rawPost(`${gw.url}/mcp`, callBody('k-404'), { 'mcp-session-id': SESSION });
    const msgs = await messages(res);
    expect(msgs.at(-1)!.error!.code).toBe(-32009);
    const resume = up.seen.find((s) => s.method === 'GET')!;
    expect(resume.headers['last-event-id']).toBe('ev-1');
    expect(resume.headers['mcp-session-id']).toBe(SESSION);
    expect(resume.headers['content-type']).toBeUndefined();
  });

  it('a server that keeps closing without the answer is resumed only until the call deadline: -32009, then -32005', async () => {
    let n = 0;
    const up = await rawUpstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'mcp-session-id': SESSION });
      res.end(`id: ev-${++n}\nretry: 10\ndata: \n\n`);
    });
    cleanups.push(() => up.close());
    const gw = await gateway(up, 800);
    const msgs = await messages(await rawPost(`${gw.url}/mcp`, callBody('k-loop'), { 'mcp-session-id': SESSION }));
    expect(msgs.at(-1)!.error!.code).toBe(-32009);
    const gets = up.seen.filter((s) => s.method === 'GET');
    expect(gets.length).toBeGreaterThan(1);
    // Each resume from the last id the gateway saw.
    expect(gets[1]!.headers['last-event-id']).toBe('ev-2');
    const retry = await messages(await rawPost(`${gw.url}/mcp`, callBody('k-loop'), { 'mcp-session-id': SESSION }));
    expect(retry[0]!.error!.code).toBe(-32005);
  });

  it("a resumed stream's response to another id is not the answer: the call stays unknown", async () => {
    const up = await rawUpstream((req, res) => {
      if (req.method === 'POST') return closeWithHint(res);
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(`id: ev-2\nevent: message\ndata: {"jsonrpc":"2.0","id":8,"result":{"content":[]}}\n\n`);
    });
    cleanups.push(() => up.close());
    const gw = await gateway(up, 800);
    const msgs = await messages(await rawPost(`${gw.url}/mcp`, callBody('k-other'), { 'mcp-session-id': SESSION }));
    expect(msgs.some((m) => m.id === 8)).toBe(false);
    expect(msgs.at(-1)!.error!.code).toBe(-32009);
  });

  it('the answer on the resumed stream is recorded: a retry gets the replay', async () => {
    const up = await rawUpstream((req, res) => {
      if (req.method === 'POST') return closeWithHint(res);
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(`id: ev-2\nevent: message\ndata: {"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"T-1"}]}}\n\n`);
    });
    cleanups.push(() => up.close());
    const gw = await gateway(up);
    const first = await messages(await rawPost(`${gw.url}/mcp`, callBody('k-ok'), { 'mcp-session-id': SESSION }));
    expect(first.at(-1)).toMatchObject({ id: 7, result: { content: [{ text: 'T-1' }] } });
    const retry = await rawPost(`${gw.url}/mcp`, callBody('k-ok'), { 'mcp-session-id': SESSION });
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect((await messages(retry))[0]).toMatchObject({ result: { content: [{ text: 'T-1' }] } });
    expect(up.seen.filter((s) => s.method === 'POST')).toHaveLength(1);
  });

  it("a client's resuming GET the server refuses unties it: the gateway then resumes itself and records the answer", async () => {
    let post: import('node:http').ServerResponse | null = null;
    const up = await rawUpstream((req, res) => {
      if (req.method === 'POST') {
        post = res;
        res.writeHead(200, { 'content-type': 'text/event-stream', 'mcp-session-id': SESSION });
        res.write('id: ev-1\nretry: 10\ndata: \n\n');
        return;
      }
      if (req.headers['x-test-client'] === '1') {
        // An event store that refuses a second connection to a live stream (the SDK's 409), then the server closes the call's stream.
        res.writeHead(409, { 'content-type': 'application/json' }).end('{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Conflict"}}');
        post!.end();
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(`id: ev-2\nevent: message\ndata: {"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"T-1"}]}}\n\n`);
    });
    cleanups.push(() => up.close());
    const gw = await gateway(up, 5_000);
    const res = await rawPost(`${gw.url}/mcp`, callBody('k-untie'), { 'mcp-session-id': SESSION });
    const reader = res.body!.getReader();
    // The priming event has passed the gateway (it saw ev-1).
    await reader.read();
    const get = await fetch(`${gw.url}/mcp`, {
      headers: { accept: 'text/event-stream', 'mcp-session-id': SESSION, 'last-event-id': 'ev-1', 'x-test-client': '1' },
    });
    expect(get.status).toBe(409);
    await get.text();
    let rest = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      rest += new TextDecoder().decode(value);
    }
    expect(rest).toContain('"text":"T-1"');
    const retry = await rawPost(`${gw.url}/mcp`, callBody('k-untie'), { 'mcp-session-id': SESSION });
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
  });

  it('a cancel on another session, or for another id, is forwarded', async () => {
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const up = await rawUpstream(async (_req, res, body) => {
      if (body.includes('tools/call')) {
        res.writeHead(200, { 'content-type': 'text/event-stream', 'mcp-session-id': SESSION });
        res.write('id: ev-1\ndata: \n\n');
        await held;
        res.end(`event: message\ndata: {"jsonrpc":"2.0","id":7,"result":{"content":[]}}\n\n`);
        return;
      }
      res.writeHead(202).end();
    });
    cleanups.push(() => up.close());
    const gw = await gateway(up, 5_000);
    const call = rawPost(`${gw.url}/mcp`, callBody('k-cancel'), { 'mcp-session-id': SESSION });
    while (!up.seen.some((s) => s.body.includes('tools/call'))) await new Promise((r) => setTimeout(r, 20));
    const cancel = (requestId: number) => JSON.stringify({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId } });
    expect((await rawPost(`${gw.url}/mcp`, cancel(7), { 'mcp-session-id': 'other' })).status).toBe(202);
    expect((await rawPost(`${gw.url}/mcp`, cancel(8), { 'mcp-session-id': SESSION })).status).toBe(202);
    expect((await rawPost(`${gw.url}/mcp`, cancel(7), { 'mcp-session-id': SESSION })).status).toBe(202);
    // The first two reached the server; the one for the call in flight did not.
    expect(up.seen.filter((s) => s.body.includes('notifications/cancelled'))).toHaveLength(2);
    release();
    await (await call).text();
  });
});

describe('pieces', () => {
  it("SseSplitter reads an event's id and retry; a NUL id or a non-numeric retry is ignored", () => {
    const s = new SseSplitter(1000);
    const events = s.push(encoder.encode('id: a\nretry: 250\ndata: x\n\ndata: y\n\nid: b\u0000c\nretry: 1s\ndata: z\n\n'))!;
    expect(events.map((e) => [e.id, e.retry])).toEqual([
      ['a', 250],
      [null, null],
      [null, null],
    ]);
  });

  it('InFlightCalls: watched only with a session, one per session and id, event ids bounded, forgotten on close', () => {
    const calls = new InFlightCalls();
    expect(calls.open(null, 1, 10_000)).toBeNull();
    const w = calls.open('s', 1, 10_000)!;
    expect(calls.open('s', 1, 10_000)).toBeNull();
    const event = (id: string) => ({ raw: '', data: null, type: 'message', id, retry: null });
    for (let i = 0; i < MAX_EVENT_IDS + 5; i++) w.saw(event(`e${i}`));
    expect(calls.tiedTo('s', 'e0')).toBeUndefined();
    expect(calls.tiedTo('s', `e${MAX_EVENT_IDS + 4}`)).toBe(w);
    expect(calls.tiedTo('other', `e${MAX_EVENT_IDS + 4}`)).toBeUndefined();
    expect(calls.cancelled('s', 1)).toBe(w);
    expect(calls.cancelled('s', '1')).toBeUndefined();
    w.close();
    expect(calls.size).toBe(0);
    expect(calls.cancelled('s', 1)).toBeUndefined();
    expect(calls.tiedTo('s', `e${MAX_EVENT_IDS + 4}`)).toBeUndefined();
  });

  it('a withheld cancel is counted as passed, never as a rejection', () => {
    expect(decisionOutcomeOf('cancel-withheld')).toBe('passed');
    expect(outcomeOf('cancel-withheld')).toBe('passed');
    expect(rejectionReasonOf('cancel-withheld')).toBeNull();
  });

  it('cancelledRequestId reads a single cancel notification only', () => {
    const b = (v: unknown) => encoder.encode(JSON.stringify(v));
    expect(cancelledRequestId(b({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 3 } }))).toBe(3);
    expect(cancelledRequestId(b({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 'a' } }))).toBe('a');
    expect(cancelledRequestId(b([{ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 3 } }]))).toBeUndefined();
    expect(cancelledRequestId(b({ jsonrpc: '2.0', id: 1, method: 'notifications/cancelled', params: { requestId: 3 } }))).toBeUndefined();
    expect(cancelledRequestId(b({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 1.5 } }))).toBeUndefined();
    expect(cancelledRequestId(b({ jsonrpc: '2.0', method: 'ping' }))).toBeUndefined();
  });
});
