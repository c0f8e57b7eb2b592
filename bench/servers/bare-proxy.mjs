// The floor of any Node proxy: node:http + undici, no framework, no
// decisions, no storage. What a second hop costs on this box, beside the
// control (the same with Hono). fencegate's Node server answers proxied
// requests this way too (src/entry/node-listener.ts), around its decisions,
// and forwards with undici's dispatch and a handler that collects the
// answer (src/http/forward-undici.ts), as this floor does.
import { createServer } from 'node:http';
import { Agent } from 'undici';

const upstream = new URL(process.env.UPSTREAM);
const agent = new Agent({ connections: 256, keepAliveTimeout: 4_000 });

function forward(method, path, headers, body) {
  return new Promise((resolve, reject) => {
    let status = 0;
    let type = '';
    const chunks = [];
    agent.dispatch(
      { origin: upstream.origin, path, method, headers, body },
      {
        onRequestStart() {},
        onResponseStart(_c, statusCode, h) {
          status = statusCode;
          type = String(h['content-type'] ?? '');
        },
        onResponseData(_c, chunk) {
          chunks.push(chunk);
        },
        onResponseEnd() {
          resolve({ status, type, body: Buffer.concat(chunks) });
        },
        onResponseError(_c, err) {
          reject(err);
        },
      },
    );
  });
}

const server = createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', async () => {
    const headers = { ...req.headers };
    delete headers.host;
    delete headers.connection;
    delete headers['content-length'];
    try {
      const r = await forward(req.method, req.url, headers, Buffer.concat(chunks));
      res.writeHead(r.status, { 'content-type': r.type, 'content-length': r.body.length });
      res.end(r.body);
    } catch {
      res.writeHead(502).end();
    }
  });
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => console.log(JSON.stringify({ port: server.address().port })));
// An exit on SIGTERM (not death by it), so that `node --cpu-prof` writes its profile.
process.on('SIGTERM', () => process.exit(0));
