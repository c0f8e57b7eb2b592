/**
 * vitest globalSetup for the workerd reconcile tests (runs in Node): a
 * payment provider on 127.0.0.1 that does NOT deduplicate by
 * Idempotency-Key (each POST it performs is one more charge), with a status
 * endpoint that finds a charge by its key (DESIGN §3.12), and a control
 * server on another port that steers it:
 *
 *   POST …/charges                  performs a charge for its Idempotency-Key, answers 201
 *   GET  …/charges/by-key/<key>     200 with the charge, or 404
 *   control POST /down              the provider stops listening and drops its connections:
 *                                   every call is refused (an outage)
 *   control POST /lose              the provider performs each POST, then drops the
 *                                   connection before answering (it went down mid-answer)
 *   control POST /up                back on the same port, answering normally
 *   control GET  /state?key=<key>   { charges, statusCalls } for that key
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import type { TestProject } from 'vitest/node';

export async function setup(project: TestProject): Promise<() => Promise<void>> {
  const charges = new Map<string, string[]>();
  const statusCalls = new Map<string, number>();
  let mode: 'up' | 'lose' = 'up';
  let n = 0;
  const sockets = new Set<Socket>();

  const provider: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const path = new URL(req.url ?? '/', 'http://x').pathname;
      const byKey = /\/charges\/by-key\/([^/]+)$/.exec(path);
      if ((req.method === 'GET' || req.method === 'HEAD') && byKey !== null) {
        const key = decodeURIComponent(byKey[1]!);
        statusCalls.set(key, (statusCalls.get(key) ?? 0) + 1);
        const ids = charges.get(key) ?? [];
        res.writeHead(ids.length > 0 ? 200 : 404, { 'content-type': 'application/json' });
        res.end(JSON.stringify(ids.length > 0 ? { id: ids[0], key, status: 'succeeded' } : { error: 'no such charge' }));
        return;
      }
      if (req.method === 'POST' && path.endsWith('/charges')) {
        const key = String(req.headers['idempotency-key'] ?? '');
        const id = `ch_${++n}`;
        charges.set(key, [...(charges.get(key) ?? []), id]);
        if (mode === 'lose') {
          req.socket.destroy();
          return;
        }
        res.writeHead(201, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ id, key, status: 'succeeded' }));
        return;
      }
      res.writeHead(404).end();
    });
  });
  provider.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => provider.listen(0, '127.0.0.1', resolve));
  const { port } = provider.address() as AddressInfo;
  let listening = true;

  const down = async () => {
    if (!listening) return;
    listening = false;
    const closed = new Promise<void>((resolve) => provider.close(() => resolve()));
    // Kept-alive connections too: the outage refuses every call.
    for (const s of sockets) s.destroy();
    await closed;
  };
  const up = async () => {
    mode = 'up';
    if (listening) return;
    await new Promise<void>((resolve, reject) => {
      provider.once('error', reject);
      provider.listen(port, '127.0.0.1', () => {
        provider.off('error', reject);
        resolve();
      });
    });
    listening = true;
  };

  const control = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const url = new URL(req.url ?? '/', 'http://x');
      const done = (body: unknown) => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify(body));
      };
      const fail = (err: unknown) => {
        res.writeHead(500).end(String(err));
      };
      if (req.method === 'POST' && url.pathname === '/down') void down().then(() => done({ ok: true }), fail);
      else if (req.method === 'POST' && url.pathname === '/up') void up().then(() => done({ ok: true }), fail);
      else if (req.method === 'POST' && url.pathname === '/lose') {
        mode = 'lose';
        void up().then(() => {
          mode = 'lose';
          done({ ok: true });
        }, fail);
      } else if (url.pathname === '/state') {
        const key = url.searchParams.get('key') ?? '';
        done({ charges: charges.get(key)?.length ?? 0, statusCalls: statusCalls.get(key) ?? 0 });
      } else res.writeHead(404).end();
    });
  });
  await new Promise<void>((resolve) => control.listen(0, '127.0.0.1', resolve));

  project.provide('reconcileUpstream', { url: `http://127.0.0.1:${port}`, control: `http://127.0.0.1:${(control.address() as AddressInfo).port}` });

  return async () => {
    for (const s of sockets) s.destroy();
    if (listening) await new Promise<void>((resolve) => provider.close(() => resolve()));
    control.closeAllConnections();
    await new Promise<void>((resolve) => control.close(() => resolve()));
  };
}

declare module 'vitest' {
  export interface ProvidedContext {
    /** The payment provider with a status endpoint (reconcile-upstream.setup.ts) and its control server. */
    reconcileUpstream: { url: string; control: string };
  }
}
