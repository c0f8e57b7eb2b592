import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { command, paymentsRoute, recordRows, startTestGateway } from '../helpers/gateway.js';

// On a route with both asyncReply and reconcile, a command accepted upstream
// (an interim 202) is never released by a status query's "not found", also
// once its interim answer is past its time (asyncReply.maxAge): the job may
// still be running, and a release would send the command again (DESIGN
// §3.12; the release statements skip a record that kept an interim answer).

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

describe('asyncReply + reconcile once the interim answer expired (never released: the command was accepted upstream)', () => {
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
