// A small fake payments API for the quick start. It is deliberately NOT
// idempotent: every POST creates a new charge, so a duplicate would show.
//   POST /payments/charges   {"amount": 1200}  → 201 {"id": "ch_1", …}
//   GET  /charges                               → every charge it made
import { createServer } from 'node:http';

export function startDemoUpstream({ port = 9000, host = '127.0.0.1' } = {}) {
  const charges = [];
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const send = (status, body) => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(JSON.stringify(body));
      };
      if (req.method === 'GET' && req.url === '/charges') return send(200, { charges });
      if (req.method === 'POST' && req.url?.startsWith('/payments/')) {
        let body = {};
        try {
          body = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
        } catch {
          return send(400, { error: 'body must be JSON' });
        }
        const charge = {
          id: `ch_${charges.length + 1}`,
          amount: body.amount ?? null,
          entity: req.headers['x-fence-entity'] ?? null,
          fence: req.headers['x-execution-fence'] ?? null,
          idempotency_key: req.headers['idempotency-key'] ?? null,
        };
        charges.push(charge);
        return send(201, charge);
      }
      send(404, { error: 'not found' });
    });
  });
  return new Promise((resolve) => server.listen(port, host, () => resolve(server)));
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const port = Number(process.env.PORT ?? 9000);
  await startDemoUpstream({ port });
  console.log(JSON.stringify({ msg: 'demo-upstream listening', url: `http://127.0.0.1:${port}` }));
}
