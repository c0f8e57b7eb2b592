import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { InMemoryEventStore } from '@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';

/**
 * A real MCP server (the SDK's McpServer, StreamableHTTPServerTransport with
 * sessions, an event store and a `retry:` interval: resumable streams, SSE
 * polling of MCP 2025-11-25) on loopback. Its tools, each one more ticket
 * per execution (not idempotent):
 * - `create_ticket` — waits for `gate` (when set) before it answers;
 * - `polling_ticket` — closes its request's event stream at once (the
 *   server's `closeSSEStream`: the client is to come back with GET and
 *   `Last-Event-ID` after `retry`), then creates the ticket after `gate`;
 * - `find_ticket` — the status tool (read-only): `{ found, n }` as
 *   structuredContent, `found` when a ticket with that title exists (a
 *   caller that puts its idempotency key in the title finds its call by key).
 * It records every HTTP request (method, headers, body).
 */
export interface ResumableUpstream {
  url: string;
  tickets: string[];
  requests: { method: string; headers: IncomingMessage['headers']; body: string }[];
  /** The `notifications/cancelled` messages that reached the server. */
  cancels(): unknown[];
  /** GETs that carried a Last-Event-ID. */
  resumes(): { headers: IncomingMessage['headers'] }[];
  gate: Promise<void> | null;
  /** Resolves when a tool started (before its gate). */
  started: Promise<void>;
  close(): Promise<void>;
}

export async function startResumableUpstream(options: { retryMs?: number } = {}): Promise<ResumableUpstream> {
  const sessions = new Map<string, StreamableHTTPServerTransport>();
  const sockets = new Set<Socket>();
  let markStarted!: () => void;
  const up: ResumableUpstream = {
    url: '',
    tickets: [],
    requests: [],
    cancels: () =>
      up.requests
        .filter((r) => r.method === 'POST' && r.body.includes('notifications/cancelled'))
        .map((r) => JSON.parse(r.body))
        .filter((m) => m.method === 'notifications/cancelled'),
    resumes: () => up.requests.filter((r) => r.method === 'GET' && r.headers['last-event-id'] !== undefined),
    gate: null,
    started: new Promise<void>((r) => (markStarted = r)),
    close: async () => {},
  };
  const newServer = () => {
    const server = new McpServer({ name: 'tickets', version: '1.0.0' });
    server.registerTool('create_ticket', { description: 'Creates a ticket', inputSchema: { title: z.string() } }, async ({ title }) => {
      markStarted();
      if (up.gate) await up.gate;
      up.tickets.push(title);
      return { content: [{ type: 'text', text: `T-${up.tickets.length}` }] };
    });
    server.registerTool('polling_ticket', { description: 'Creates a ticket, polled', inputSchema: { title: z.string() } }, async ({ title }, extra) => {
      markStarted();
      extra.closeSSEStream?.();
      if (up.gate) await up.gate;
      up.tickets.push(title);
      return { content: [{ type: 'text', text: `T-${up.tickets.length}` }] };
    });
    server.registerTool('find_ticket', { description: 'Looks a ticket up by title', inputSchema: { title: z.string() } }, async ({ title }) => {
      const n = up.tickets.filter((t) => t === title).length;
      return { content: [{ type: 'text', text: n > 0 ? 'found' : 'no such ticket' }], structuredContent: { found: n > 0, n } };
    });
    return server;
  };
  const http: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      up.requests.push({ method: req.method ?? '', headers: req.headers, body });
      void (async () => {
        const parsed = body === '' ? undefined : JSON.parse(body);
        const sid = req.headers['mcp-session-id'];
        let transport = typeof sid === 'string' ? sessions.get(sid) : undefined;
        if (transport === undefined && typeof sid !== 'string' && parsed?.method === 'initialize') {
          const t = new StreamableHTTPServerTransport({
            sessionIdGenerator: () => randomUUID(),
            eventStore: new InMemoryEventStore(),
            retryInterval: options.retryMs ?? 100,
            onsessioninitialized: (id) => void sessions.set(id, t),
          });
          t.onclose = () => t.sessionId && sessions.delete(t.sessionId);
          await newServer().connect(t);
          transport = t;
        }
        if (transport === undefined) {
          res
            .writeHead(404, { 'content-type': 'application/json' })
            .end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message: 'no session' } }));
          return;
        }
        await transport.handleRequest(req, res, parsed);
      })().catch((err) => {
        if (!res.headersSent) res.writeHead(500).end(String(err));
      });
    });
  });
  http.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((r) => http.listen(0, '127.0.0.1', () => r()));
  up.url = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
  up.close = async () => {
    for (const t of sessions.values()) await t.close().catch(() => {});
    const closed = new Promise<void>((r) => http.close(() => r()));
    for (const s of sockets) s.destroy();
    await closed;
  };
  return up;
}
