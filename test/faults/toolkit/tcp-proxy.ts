import { EventEmitter } from 'node:events';
import { connect, createServer, type Server, type Socket } from 'node:net';

/**
 * A small TCP proxy with toxics, for fault tests on loopback (there is no
 * `tc netem` on the test machines). One proxy sits on one path (a worker →
 * the database, a worker → the gateway, the gateway → the upstream); the
 * test turns faults on and off while real processes talk through it.
 *
 * Toxics:
 * - `latency(ms, jitter)`: every chunk is delayed, in both directions, order kept.
 * - `blackhole(true)`: connections stay open, every byte is swallowed.
 *   `blackhole(true, 'down')` swallows only the target's bytes: requests
 *   still arrive and take effect (a statement commits), their answers never
 *   come back (a silent network after the send, a COMMIT that waits forever).
 * - `cut()` / `restore()`: every open connection is reset (RST) and new ones
 *   are reset on accept until `restore()`: a network partition that the
 *   endpoints notice at once.
 * - `resetNext(n)` / `resetRate(p)`: reset after forward. The request reaches
 *   the target, the target answers, and the answer is replaced by a reset of
 *   the client's connection: the effect happened, the caller cannot know.
 * - `hold(filter)` / `release()`: new connections whose HTTP request head
 *   passes `filter` are held: their bytes stay in the proxy, like a request
 *   stuck in the network. `release()` delivers them late, even if the client
 *   has given up meanwhile (bytes already on the wire still arrive), and
 *   records the target's answer. `dropHeld()` drops them instead: the
 *   request is lost in the network and never arrives.
 * - `holdAnswers(filter)` / `releaseAnswers()`: the answers to requests whose
 *   head passes `filter` are held: the target has answered, its bytes stay in
 *   the proxy (event `answer-held`) until `releaseAnswers()` writes them to
 *   the client. The kill campaign stops the gateway in between, so the answer
 *   lands in the socket of a process that never reads it.
 *
 * The target connection is opened on the client's first bytes (every protocol
 * used here speaks client-first: HTTP, PostgreSQL), so a held request opens
 * its own fresh connection when it is finally delivered.
 */

export interface ProxyTarget {
  host: string;
  port: number;
}

/** The start of an HTTP/1.1 request, as the client sent it. */
export interface RequestHead {
  method: string;
  target: string;
  /** Lower-case names; repeated fields joined with ", ". */
  headers: Record<string, string>;
}

/** A request the proxy held back, and what became of it. */
export interface HeldRequest {
  id: number;
  head: RequestHead;
  /** Bytes held so far. */
  bytes: number;
  /** The client closed its side while the request was held. */
  clientGone: boolean;
  delivered: boolean;
  /** The target's answer after delivery: status line and the start of the body. */
  response?: { status: number; text: string };
}

export interface ProxyStats {
  connections: number;
  /** Connections reset by `cut()` or refused while cut. */
  cutConnections: number;
  cuts: number;
  resets: number;
  held: number;
  delivered: number;
  /** Target connections that failed (refused, reset). */
  targetErrors: number;
}

export interface FaultProxyOptions {
  target: ProxyTarget;
  /** For messages. */
  name?: string;
  /** Source of randomness for `resetRate` and jitter (a seeded PRNG in the soak). */
  random?: () => number;
}

interface Link {
  id: number;
  client: Socket;
  server: Socket | null;
  /** Bytes from the client not yet sent (before the target is connected, or while held). */
  pending: Buffer[];
  /** The first bytes, until the request head is complete. */
  first: Buffer;
  decided: boolean;
  head: RequestHead | null;
  held: HeldRequest | null;
  /** Client bytes were forwarded since the last answer began: the next server bytes start an answer. */
  awaitingAnswer: boolean;
  /** Time at which the last delayed chunk in each direction is due (keeps order under jitter). */
  dueUp: number;
  dueDown: number;
  closed: boolean;
  /** The target's bytes held by `holdAnswers`, not yet written to the client; null when not held. */
  answerHeld: Buffer[] | null;
}

const MAX_HEAD = 64 * 1024;

/** Parses an HTTP/1.x request head; null when the bytes are not (yet) one. */
export function parseRequestHead(buf: Buffer): RequestHead | null {
  const end = buf.indexOf('\r\n\r\n');
  if (end < 0) return null;
  const [line, ...rest] = buf.subarray(0, end).toString('latin1').split('\r\n');
  const m = /^([A-Z]+) (\S+) HTTP\/1\.[01]$/.exec(line ?? '');
  if (!m) return null;
  const headers: Record<string, string> = {};
  for (const h of rest) {
    const i = h.indexOf(':');
    if (i <= 0) continue;
    const name = h.slice(0, i).trim().toLowerCase();
    const value = h.slice(i + 1).trim();
    headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`;
  }
  return { method: m[1]!, target: m[2]!, headers };
}

/** The status of an HTTP/1.x answer, or null. */
function statusOf(buf: Buffer): number | null {
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(buf.subarray(0, 16).toString('latin1'));
  return m ? Number(m[1]) : null;
}

export class FaultProxy extends EventEmitter {
  readonly name: string;
  readonly stats: ProxyStats = { connections: 0, cutConnections: 0, cuts: 0, resets: 0, held: 0, delivered: 0, targetErrors: 0 };
  /** Every request held so far (and delivered or not). */
  readonly heldRequests: HeldRequest[] = [];
  private target: ProxyTarget;
  private readonly server: Server;
  private readonly links = new Set<Link>();
  private readonly random: () => number;
  private nextId = 1;
  private latencyMs = 0;
  private jitterMs = 0;
  private isCut = false;
  private isBlackhole = false;
  private isDownBlackhole = false;
  private holdFilter: ((head: RequestHead) => boolean) | null = null;
  private answerFilter: ((head: RequestHead) => boolean) | null = null;
  private resetBudget = 0;
  private resetProbability = 0;
  private closing = false;
  port = 0;

  private constructor(options: FaultProxyOptions) {
    super();
    this.setMaxListeners(0);
    this.name = options.name ?? 'proxy';
    this.target = options.target;
    this.random = options.random ?? Math.random;
    this.server = createServer({ noDelay: true }, (socket) => this.accept(socket));
  }

  /** Starts a proxy on a free loopback port. */
  static async start(options: FaultProxyOptions): Promise<FaultProxy> {
    const proxy = new FaultProxy(options);
    await new Promise<void>((resolve, reject) => {
      proxy.server.once('error', reject);
      proxy.server.listen(0, '127.0.0.1', () => resolve());
    });
    proxy.port = (proxy.server.address() as { port: number }).port;
    return proxy;
  }

  /** `http://127.0.0.1:<port>` */
  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Rewrites `postgres://…@host:port/…` (or any URL) to go through this proxy. */
  wrapUrl(url: string): string {
    const u = new URL(url);
    u.hostname = '127.0.0.1';
    u.port = String(this.port);
    return u.toString();
  }

  setTarget(target: ProxyTarget): void {
    this.target = target;
  }

  /** Delays every chunk forwarded from now on by `ms` plus up to `jitterMs`; 0 turns it off. */
  latency(ms: number, jitterMs = 0): void {
    this.latencyMs = ms;
    this.jitterMs = jitterMs;
  }

  /** Resets every open connection and every new one until `restore()`. Returns how many were open. */
  cut(): number {
    this.isCut = true;
    this.stats.cuts++;
    let n = 0;
    for (const link of [...this.links]) {
      if (link.held) continue; // a held request is "in the network", not on a live connection
      n++;
      this.stats.cutConnections++;
      this.destroy(link, true);
    }
    return n;
  }

  restore(): void {
    this.isCut = false;
  }

  get cutOff(): boolean {
    return this.isCut;
  }

  /** Swallows every byte in both directions (or only the target's, `'down'`) while on; connections stay open. */
  blackhole(on: boolean, direction: 'both' | 'down' = 'both'): void {
    if (direction === 'both') this.isBlackhole = on;
    else this.isDownBlackhole = on;
  }

  /** The next `n` answers (first bytes of a response after a forwarded request) become resets. */
  resetNext(n = 1): void {
    this.resetBudget += n;
  }

  /** Each answer becomes a reset with probability `p` (drawn from `random`). */
  resetRate(p: number): void {
    this.resetProbability = p;
  }

  /** Holds every new connection whose HTTP request head passes `filter` (default: all). */
  hold(filter: (head: RequestHead) => boolean = () => true): void {
    this.holdFilter = filter;
  }

  get holding(): boolean {
    return this.holdFilter !== null;
  }

  /**
   * Drops every held request that was not delivered (its connection closed
   * on both sides, its bytes never sent) and stops holding new ones: a
   * request lost in the network. Returns how many were dropped.
   */
  dropHeld(): number {
    this.holdFilter = null;
    let n = 0;
    for (const link of [...this.links]) {
      if (link.held === null || link.held.delivered) continue;
      n++;
      this.destroy(link, false);
    }
    return n;
  }

  /** Holds the target's answer to every new request whose head passes `filter`; emits `answer-held` (the head) at its first byte. */
  holdAnswers(filter: (head: RequestHead) => boolean): void {
    this.answerFilter = filter;
  }

  /** Stops holding answers and writes every held one to its client. Returns how many. */
  releaseAnswers(): number {
    this.answerFilter = null;
    let n = 0;
    for (const link of [...this.links]) {
      if (link.answerHeld === null) continue;
      n++;
      const chunks = link.answerHeld;
      link.answerHeld = null;
      for (const c of chunks) if (!link.client.destroyed) link.client.write(c);
    }
    return n;
  }

  /** Resolves with the first `n` held requests once the proxy holds that many complete heads. */
  waitForHeld(n: number, timeoutMs = 20_000): Promise<HeldRequest[]> {
    return new Promise((resolve, reject) => {
      const check = () => {
        if (this.heldRequests.length < n) return;
        clearTimeout(timer);
        this.off('held', check);
        resolve(this.heldRequests.slice(0, n));
      };
      const timer = setTimeout(() => {
        this.off('held', check);
        reject(new Error(`${this.name}: ${this.heldRequests.length} of ${n} requests held after ${timeoutMs} ms`));
      }, timeoutMs);
      this.on('held', check);
      check();
    });
  }

  /**
   * Stops holding new connections and delivers every held request to the
   * target. Resolves once each delivered request has an answer (or its
   * connection ended, or `timeoutMs` passed), with the held requests.
   */
  async release(timeoutMs = 20_000): Promise<HeldRequest[]> {
    this.holdFilter = null;
    const held = [...this.links].filter((l) => l.held !== null && !l.held.delivered);
    await Promise.all(held.map((l) => this.deliver(l, timeoutMs)));
    return held.map((l) => l.held!);
  }

  /** Closes the listener and every connection (held ones are dropped). */
  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    for (const link of [...this.links]) this.destroy(link, false);
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  // --- connections -----------------------------------------------------------

  private accept(client: Socket): void {
    this.stats.connections++;
    if (this.isCut || this.closing) {
      this.stats.cutConnections++;
      client.on('error', () => {});
      client.resetAndDestroy();
      return;
    }
    const link: Link = {
      id: this.nextId++,
      client,
      server: null,
      pending: [],
      first: Buffer.alloc(0),
      decided: false,
      head: null,
      held: null,
      awaitingAnswer: false,
      dueUp: 0,
      dueDown: 0,
      closed: false,
      answerHeld: null,
    };
    this.links.add(link);
    client.setNoDelay(true);
    client.on('error', () => {});
    client.on('data', (chunk: Buffer) => this.fromClient(link, chunk));
    client.on('close', () => {
      if (link.held && !link.held.delivered) {
        // The client gave up; the bytes it sent are still "in the network".
        link.held.clientGone = true;
        return;
      }
      if (link.held && link.server && !link.server.destroyed) return; // a late delivery reads its answer
      this.destroy(link, false);
    });
  }

  private fromClient(link: Link, chunk: Buffer): void {
    if (this.isBlackhole) return;
    if (!link.decided) {
      link.first = Buffer.concat([link.first, chunk]);
      const head = parseRequestHead(link.first);
      const looksHttp = /^[A-Z]/.test(link.first.subarray(0, 1).toString('latin1'));
      if (head === null && looksHttp && link.first.length < MAX_HEAD && link.first.indexOf('\r\n\r\n') < 0) return; // wait for the whole head
      link.decided = true;
      link.head = head;
      chunk = link.first;
      link.first = Buffer.alloc(0);
      if (head !== null && this.answerFilter !== null && this.answerFilter(head)) link.answerHeld = [];
      if (head !== null && this.holdFilter !== null && this.holdFilter(head)) {
        link.held = { id: link.id, head, bytes: 0, clientGone: false, delivered: false };
        this.heldRequests.push(link.held);
        this.stats.held++;
      }
    }
    if (link.held && !link.held.delivered) {
      link.pending.push(chunk);
      const before = link.held.bytes;
      link.held.bytes += chunk.length;
      if (before === 0) this.emit('held', link.held);
      return;
    }
    if (link.server === null) this.connectServer(link);
    if (link.server!.connecting) {
      link.pending.push(chunk);
      return;
    }
    this.sendUp(link, chunk);
  }

  private connectServer(link: Link): Socket {
    const server = connect({ host: this.target.host, port: this.target.port, noDelay: true });
    link.server = server;
    server.on('connect', () => {
      for (const c of link.pending.splice(0)) this.sendUp(link, c);
    });
    server.on('data', (chunk: Buffer) => this.fromServer(link, chunk));
    server.on('error', () => {
      this.stats.targetErrors++;
    });
    server.on('close', () => {
      if (link.held && link.held.clientGone) {
        this.emit('delivered', link.held);
        this.destroy(link, false);
        return;
      }
      this.destroy(link, false);
    });
    return server;
  }

  private sendUp(link: Link, chunk: Buffer): void {
    link.awaitingAnswer = true;
    this.delayed(link, 'up', chunk, () => {
      if (link.server && !link.server.destroyed) link.server.write(chunk);
    });
  }

  private fromServer(link: Link, chunk: Buffer): void {
    if (this.isBlackhole || this.isDownBlackhole) return;
    if (link.held && !link.held.response) {
      const status = statusOf(chunk);
      if (status !== null) {
        link.held.response = { status, text: chunk.toString('utf8', 0, Math.min(chunk.length, 4096)) };
        this.emit('answer', link.held);
      }
      if (link.held.clientGone) {
        // Nobody reads it; the answer is recorded, the connection closed.
        this.destroy(link, false);
        return;
      }
    }
    if (link.answerHeld !== null) {
      link.answerHeld.push(chunk);
      if (link.answerHeld.length === 1) this.emit('answer-held', link.head);
      return;
    }
    if (link.awaitingAnswer) {
      link.awaitingAnswer = false;
      if (this.shouldReset()) {
        this.stats.resets++;
        this.emit('reset', link.head);
        this.destroy(link, true);
        return;
      }
    }
    this.delayed(link, 'down', chunk, () => {
      if (!link.client.destroyed) link.client.write(chunk);
    });
  }

  private shouldReset(): boolean {
    if (this.resetBudget > 0) {
      this.resetBudget--;
      return true;
    }
    return this.resetProbability > 0 && this.random() < this.resetProbability;
  }

  private deliver(link: Link, timeoutMs: number): Promise<void> {
    const held = link.held!;
    held.delivered = true;
    this.stats.delivered++;
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.off('answer', onAnswer);
        this.off('delivered', onAnswer);
        resolve();
      };
      const onAnswer = (h: HeldRequest) => {
        if (h === held) done();
      };
      const timer = setTimeout(done, timeoutMs);
      this.on('answer', onAnswer);
      this.on('delivered', onAnswer);
      // The held bytes go out once the fresh target connection is up.
      this.connectServer(link).once('close', done);
    });
  }

  /** Runs `write` after the current latency, never before an earlier chunk of the same direction. */
  private delayed(link: Link, dir: 'up' | 'down', _chunk: Buffer, write: () => void): void {
    const now = Date.now();
    const delay = this.latencyMs + (this.jitterMs > 0 ? Math.floor(this.random() * this.jitterMs) : 0);
    const last = dir === 'up' ? link.dueUp : link.dueDown;
    if (delay === 0 && last <= now) {
      write();
      return;
    }
    const due = Math.max(now + delay, last);
    if (dir === 'up') link.dueUp = due;
    else link.dueDown = due;
    setTimeout(() => {
      // A connection that has closed meanwhile drops what it still carried.
      if (!link.closed) write();
    }, due - now);
  }

  private destroy(link: Link, reset: boolean): void {
    if (link.closed) return;
    link.closed = true;
    this.links.delete(link);
    for (const s of [link.client, link.server]) {
      if (s === null || s.destroyed) continue;
      if (reset) s.resetAndDestroy();
      else s.destroy();
    }
  }
}
