// The control: a stateless Hono + undici reverse proxy, the issue's
// reference, without any decisions or storage. (fencegate's Hono app runs on
// this stack; its Node server answers proxied requests without Hono's
// Request/Response, src/entry/node-listener.ts.)
import { createAdaptorServer } from '@hono/node-server';
import { Hono } from 'hono';
import { Agent, request } from 'undici';

const upstream = process.env.UPSTREAM;
const agent = new Agent({ connections: 256, keepAliveTimeout: 4_000 });
const app = new Hono();
app.all('*', async (c) => {
  const url = new URL(c.req.url);
  const body = new Uint8Array(await c.req.arrayBuffer());
  const headers = {};
  c.req.raw.headers.forEach((v, k) => {
    if (k !== 'host' && k !== 'connection' && k !== 'content-length') headers[k] = v;
  });
  const res = await request(upstream + url.pathname + url.search, { method: c.req.method, headers, body, dispatcher: agent });
  const out = new Uint8Array(await res.body.arrayBuffer());
  return new Response(out, { status: res.statusCode, headers: { 'content-type': String(res.headers['content-type'] ?? '') } });
});
const server = createAdaptorServer({ fetch: app.fetch });
server.listen(0, '127.0.0.1', () => console.log(JSON.stringify({ port: server.address().port })));
// An exit on SIGTERM (not death by it), so that `node --cpu-prof` writes its profile.
process.on('SIGTERM', () => process.exit(0));
