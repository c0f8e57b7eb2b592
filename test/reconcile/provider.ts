import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

/**
 * A payment provider on loopback that does NOT deduplicate by
 * Idempotency-Key (each POST that is performed is one more charge), with a
 * status endpoint, `GET /charges/by-key/:key`, that finds a charge by the
 * key it was created with (DESIGN §3.12's status query).
 */
export interface Provider {
  url: string;
  /** Every charge performed, in order (a second one for a key is a second execution), with the X-Request-Id it was sent with. */
  charges: { id: string; key: string; requestId: string; writtenAt: number }[];
  /** POST /charges requests received. */
  posts: number;
  /** Status queries received. */
  statusCalls: number;
  /** Their paths, as received. */
  statusPaths: string[];
  /** How the next requests behave; change it between steps. */
  mode: ProviderMode;
  chargesFor(key: string): number;
  close(): Promise<void>;
}

export interface ProviderMode {
  /** `perform`: write the charge after `writeAfterMs`, answer 201 after `answerAfterMs`. `drop`: read the request, never act, never answer. */
  post: 'perform' | 'drop';
  writeAfterMs: number;
  answerAfterMs: number;
  /** `normal`: 200 with the charge once visible, else 404. `500`, `hang` (never answers), `large` (a 200 over any small limit). */
  status: 'normal' | '500' | 'hang' | 'large';
  /** A lagging status endpoint: a charge is visible this long after it was written. */
  lagMs: number;
}

export const PROMPT: ProviderMode = { post: 'perform', writeAfterMs: 0, answerAfterMs: 0, status: 'normal', lagMs: 0 };

export async function startProvider(mode: Partial<ProviderMode> = {}): Promise<Provider> {
  const sockets = new Set<Socket>();
  const timers = new Set<NodeJS.Timeout>();
  const later = (ms: number, fn: () => void) => {
    const t = setTimeout(() => {
      timers.delete(t);
      fn();
    }, ms);
    timers.add(t);
  };
  let n = 0;
  const p: Provider = {
    url: '',
    charges: [],
    posts: 0,
    statusCalls: 0,
    statusPaths: [],
    mode: { ...PROMPT, ...mode },
    chargesFor: (key) => p.charges.filter((c) => c.key === key).length,
    close: async () => {
      for (const t of timers) clearTimeout(t);
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
  const json = (res: ServerResponse, status: number, body: unknown) => {
    const text = JSON.stringify(body);
    res.writeHead(status, { 'content-type': 'application/json', 'x-provider-trace': 'not-replayed' });
    res.end(text);
  };
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const url = new URL(req.url ?? '/', 'http://x');
      const mode = p.mode;
      if (req.method === 'POST' && url.pathname === '/charges') {
        p.posts++;
        if (mode.post === 'drop') return;
        const key = String(req.headers['idempotency-key'] ?? '');
        const requestId = String(req.headers['x-request-id'] ?? '');
        const id = `ch_${++n}`;
        later(mode.writeAfterMs, () => p.charges.push({ id, key, requestId, writtenAt: Date.now() }));
        later(mode.answerAfterMs, () => json(res, 201, { id, key, amount: 500 }));
        return;
      }
      // GET /charges/by-key/:key, or /charges/by-request/:id (the X-Request-Id the charge was sent with).
      const m = /^\/charges\/by-(key|request)\/([^/]+)$/.exec(url.pathname);
      if ((req.method === 'GET' || req.method === 'HEAD') && m) {
        p.statusCalls++;
        p.statusPaths.push(url.pathname);
        if (mode.status === 'hang') return;
        if (mode.status === '500') return json(res, 500, { error: 'status service down' });
        if (mode.status === 'large') return json(res, 200, { pad: 'x'.repeat(64 * 1024) });
        const value = decodeURIComponent(m[2]!);
        const c = p.charges.find((x) => (m[1] === 'key' ? x.key : x.requestId) === value && x.writtenAt + mode.lagMs <= Date.now());
        return c === undefined ? json(res, 404, { error: 'no such charge' }) : json(res, 200, { id: c.id, key: c.key, amount: 500 });
      }
      json(res, 404, { error: 'no route' });
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const addr = server.address();
  p.url = `http://127.0.0.1:${typeof addr === 'object' && addr ? addr.port : 0}`;
  return p;
}
