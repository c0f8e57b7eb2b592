import { EventEmitter } from 'node:events';
import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

/**
 * A recording fake upstream for the gateway tests. It is deliberately NOT
 * idempotent: every request that reaches it is one more "effect" (a charge,
 * a ticket, an e-mail), so a duplicate or a stale command that slips through
 * the gateway shows up as an extra entry in `calls`.
 *
 * It records, per request: the fence, entity and key headers, the arrival
 * order, and how many requests for the same entity were in flight at that
 * moment (G3). A test steers it with `behave(fn)`: answer a given status,
 * hold until a gate opens, delay, hang, or reset the socket.
 */

export interface UpstreamCall {
  /** 1-based arrival order (after the body was read). */
  seq: number;
  method: string;
  /** Path and query, as received. */
  url: string;
  headers: IncomingHttpHeaders;
  rawHeaders: string[];
  body: Buffer;
  fence: string | null;
  entity: string | null;
  key: string | null;
  /** Requests for this entity in flight at the upstream when this one arrived, itself included. */
  inflightForEntity: number;
  /** Set when the upstream has answered (or dropped) this request. */
  finished: boolean;
}

export type Behavior =
  | { kind: 'respond'; status?: number; headers?: Record<string, string | string[]>; body?: string | Uint8Array }
  /** Answer `then` (default: the default answer) once `gate` resolves. */
  | { kind: 'hold'; gate: Promise<unknown>; then?: Behavior }
  | { kind: 'delay'; ms: number; then?: Behavior }
  /** Never answer; the socket is dropped when the upstream closes. */
  | { kind: 'hang' }
  /** Read the request, then destroy the socket without a response. */
  | { kind: 'reset' };

export type BehaviorFn = (call: UpstreamCall) => Behavior | undefined;

export interface Gate {
  promise: Promise<void>;
  open(): void;
}

export interface FakeUpstream {
  url: string;
  port: number;
  calls: UpstreamCall[];
  /** Every request that reached the upstream is an effect. */
  readonly effects: number;
  /** Highest number of same-entity requests in flight at once, per entity. */
  maxInflight(entity: string): number;
  /** Requests in flight right now, all entities. */
  readonly inflight: number;
  /** Highest number of requests in flight at once, all entities. */
  readonly maxInflightTotal: number;
  /** Sets how the next requests are answered; `undefined` from `fn` means the default 201. */
  behave(fn: BehaviorFn | null): void;
  /** A gate for `hold`; every gate opens when the upstream closes. */
  gate(): Gate;
  /** Resolves once `predicate` holds (checked on every arrival and finish). */
  waitFor(predicate: () => boolean, what?: string, timeoutMs?: number): Promise<void>;
  waitForCalls(n: number, timeoutMs?: number): Promise<void>;
  callsFor(key: string): UpstreamCall[];
  close(): Promise<void>;
}

export interface UpstreamOptions {
  /** Bind to this port (e.g. to bring an upstream up where a 502 was answered). */
  port?: number;
}

/**
 * The default answer: 201 with a JSON body naming the effect, so that a
 * replay can be told apart from a second effect by its body alone.
 */
function defaultAnswer(call: UpstreamCall): Behavior {
  return {
    kind: 'respond',
    status: 201,
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ effect: call.seq, fence: call.fence, entity: call.entity, key: call.key }),
  };
}

export async function startUpstream(options: UpstreamOptions = {}): Promise<FakeUpstream> {
  const calls: UpstreamCall[] = [];
  const inflightByEntity = new Map<string, number>();
  const maxByEntity = new Map<string, number>();
  const sockets = new Set<Socket>();
  const gates = new Set<Gate>();
  const events = new EventEmitter();
  events.setMaxListeners(0);
  let behavior: BehaviorFn | null = null;
  let inflight = 0;
  let maxInflightTotal = 0;
  let closed = false;

  const header = (h: IncomingHttpHeaders, name: string): string | null => {
    const v = h[name];
    return v === undefined ? null : Array.isArray(v) ? v.join(', ') : v;
  };

  const finish = (call: UpstreamCall) => {
    if (call.finished) return;
    call.finished = true;
    inflight--;
    const e = call.entity ?? '';
    inflightByEntity.set(e, (inflightByEntity.get(e) ?? 1) - 1);
    events.emit('change');
  };

  const act = async (b: Behavior, call: UpstreamCall, res: ServerResponse): Promise<void> => {
    switch (b.kind) {
      case 'respond': {
        // Counted as finished the moment the answer is decided, before a byte
        // is written: the gateway cannot start the next request for this
        // entity before that, so no overlap is ever reported falsely.
        finish(call);
        res.writeHead(b.status ?? 200, b.headers ?? {});
        res.end(b.body === undefined ? undefined : typeof b.body === 'string' ? b.body : Buffer.from(b.body));
        return;
      }
      case 'hold':
        await b.gate;
        return act(b.then ?? defaultAnswer(call), call, res);
      case 'delay':
        await new Promise((r) => setTimeout(r, b.ms));
        return act(b.then ?? defaultAnswer(call), call, res);
      case 'hang':
        return;
      case 'reset':
        finish(call);
        res.socket?.destroy();
        return;
    }
  };

  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const entity = header(req.headers, 'x-fence-entity');
      const e = entity ?? '';
      const now = (inflightByEntity.get(e) ?? 0) + 1;
      inflightByEntity.set(e, now);
      maxByEntity.set(e, Math.max(maxByEntity.get(e) ?? 0, now));
      inflight++;
      maxInflightTotal = Math.max(maxInflightTotal, inflight);
      const call: UpstreamCall = {
        seq: calls.length + 1,
        method: req.method ?? '',
        url: req.url ?? '',
        headers: req.headers,
        rawHeaders: req.rawHeaders,
        body: Buffer.concat(chunks),
        fence: header(req.headers, 'x-execution-fence'),
        entity,
        key: header(req.headers, 'idempotency-key'),
        inflightForEntity: now,
        finished: false,
      };
      calls.push(call);
      // A dropped connection ends the call too (hang, or the gateway gave up).
      const socket = res.socket;
      const onClose = () => finish(call);
      socket?.once('close', onClose);
      res.once('finish', () => socket?.off('close', onClose));
      events.emit('change');
      const b: Behavior = (closed ? { kind: 'reset' as const } : behavior?.(call)) ?? defaultAnswer(call);
      act(b, call, res).catch(() => res.socket?.destroy());
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, '127.0.0.1', () => resolve());
  });
  const { port } = server.address() as AddressInfo;

  const waitFor = (predicate: () => boolean, what = 'condition', timeoutMs = 20_000) =>
    new Promise<void>((resolve, reject) => {
      if (predicate()) return resolve();
      const check = () => {
        if (!predicate()) return;
        clearTimeout(timer);
        events.off('change', check);
        resolve();
      };
      const timer = setTimeout(() => {
        events.off('change', check);
        reject(new Error(`upstream: timed out waiting for ${what} (calls: ${calls.length}, inflight: ${inflight})`));
      }, timeoutMs);
      events.on('change', check);
    });

  return {
    url: `http://127.0.0.1:${port}`,
    port,
    calls,
    get effects() {
      return calls.length;
    },
    get inflight() {
      return inflight;
    },
    get maxInflightTotal() {
      return maxInflightTotal;
    },
    maxInflight: (entity) => maxByEntity.get(entity) ?? 0,
    behave(fn) {
      behavior = fn;
    },
    gate() {
      let open!: () => void;
      const promise = new Promise<void>((r) => (open = r));
      const g: Gate = {
        promise,
        open: () => {
          gates.delete(g);
          open();
        },
      };
      gates.add(g);
      return g;
    },
    waitFor,
    waitForCalls: (n, timeoutMs) => waitFor(() => calls.length >= n, `${n} upstream calls`, timeoutMs),
    callsFor: (key) => calls.filter((c) => c.key === key),
    async close() {
      if (closed) return;
      closed = true;
      for (const g of [...gates]) g.open();
      const done = new Promise<void>((r) => server.close(() => r()));
      for (const s of sockets) s.destroy();
      await done;
    },
  };
}

/** A port nothing listens on (bound, then released), for connection-refused tests. */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((r) => server.close(() => r()));
  return port;
}
