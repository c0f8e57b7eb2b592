import { join } from 'node:path';
import { createServer, connect as netConnect, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { parseConfig } from '../../src/config/load.js';
import { startGateway, type RunningGateway } from '../../src/entry/node.js';
import type { Forwarder } from '../../src/http/forward.js';
import type { Logger } from '../../src/http/logger.js';
import { MCP_META } from '../../src/protocol/mcp.js';
import { SqliteGatewayStore } from '../../src/store/sqlite/gateway-store.js';
import type { GatewayStore } from '../../src/store/types.js';
import { tempDir } from '../helpers/temp.js';

/** An mcp route in the config file's shape. */
export function mcpRoute(upstream: string, overrides: Record<string, unknown> = {}): Record<string, unknown> & { name: string } {
  return { name: 'tickets', protocol: 'mcp', match: { path: '/mcp' }, upstream, ...overrides };
}

export interface McpGateway {
  url: string;
  running: RunningGateway;
  sqlite: SqliteGatewayStore;
  /** Every log line (decision lines carry `tool`). */
  logs: Record<string, unknown>[];
  /** The decision lines of one route. */
  decisions(route?: string): { decision: string; tool?: string }[];
  close(): Promise<void>;
}

/** The gateway as `fencegate serve` runs it (Node listener, undici unless `forwarder`), on a fresh SQLite file. */
export async function startMcpGateway(
  routes: Record<string, unknown>[],
  options: { forwarder?: Forwarder; logger?: Logger; config?: Record<string, unknown>; wrapStore?: (store: GatewayStore) => GatewayStore } = {},
): Promise<McpGateway> {
  const tmp = tempDir();
  const dbPath = join(tmp.dir, 'gateway.db');
  const config = parseConfig({ listen: { host: '127.0.0.1', port: 0 }, store: { sqlite: dbPath, synchronous: 'NORMAL' }, ...options.config, routes });
  const sqlite = new SqliteGatewayStore({ path: dbPath, synchronous: 'NORMAL' });
  const logs: Record<string, unknown>[] = [];
  const keep = (msg: string, fields?: Record<string, unknown>) => void logs.push({ msg, ...fields });
  const logger: Logger = options.logger ?? { info: keep, warn: keep, error: keep };
  const running = await startGateway({
    config,
    store: options.wrapStore ? options.wrapStore(sqlite) : sqlite,
    logger,
    env: {},
    ...(options.forwarder ? { forwarder: options.forwarder } : {}),
  });
  return {
    url: running.url,
    running,
    sqlite,
    logs,
    decisions: (route = 'tickets') => logs.filter((l) => l.msg === 'decision' && l.route === route) as { decision: string; tool?: string }[],
    async close() {
      await running.close();
      await sqlite.close().catch(() => {});
      tmp.cleanup();
    },
  };
}

export interface McpCaller {
  client: Client;
  transport: StreamableHTTPClientTransport;
  close(): Promise<void>;
}

/** The SDK's client over Streamable HTTP to `url` (a gateway's `/mcp`, or the server itself). */
export async function connectClient(url: string, options: { headers?: Record<string, string>; fetch?: typeof fetch } = {}): Promise<McpCaller> {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: options.headers ?? {} },
    ...(options.fetch ? { fetch: options.fetch } : {}),
    reconnectionOptions: { maxRetries: 0, initialReconnectionDelay: 1000, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1 },
  });
  const client = new Client({ name: 'agent', version: '1.0.0' });
  await client.connect(transport);
  return { client, transport, close: () => client.close().catch(() => {}) };
}

/** The three `_meta` fields of the contract. */
export function fenced(fence: number | string, entity: string, key: string): Record<string, string> {
  return { [MCP_META.fence]: String(fence), [MCP_META.entity]: entity, [MCP_META.idempotencyKey]: key };
}

/** The text of a tool result's first content item. */
export function textOf(result: unknown): string {
  return (result as { content: { text: string }[] }).content[0]!.text;
}

/**
 * A TCP relay between the client and the gateway, whose connections a test
 * cuts (`cutAll`) to play a network failure after the request went out.
 */
export interface CutProxy {
  url: string;
  cutAll(): void;
  close(): Promise<void>;
}

export async function startCutProxy(target: string): Promise<CutProxy> {
  const { hostname, port } = new URL(target);
  const pairs = new Set<[Socket, Socket]>();
  const server: Server = createServer((client) => {
    const upstream = netConnect(Number(port), hostname);
    const pair: [Socket, Socket] = [client, upstream];
    pairs.add(pair);
    client.pipe(upstream);
    upstream.pipe(client);
    const drop = () => {
      pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on('error', drop).on('close', drop);
    upstream.on('error', drop).on('close', drop);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const cutAll = () => {
    for (const [a, b] of pairs) {
      a.destroy();
      b.destroy();
    }
    pairs.clear();
  };
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    cutAll,
    async close() {
      cutAll();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/** A POST of raw JSON-RPC to `url`, with the headers an MCP client sends. */
export function rawPost(url: string, body: string, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers }, body });
}
