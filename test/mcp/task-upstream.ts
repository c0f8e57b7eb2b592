import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { InMemoryTaskMessageQueue, InMemoryTaskStore } from '@modelcontextprotocol/sdk/experimental/tasks/stores/in-memory.js';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';
import { mcpRoute } from './harness.js';

/**
 * A real MCP server (the SDK's McpServer, stateful Streamable HTTP) with
 * task support (MCP 2025-11-25) and a status tool, the upstream of the task
 * and reconcile tests. Its tools:
 * - `charge` (a task tool: `registerToolTask`): each call is one more charge
 *   (`executions`); the task ends when `release()` is called (or at once
 *   when `autoComplete`).
 * - `pay` (a plain tool): charges `arguments.ref` (one more in `paid`), then
 *   waits for `payGate` when set (so a gateway's timeout cuts the answer
 *   after the charge).
 * - `get_payment` (the status tool): `{ found: true, ref, n }` as
 *   structuredContent when `ref` was paid and `lagging` is false, else
 *   `{ found: false }`.
 * It records every HTTP request's body.
 */
export interface TaskUpstream {
  url: string;
  executions: number;
  /** Ends the oldest running charge task with its result. */
  release(): void;
  running(): number;
  autoComplete: boolean;
  paid: string[];
  payGate: Promise<void> | null;
  /** `pay` waits for this before it charges (a call that times out at the gateway without being performed). */
  payBefore: Promise<void> | null;
  lagging: boolean;
  requests: { method: string; body: string; session: string | undefined }[];
  /** JSON-RPC methods that reached the server, in order. */
  methods(): string[];
  close(): Promise<void>;
}

export async function startTaskUpstream(options: { json: boolean; stateless?: boolean } = { json: true }): Promise<TaskUpstream> {
  const sessions = new Map<string, StreamableHTTPServerTransport>();
  const sockets = new Set<Socket>();
  const taskStore = new InMemoryTaskStore();
  const waiting: (() => void)[] = [];
  const up: TaskUpstream = {
    url: '',
    executions: 0,
    release: () => waiting.shift()?.(),
    running: () => waiting.length,
    autoComplete: false,
    paid: [],
    payGate: null,
    payBefore: null,
    lagging: false,
    requests: [],
    methods: () =>
      up.requests
        .filter((r) => r.method === 'POST' && r.body !== '')
        .map((r) => JSON.parse(r.body))
        .filter((m) => !Array.isArray(m) && typeof m.method === 'string')
        .map((m) => m.method as string),
    close: async () => {},
  };

  const newServer = () => {
    const server = new McpServer(
      { name: 'payments', version: '1.0.0' },
      { capabilities: { tasks: { requests: { tools: { call: {} } } } }, taskStore, taskMessageQueue: new InMemoryTaskMessageQueue() },
    );
    server.experimental.tasks.registerToolTask(
      'charge',
      { description: 'Charges, as a task', inputSchema: { amount: z.number() } },
      {
        async createTask({ amount }, { taskStore: store, taskRequestedTtl }) {
          const task = await store.createTask({ ttl: taskRequestedTtl ?? 60_000, pollInterval: 50 });
          const n = ++up.executions;
          const finish = () =>
            void store.storeTaskResult(task.taskId, 'completed', { content: [{ type: 'text', text: `charged ${amount} (#${n})` }] }).catch(() => {});
          if (up.autoComplete) setTimeout(finish, 20);
          else waiting.push(finish);
          return { task };
        },
        getTask: async (_args, { taskId, taskStore: store }) => (await store.getTask(taskId))!,
        getTaskResult: async (_args, { taskId, taskStore: store }) => (await store.getTaskResult(taskId)) as never,
      },
    );
    server.registerTool('pay', { description: 'Pays', inputSchema: { ref: z.string(), amount: z.number() } }, async ({ ref, amount }) => {
      const before = up.payBefore;
      const gate = up.payGate;
      if (before) await before;
      up.paid.push(ref);
      if (gate) await gate;
      return { content: [{ type: 'text', text: `paid ${amount} as ${ref}` }], structuredContent: { ref, amount } };
    });
    server.registerTool('get_payment', { description: 'Looks a payment up', inputSchema: { ref: z.string() } }, async ({ ref }) => {
      const n = up.paid.filter((r) => r === ref).length;
      const found = n > 0 && !up.lagging;
      return {
        content: [{ type: 'text', text: found ? `payment ${ref}` : 'no such payment' }],
        structuredContent: found ? { found: true, ref, n } : { found: false },
      };
    });
    return server;
  };

  const handle = async (req: IncomingMessage, res: import('node:http').ServerResponse, body: string) => {
    const parsed = body === '' ? undefined : JSON.parse(body);
    if (options.stateless === true) {
      // No sessions: a server per request over the one task store, so any request can read any task.
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
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      const session = req.headers['mcp-session-id'];
      up.requests.push({ method: req.method ?? '', body, session: typeof session === 'string' ? session : undefined });
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
    while (waiting.length > 0) up.release();
    taskStore.cleanup();
    for (const t of sessions.values()) await t.close().catch(() => {});
    const closed = new Promise<void>((r) => http.close(() => r()));
    for (const s of sockets) s.destroy();
    await closed;
  };
  return up;
}

/**
 * An mcp route to a task upstream with `get_payment` read-only (the status
 * tool) and every other tool writing, with a short deadline (300 ms, a
 * 100 ms lock margin); `overrides` replace any of it.
 */
export function paymentRoute(upstream: string, overrides: Record<string, unknown> = {}): ReturnType<typeof mcpRoute> {
  return mcpRoute(upstream, { tools: { get_payment: { readOnly: true }, '*': { readOnly: false } }, timeoutMs: 300, lockMarginMs: 100, ...overrides });
}

/** `get_payment` as a route's MCP status query (DESIGN §3.12): the key is the ref, `found: false` is "not found". */
export const PAYMENT_RECONCILE = {
  tool: 'get_payment',
  arguments: { ref: '{key}' },
  notFound: { pointer: '/structuredContent/found', equals: false },
  interval: '200ms',
};
