/**
 * A real MCP server (the SDK's McpServer, stateless Streamable HTTP with
 * JSON answers) as a PROCESS, so that a test can SIGKILL it after it
 * performed a call and start it again on the same port. Its tools:
 * - `pay` — NOT idempotent: every execution appends `ref` to the paid file
 *   (before it answers, so a kill loses no record) and prints
 *   {"type":"paid","ref":…}; with `hold`, it then never answers.
 * - `get_payment` — the status tool: `{ found: true, ref, n }` as
 *   structuredContent when `ref` is in the paid file, else `{ found: false }`.
 *
 *   node --import <ts loader> mcp-server-child.ts '{"paidFile":"…","port":N,"hold":true}'
 *
 * Prints {"type":"listening","url":…}.
 */
import { appendFileSync, existsSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';

const { paidFile, port, hold } = JSON.parse(process.argv[2] ?? '{}') as { paidFile: string; port?: number; hold?: boolean };
const paid = (): string[] => (existsSync(paidFile) ? readFileSync(paidFile, 'utf8').split('\n').filter(Boolean) : []);

const newServer = () => {
  const server = new McpServer({ name: 'payments', version: '1.0.0' });
  server.registerTool('pay', { description: 'Pays', inputSchema: { ref: z.string(), amount: z.number() } }, async ({ ref, amount }) => {
    appendFileSync(paidFile, `${ref}\n`);
    process.stdout.write(`${JSON.stringify({ type: 'paid', ref })}\n`);
    if (hold) await new Promise(() => {});
    return { content: [{ type: 'text', text: `paid ${amount} as ${ref}` }], structuredContent: { ref, amount } };
  });
  server.registerTool('get_payment', { description: 'Looks a payment up', inputSchema: { ref: z.string() } }, async ({ ref }) => {
    const n = paid().filter((r) => r === ref).length;
    return {
      content: [{ type: 'text', text: n > 0 ? `payment ${ref}` : 'no such payment' }],
      structuredContent: n > 0 ? { found: true, ref, n } : { found: false },
    };
  });
  return server;
};

const http = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks).toString('utf8');
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    const server = newServer();
    res.on('close', () => void transport.close().then(() => server.close()));
    server
      .connect(transport)
      .then(() => transport.handleRequest(req, res, body === '' ? undefined : JSON.parse(body)))
      .catch((err) => {
        if (!res.headersSent) res.writeHead(500).end(String(err));
      });
  });
});
http.listen(port ?? 0, '127.0.0.1', () => {
  const { port: bound } = http.address() as { port: number };
  process.stdout.write(`${JSON.stringify({ type: 'listening', url: `http://127.0.0.1:${bound}` })}\n`);
});
