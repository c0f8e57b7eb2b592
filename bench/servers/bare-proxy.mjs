// The floor of any Node proxy: node:http + undici, no framework, no
// decisions, no storage. What a second hop costs on this box, beside the
// control (the same with Hono). fencegate's Node server answers proxied
// requests this way too (src/entry/node-listener.ts), around its decisions.
import { createServer } from 'node:http';
import { Agent, request } from 'undici';

const upstream = process.env.UPSTREAM;
const agent = new Agent({ connections: 256, keepAliveTimeout: 4_000 });
const server = createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', async () => {
    const headers = { ...req.headers };
    delete headers.host;
    delete headers.connection;
    delete headers['content-length'];
    const r = await request(upstream + req.url, { method: req.method, headers, body: Buffer.concat(chunks), dispatcher: agent });
    const out = Buffer.from(await r.body.arrayBuffer());
    res.writeHead(r.statusCode, { 'content-type': String(r.headers['content-type'] ?? ''), 'content-length': out.length });
    res.end(out);
  });
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => console.log(JSON.stringify({ port: server.address().port })));
