/**
 * vitest globalSetup for the workerd tests (runs in Node, not in workerd): a
 * recording, deliberately non-idempotent fake upstream on 127.0.0.1 that the
 * Worker under test reaches with its real `fetch`. Tests steer each request
 * with the `x-upstream` header (the gateway forwards it) and read what
 * arrived from `GET /__calls`.
 *
 *   x-upstream: delay=300        answer after 300 ms
 *   x-upstream: status=500       answer that status
 *   x-upstream: gzip             gzip the JSON body (content-encoding: gzip)
 *   x-upstream: deflate          the same with deflate (workerd leaves it encoded)
 *   x-upstream: reset            read the request, then destroy the socket
 */
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { deflateSync, gzipSync } from 'node:zlib';
import type { TestProject } from 'vitest/node';
import { startFaultUpstreams, type FaultUrls } from './fault-upstream.js';

interface Call {
  seq: number;
  method: string;
  url: string;
  fence: string | null;
  entity: string | null;
  key: string | null;
  headers: Record<string, string | string[] | undefined>;
  body: string;
  /** Requests for this entity in flight when this one arrived, itself included. */
  inflightForEntity: number;
  arrivedAt: number;
}

const one = (req: IncomingMessage, name: string): string | null => {
  const v = req.headers[name];
  return v === undefined ? null : Array.isArray(v) ? v.join(', ') : v;
};

let server: Server | null = null;
const sockets = new Set<Socket>();

export async function setup(project: TestProject): Promise<() => Promise<void>> {
  const calls: Call[] = [];
  const inflight = new Map<string, number>();
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.url?.startsWith('/__calls')) {
        const key = new URL(req.url, 'http://x').searchParams.get('key');
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify(key === null ? calls : calls.filter((c) => c.key === key)));
        return;
      }
      const entity = one(req, 'x-fence-entity');
      const now = (inflight.get(entity ?? '') ?? 0) + 1;
      inflight.set(entity ?? '', now);
      const call: Call = {
        seq: calls.length + 1,
        method: req.method ?? '',
        url: req.url ?? '',
        fence: one(req, 'x-execution-fence'),
        entity,
        key: one(req, 'idempotency-key'),
        headers: req.headers,
        body: Buffer.concat(chunks).toString('utf8'),
        inflightForEntity: now,
        arrivedAt: Date.now(),
      };
      calls.push(call);
      let left = false;
      const leave = () => {
        if (left) return;
        left = true;
        inflight.set(entity ?? '', (inflight.get(entity ?? '') ?? 1) - 1);
      };
      const steer = new Map<string, string | undefined>(
        (one(req, 'x-upstream') ?? '')
          .split(',')
          .map((s) => s.trim())
          .filter(Boolean)
          .map((s): [string, string | undefined] => [s.split('=')[0]!, s.split('=')[1]]),
      );
      if (steer.has('reset')) {
        leave();
        req.socket.destroy();
        return;
      }
      const answer = () => {
        leave();
        const json = Buffer.from(JSON.stringify({ effect: call.seq, fence: call.fence, entity: call.entity, key: call.key }));
        const headers: Record<string, string | string[]> = { 'content-type': 'application/json', 'set-cookie': ['a=1', 'b=2'], etag: `"e${call.seq}"` };
        let body: Buffer = json;
        if (steer.has('gzip')) (headers['content-encoding'] = 'gzip'), (body = gzipSync(json));
        if (steer.has('deflate')) (headers['content-encoding'] = 'deflate'), (body = deflateSync(json));
        res.writeHead(Number(steer.get('status') ?? 201), headers);
        res.end(body);
      };
      const delay = Number(steer.get('delay') ?? 0);
      if (delay > 0) setTimeout(answer, delay);
      else answer();
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server!.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;

  // A port nothing listens on: bound, then released.
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
  const refusedPort = (probe.address() as AddressInfo).port;
  await new Promise<void>((resolve) => probe.close(() => resolve()));

  project.provide('upstreamUrl', `http://127.0.0.1:${port}`);
  project.provide('refusedUrl', `http://127.0.0.1:${refusedPort}`);
  const faults = await startFaultUpstreams();
  project.provide('faultUrls', faults.urls);

  return async () => {
    await faults.close();
    for (const s of sockets) s.destroy();
    await new Promise<void>((resolve) => server!.close(() => resolve()));
  };
}

declare module 'vitest' {
  export interface ProvidedContext {
    upstreamUrl: string;
    refusedUrl: string;
    /** Upstreams that fail on purpose (fault-upstream.ts). */
    faultUrls: FaultUrls;
  }
}
