import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { command, paymentsRoute, recordRows, startTestGateway } from '../helpers/gateway.js';

// Review finding: on a route with both asyncReply and reconcile, the interim
// 202 shields a pending command from the status query only while the interim
// answer's time (asyncReply.maxAge, the record's expires_at) lasts. After it,
// a retry's inline reconcile asks the status path, whose "not found" (the job
// is still running) releases the record (the release statement does not look
// at the kept interim) and the command is sent a second time.

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

async function upstream() {
  const up = { url: '', commands: 0 };
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      if (req.method === 'POST') {
        const job = ++up.commands;
        res.writeHead(202, { location: `/jobs/${job}`, 'content-type': 'application/json' });
        return res.end(JSON.stringify({ job, state: 'accepted' }));
      }
      if (req.method === 'GET' && req.url?.startsWith('/jobs/')) {
        res.writeHead(202, { location: req.url });
        return res.end('{"state":"running"}');
      }
      // The status path: the job has not produced a payment yet.
      res.writeHead(404);
      res.end();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  up.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  closers.push(() => new Promise<void>((r) => server.close(() => r())));
  return up;
}

describe('review: asyncReply + reconcile once the interim answer expired', () => {
  it('a job still running is never sent twice', async () => {
    const up = await upstream();
    const gw = await startTestGateway({
      routes: [
        paymentsRoute(up.url, {
          mode: 'concurrent',
          timeoutMs: 200,
          lockMarginMs: 100,
          maxWaitMs: 2_000,
          asyncReply: { interval: '1h', maxInterval: '1h', maxAge: '1s' },
          reconcile: { path: '/status?key={key}', settleTime: '0s', interval: '1h' },
        }),
      ],
      config: { sweepInterval: '1h' },
    });
    closers.push(() => gw.close());
    const send = () => command(gw.url, '/payments/job', { fence: 1, entity: 'e1', key: 'job-x' });
    expect((await send()).status).toBe(202);
    expect((await send()).status).toBe(202);
    await new Promise((r) => setTimeout(r, 1_300));
    const late = await send();
    await late.text();
    expect(recordRows(gw.sqlite, 'job-x').length).toBe(1);
    expect(up.commands).toBe(1);
  });
});
