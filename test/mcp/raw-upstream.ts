import { createServer, request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { gzipSync } from 'node:zlib';

// Loopback HTTP servers whose answers a test sets byte for byte (what an
// SDK server never sends: gzip it was not asked for, a proxy's 408, a GET
// stream that never ends), and a raw client (a GET with a body, which fetch
// refuses to send).

export interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  body: string;
}
export type Handler = (req: IncomingMessage, res: ServerResponse, body: string) => void | Promise<void>;

export interface RawUpstream {
  url: string;
  /** Every request that reached it, its body read whole. */
  seen: Seen[];
  handler: Handler;
  close(): Promise<void>;
}

export async function rawUpstream(handler: Handler): Promise<RawUpstream> {
  const sockets = new Set<Socket>();
  const up: RawUpstream = { url: '', seen: [], handler, close: async () => {} };
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      up.seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body });
      Promise.resolve(up.handler(req, res, body)).catch((e) => {
        if (!res.headersSent) res.writeHead(500).end(String(e));
      });
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  up.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  up.close = async () => {
    for (const s of sockets) s.destroy();
    await new Promise<void>((r) => server.close(() => r()));
  };
  return up;
}

/**
 * A compression middleware in front of `target` (as many deployments put
 * one before an MCP server): relays each request and gzips the answer when
 * the request's Accept-Encoding offers gzip, or always with `force`.
 */
export async function gzipRelay(target: string, options: { force?: boolean } = {}): Promise<RawUpstream & { gzipped: () => number }> {
  let gzipped = 0;
  const { hostname, port } = new URL(target);
  const relay = await rawUpstream((req, res, body) => {
    const headers = { ...req.headers, host: `${hostname}:${port}` };
    delete headers['accept-encoding'];
    const out = httpRequest({ host: hostname, port, path: req.url, method: req.method, headers }, (answer) => {
      // The server's GET stream never ends: relayed as it comes, never compressed.
      if (String(answer.headers['content-type']).startsWith('text/event-stream') && !options.force) {
        res.writeHead(answer.statusCode ?? 500, answer.headers).flushHeaders();
        answer.pipe(res);
        return;
      }
      const chunks: Buffer[] = [];
      answer.on('data', (c: Buffer) => chunks.push(c));
      answer.on('end', () => {
        const plain = Buffer.concat(chunks);
        const respHeaders = { ...answer.headers };
        delete respHeaders['content-length'];
        delete respHeaders['transfer-encoding'];
        if (options.force || String(req.headers['accept-encoding'] ?? '').includes('gzip')) {
          gzipped++;
          res.writeHead(answer.statusCode ?? 500, { ...respHeaders, 'content-encoding': 'gzip' }).end(gzipSync(plain));
        } else {
          res.writeHead(answer.statusCode ?? 500, respHeaders).end(plain);
        }
      });
    });
    out.on('error', () => res.destroy());
    out.end(body);
  });
  return Object.assign(relay, { gzipped: () => gzipped });
}

export interface RawAnswer {
  status: number;
  headers: IncomingMessage['headers'];
  body: Buffer;
  text: string;
}

/** A raw HTTP/1.1 request: any method with any body. */
export function rawRequest(url: string, method: string, body: string, headers: Record<string, string> = {}): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const req = httpRequest(
      {
        host: u.hostname,
        port: u.port,
        path: u.pathname + u.search,
        method,
        headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'content-length': Buffer.byteLength(body), ...headers },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const all = Buffer.concat(chunks);
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: all, text: all.toString('utf8') });
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

/** A `tools/call` message. */
export const toolCall = (id: number | string, name: string, args: unknown, meta: Record<string, unknown> = {}) =>
  JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args, _meta: meta } });

/** A handler that answers every tools/call with a result naming the run, the path and the arguments. */
export function echoTool(): { handler: Handler; runs: () => number } {
  let runs = 0;
  return {
    runs: () => runs,
    handler: (req, res, body) => {
      const m = JSON.parse(body);
      runs++;
      res
        .writeHead(200, { 'content-type': 'application/json' })
        .end(JSON.stringify({ jsonrpc: '2.0', id: m.id, result: { content: [{ type: 'text', text: `run ${runs} at ${req.url}` }] } }));
    },
  };
}
