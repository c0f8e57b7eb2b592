// A small fake payments API for the quick start and the worker example. It
// is deliberately NOT idempotent: every POST creates a new charge or
// receipt, so a duplicate would show.
//   POST /payments/charges   {"amount": 1200}  → 201 {"id": "ch_1", …}
//        … "customer": "cus_declined"           → 402 {"error": "card_declined"} (a retry cannot help)
//        … "customer": "cus_flaky"              → 503 the first time per key, then 201 (a retry can)
//   POST /payments/receipts  {"charge": "ch_1", "orderId": "o-1"} → 201 {"id": "rc_1", …}; 404 for an unknown charge
//   GET  /charges, /receipts                    → everything it made
//   GET  /declines                              → every declined attempt
import { createServer } from 'node:http';

export function startDemoUpstream({ port = 9000, host = '127.0.0.1' } = {}) {
  const charges = [];
  const receipts = [];
  const declines = [];
  const flaky = new Set();
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const send = (status, body) => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(JSON.stringify(body));
      };
      if (req.method === 'GET' && req.url === '/charges') return send(200, { charges });
      if (req.method === 'GET' && req.url === '/receipts') return send(200, { receipts });
      if (req.method === 'GET' && req.url === '/declines') return send(200, { declines });
      if (req.method === 'POST' && req.url?.startsWith('/payments/')) {
        let body = {};
        try {
          body = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
        } catch {
          return send(400, { error: 'body must be JSON' });
        }
        const key = req.headers['idempotency-key'] ?? null;
        if (req.url === '/payments/receipts') {
          if (!charges.some((c) => c.id === body.charge)) return send(404, { error: 'no such charge' });
          const receipt = { id: `rc_${receipts.length + 1}`, charge: body.charge, order_id: body.orderId ?? null, idempotency_key: key };
          receipts.push(receipt);
          return send(201, receipt);
        }
        if (body.customer === 'cus_declined') {
          declines.push({ customer: body.customer, idempotency_key: key });
          return send(402, { error: 'card_declined' });
        }
        if (body.customer === 'cus_flaky' && !flaky.has(key)) {
          flaky.add(key);
          return send(503, { error: 'try again' });
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
  return new Promise((resolve, reject) => {
    // A port already taken rejects, for the caller to say so in one line.
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve(server);
    });
  });
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const port = Number(process.env.PORT ?? 9000);
  await startDemoUpstream({ port });
  console.log(JSON.stringify({ msg: 'demo-upstream listening', url: `http://127.0.0.1:${port}` }));
}
