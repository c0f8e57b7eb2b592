// The peer: express + express-idempotency (an idempotency middleware from
// npm, in-memory store) in front of the same upstream, proxying with undici.
// It does less than fencegate: no fencing, no per-entity order, no durable store.
import express from 'express';
import idempotency from 'express-idempotency';
import { Agent, request } from 'undici';

const upstream = process.env.UPSTREAM;
const agent = new Agent({ connections: 256, keepAliveTimeout: 4_000 });
const app = express();
app.use(express.raw({ type: '*/*', limit: '1mb' }));
app.use(idempotency.idempotency());
app.all('*', async (req, res) => {
  if (idempotency.getSharedIdempotencyService().isHit(req)) return; // replayed by the middleware
  const headers = { ...req.headers };
  delete headers.host;
  delete headers.connection;
  delete headers['content-length'];
  const r = await request(upstream + req.originalUrl, {
    method: req.method,
    headers,
    body: Buffer.isBuffer(req.body) ? req.body : undefined,
    dispatcher: agent,
  });
  const out = Buffer.from(await r.body.arrayBuffer());
  res
    .status(r.statusCode)
    .type(String(r.headers['content-type'] ?? 'application/json'))
    .send(out);
});
const server = app.listen(0, '127.0.0.1', () => console.log(JSON.stringify({ port: server.address().port })));
server.keepAliveTimeout = 60_000;
