/**
 * A real MCP server (the SDK's McpServer behind its StreamableHTTPServerTransport,
 * stateless, JSON answers) on loopback, with a deliberately NOT idempotent
 * `create_ticket`: every call that reaches it is one more ticket. In front of
 * it sits a tiny test-only fencing check, the one rule the gateway's MCP
 * route applies (docs/mcp.md): a `tools/call` whose `_meta` fence is below
 * the highest seen for its entity is answered with JSON-RPC error -32001
 * (`data.type: stale-fence`) and never reaches the tool. `fencing: false`
 * switches it off, for negative controls.
 */
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';

export interface ToolArrival {
  tool: string;
  meta: Record<string, unknown>;
  arguments: Record<string, unknown>;
}

export interface Refusal {
  entity: string;
  presented: number;
  current: number;
  key: unknown;
}

export interface TicketServer {
  url: string;
  /** Calls that reached a tool, in order. */
  arrivals: ToolArrival[];
  /** The member names of every tools/call's `params` as the server received them (the SDK's parsing drops unknown ones). */
  paramNames: string[][];
  tickets: { id: string; title: string; fence: unknown; key: unknown }[];
  refusals: Refusal[];
  /** Switches the fencing check off (negative controls) or on. */
  fencing: boolean;
  /** Answers the next `tools/call` with this JSON-RPC error instead (once). */
  failNext(error: { code: number; message: string; data?: unknown }): void;
  /** Holds every tools/call until the returned function is called. */
  hold(): () => void;
  close(): Promise<void>;
}

async function readJson(req: IncomingMessage): Promise<any> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  const text = Buffer.concat(chunks).toString('utf8');
  return text === '' ? undefined : JSON.parse(text);
}

export async function startTicketServer(): Promise<TicketServer> {
  const arrivals: ToolArrival[] = [];
  const paramNames: string[][] = [];
  const tickets: TicketServer['tickets'] = [];
  const refusals: Refusal[] = [];
  const highest = new Map<string, number>();
  let nextError: { code: number; message: string; data?: unknown } | undefined;
  let held: Promise<void> | undefined;

  const state = {
    fencing: true,
  };

  const http: Server = createServer(async (req, res) => {
    const body = await readJson(req);
    if (body?.method === 'tools/call') {
      paramNames.push(Object.keys(body.params ?? {}));
      if (held) await held;
      const meta = (body.params?._meta ?? {}) as Record<string, unknown>;
      const reply = (error: { code: number; message: string; data?: unknown }, refusal?: string) => {
        res.writeHead(200, { 'content-type': 'application/json', ...(refusal ? { 'x-fencegate-refusal': refusal } : {}) });
        res.end(JSON.stringify({ jsonrpc: '2.0', id: body.id, error }));
      };
      if (nextError) {
        const e = nextError;
        nextError = undefined;
        return reply(e);
      }
      if (state.fencing) {
        const entity = String(meta['io.fencegate/entity']);
        const fence = Number(meta['io.fencegate/fence']);
        const current = highest.get(entity) ?? 0;
        if (!(fence >= current)) {
          refusals.push({ entity, presented: fence, current, key: meta['io.fencegate/idempotency-key'] });
          return reply(
            {
              code: -32001,
              message: `stale-fence: the fence ${fence} is below the entity's current fence ${current}`,
              data: { type: 'stale-fence', title: 'Stale execution fence', status: 409, entity, presented_fence: fence, current_fence: current },
            },
            'stale-fence',
          );
        }
        highest.set(entity, fence);
      }
    }
    const server = new McpServer({ name: 'tickets', version: '1.0.0' });
    server.registerTool('create_ticket', { description: 'Opens a ticket (not idempotent)', inputSchema: { title: z.string() } }, async ({ title }, extra) => {
      const meta = (extra._meta ?? {}) as Record<string, unknown>;
      arrivals.push({ tool: 'create_ticket', meta, arguments: { title } });
      const ticket = { id: `T-${tickets.length + 1}`, title, fence: meta['io.fencegate/fence'], key: meta['io.fencegate/idempotency-key'] };
      tickets.push(ticket);
      return { content: [{ type: 'text', text: ticket.id }], structuredContent: { id: ticket.id } };
    });
    // docs/mcp.md's example tool: its route reads the entity from /arguments/invoice_id.
    server.registerTool(
      'refund_payment',
      { description: 'Refunds an invoice (not idempotent)', inputSchema: { invoice_id: z.string(), amount: z.number() } },
      async (args, extra) => {
        arrivals.push({ tool: 'refund_payment', meta: (extra._meta ?? {}) as Record<string, unknown>, arguments: args });
        return { content: [{ type: 'text', text: `refunded ${args.invoice_id}` }], structuredContent: { refunded: args.invoice_id } };
      },
    );
    server.registerTool('search_tickets', { description: 'Read-only', inputSchema: { q: z.string() } }, async ({ q }, extra) => {
      arrivals.push({ tool: 'search_tickets', meta: (extra._meta ?? {}) as Record<string, unknown>, arguments: { q } });
      return { content: [{ type: 'text', text: JSON.stringify(tickets.filter((t) => t.title.includes(q)).map((t) => t.id)) }] };
    });
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    res.on('close', () => {
      void transport.close();
      void server.close();
    });
    await server.connect(transport);
    await transport.handleRequest(req, res, body);
  });
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(http.address() as AddressInfo).port}/mcp`;
  return {
    url,
    arrivals,
    paramNames,
    tickets,
    refusals,
    get fencing() {
      return state.fencing;
    },
    set fencing(on: boolean) {
      state.fencing = on;
    },
    failNext(error) {
      nextError = error;
    },
    hold() {
      let release!: () => void;
      held = new Promise<void>((resolve) => (release = resolve));
      return () => {
        held = undefined;
        release();
      };
    },
    async close() {
      http.closeAllConnections();
      await new Promise((resolve) => http.close(resolve));
    },
  };
}

/** A real SDK client connected to `url`. */
export async function connectClient(url: string): Promise<Client> {
  const client = new Client({ name: 'fencegate-test', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  return client;
}
