/**
 * A stand-in for the fencegate gateway, enough for worker-side tests: it
 * keeps the highest fence per entity and refuses lower ones with a 409
 * problem+json `…/stale-fence` (DESIGN §3 step 5a), replays a stored answer
 * for a known Idempotency-Key, and records every request that reached the
 * "upstream". The real gateway's own tests prove the gateway; this one only
 * speaks its wire contract.
 */
import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface FakeGateway {
  url: string;
  /** Every request that arrived, refused or not. */
  requests: { method: string; path: string; headers: IncomingHttpHeaders; body: string }[];
  /** Requests that got past the fence and the idempotency check: what the upstream saw. */
  upstream: { path: string; fence: number; entity: string; key: string; body: string }[];
  /** The next answer on `path` is sent `ms` late (the upstream call itself happens at once). */
  answerLate(path: string, ms: number): void;
  close(): Promise<void>;
}

export async function startFakeGateway(): Promise<FakeGateway> {
  const fences = new Map<string, number>();
  const replies = new Map<string, { status: number; body: string }>();
  const requests: FakeGateway['requests'] = [];
  const upstream: FakeGateway['upstream'] = [];
  const late = new Map<string, number>();

  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (chunk) => (body += chunk));
    req.on('end', () => {
      const path = req.url ?? '/';
      requests.push({ method: req.method ?? 'GET', path, headers: req.headers, body });
      const entity = String(req.headers['x-fence-entity'] ?? '');
      const fence = Number(req.headers['x-execution-fence']);
      const key = String(req.headers['idempotency-key'] ?? '');
      const current = fences.get(entity);
      if (current !== undefined && fence < current) {
        res.writeHead(409, { 'content-type': 'application/problem+json' });
        res.end(
          JSON.stringify({
            type: '/_fencegate/problems/stale-fence',
            title: 'Stale execution fence',
            status: 409,
            detail: `fence ${fence} is below ${current}`,
            entity,
            presented_fence: String(fence),
            current_fence: String(current),
          }),
        );
        return;
      }
      fences.set(entity, fence);
      const replay = replies.get(key);
      if (replay) {
        res.writeHead(replay.status, { 'content-type': 'application/json', 'idempotent-replayed': 'true' });
        res.end(replay.body);
        return;
      }
      upstream.push({ path, fence, entity, key, body });
      const answer = { status: 201, body: JSON.stringify({ payment: `pay_${upstream.length}`, fence }) };
      replies.set(key, answer);
      const delay = late.get(path) ?? 0;
      late.delete(path);
      setTimeout(() => {
        if (res.destroyed) return; // the caller gave up; the payment happened anyway
        res.writeHead(answer.status, { 'content-type': 'application/json' });
        res.end(answer.body);
      }, delay);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    upstream,
    answerLate: (path, ms) => late.set(path, ms),
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
