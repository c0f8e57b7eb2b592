import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';

/**
 * A real MCP server (the SDK's McpServer behind its StreamableHTTPServerTransport)
 * on loopback, the upstream of the mcp route tests. Its tools:
 * - `create_ticket` — NOT idempotent: every execution is one more ticket.
 * - `search_tickets` — `readOnlyHint: true`.
 * - `slow_report` — sends progress notifications; waits for `gate` (when set) after the first.
 * - `failing_tool` — runs (one more execution) and answers `isError: true`.
 * It records every HTTP request's raw body and every byte it wrote back, so
 * that a test can say what reached the server and compare answers byte for byte.
 */
export interface McpUpstream {
  url: string;
  /** Tickets created, in order: `T-1`, `T-2`, … */
  tickets: { id: string; title: string }[];
  failures: number;
  /** Every HTTP request that reached the server. */
  requests: { method: string; headers: IncomingMessage['headers']; body: string; response: () => string; status: () => number }[];
  /** tools/call messages that reached the server, per tool name. */
  callsOf(tool: string): unknown[];
  /** Called inside create_ticket after the ticket exists, before the answer is sent. */
  onRan: (() => void | Promise<void>) | null;
  /** slow_report waits for this after its first progress notification. */
  gate: Promise<void> | null;
  close(): Promise<void>;
}

export async function startMcpUpstream(options: { stateful: boolean; json: boolean }): Promise<McpUpstream> {
  const sessions = new Map<string, StreamableHTTPServerTransport>();
  const sockets = new Set<Socket>();
  const up: McpUpstream = {
    url: '',
    tickets: [],
    failures: 0,
    requests: [],
    callsOf: (tool) =>
      up.requests
        .filter((r) => r.method === 'POST')
        .map((r) => JSON.parse(r.body))
        .filter((m) => !Array.isArray(m) && m.method === 'tools/call' && m.params?.name === tool),
    onRan: null,
    gate: null,
    close: async () => {},
  };

  const newServer = () => {
    const server = new McpServer({ name: 'tickets', version: '1.0.0' });
    server.registerTool('create_ticket', { description: 'Creates a ticket', inputSchema: { title: z.string() } }, async ({ title }) => {
      const ticket = { id: `T-${up.tickets.length + 1}`, title };
      up.tickets.push(ticket);
      await up.onRan?.();
      return { content: [{ type: 'text', text: JSON.stringify(ticket) }] };
    });
    server.registerTool(
      'search_tickets',
      { description: 'Searches tickets', inputSchema: { q: z.string() }, annotations: { readOnlyHint: true } },
      async ({ q }) => ({ content: [{ type: 'text', text: JSON.stringify(up.tickets.filter((t) => t.title.includes(q))) }] }),
    );
    server.registerTool('slow_report', { description: 'A report with progress', inputSchema: { steps: z.number() } }, async ({ steps }, extra) => {
      const token = extra._meta?.progressToken;
      for (let i = 1; i <= steps; i++) {
        if (token !== undefined)
          await extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress: i, total: steps } });
        if (i === 1 && up.gate) await up.gate;
      }
      return { content: [{ type: 'text', text: `report of ${steps} steps` }] };
    });
    server.registerTool('failing_tool', { description: 'Runs, then reports an error', inputSchema: { n: z.number() } }, async () => {
      up.failures++;
      return { content: [{ type: 'text', text: `failure ${up.failures}` }], isError: true };
    });
    return server;
  };

  const handle = async (req: IncomingMessage, res: ServerResponse, body: string) => {
    const parsed = body === '' ? undefined : JSON.parse(body);
    if (!options.stateful) {
      const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: options.json });
      const server = newServer();
      res.on('close', () => void transport.close().then(() => server.close()));
      await server.connect(transport);
      return transport.handleRequest(req, res, parsed);
    }
    const sid = req.headers['mcp-session-id'];
    let transport = typeof sid === 'string' ? sessions.get(sid) : undefined;
    if (transport === undefined && typeof sid !== 'string' && parsed?.method === 'initialize') {
      const t = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        enableJsonResponse: options.json,
        onsessioninitialized: (id) => void sessions.set(id, t),
      });
      t.onclose = () => t.sessionId && sessions.delete(t.sessionId);
      await newServer().connect(t);
      transport = t;
    }
    if (transport === undefined) {
      res
        .writeHead(typeof sid === 'string' ? 404 : 400, { 'content-type': 'application/json' })
        .end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message: 'no session' } }));
      return;
    }
    return transport.handleRequest(req, res, parsed);
  };

  const http: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    const written: Buffer[] = [];
    const write = res.write.bind(res) as (...a: unknown[]) => boolean;
    const end = res.end.bind(res) as (...a: unknown[]) => ServerResponse;
    res.write = ((chunk: unknown, ...rest: unknown[]) => {
      if (chunk !== undefined && typeof chunk !== 'function') written.push(Buffer.from(chunk as string));
      return write(chunk, ...rest);
    }) as typeof res.write;
    res.end = ((chunk: unknown, ...rest: unknown[]) => {
      if (chunk !== undefined && chunk !== null && typeof chunk !== 'function') written.push(Buffer.from(chunk as string));
      return end(chunk, ...rest);
    }) as typeof res.end;
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      up.requests.push({
        method: req.method ?? '',
        headers: req.headers,
        body,
        response: () => Buffer.concat(written).toString('utf8'),
        status: () => res.statusCode,
      });
      handle(req, res, body).catch((err) => {
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
