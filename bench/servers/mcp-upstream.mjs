// The MCP server of `npm run bench:mcp`: the SDK's McpServer behind its
// StreamableHTTPServerTransport, stateless, answering JSON (one server and
// transport per request, as the SDK's stateless examples do). One tool,
// `create_ticket`, that does no I/O: what is measured is the protocol path.
import { createServer } from 'node:http';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';

let tickets = 0;
function newServer() {
  const server = new McpServer({ name: 'bench-tickets', version: '1.0.0' });
  server.registerTool('create_ticket', { description: 'Creates a ticket', inputSchema: { title: z.string() } }, async ({ title }) => ({
    content: [{ type: 'text', text: JSON.stringify({ id: `T-${++tickets}`, title }) }],
  }));
  return server;
}

const http = createServer(async (req, res) => {
  if (req.url === '/_fencegate/health') return res.end('ok');
  const chunks = [];
  for await (const c of req) chunks.push(c);
  const text = Buffer.concat(chunks).toString('utf8');
  const server = newServer();
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
  res.on('close', () => {
    void transport.close();
    void server.close();
  });
  await server.connect(transport);
  await transport.handleRequest(req, res, text.length > 0 ? JSON.parse(text) : undefined);
});
http.keepAliveTimeout = 60_000;
http.listen(Number(process.env.PORT ?? 0), '127.0.0.1', () => console.log(JSON.stringify({ port: http.address().port })));
