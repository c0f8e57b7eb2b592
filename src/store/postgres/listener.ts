import type pg from 'pg';

export interface ListenerOptions {
  /** Opens a fresh, unconnected client (the store's connection settings). */
  makeClient: () => pg.Client;
  channel: string;
  onNotify: (payload: string) => void;
  /**
   * Called after every (re)connect once LISTEN is active: notifications sent
   * while we were away are lost, so waiters should re-check now.
   */
  onListening: () => void;
  onError: (err: Error) => void;
  /** Reconnect backoff bounds. Defaults 100 ms … 5 s. */
  minBackoffMs?: number;
  maxBackoffMs?: number;
}

/**
 * One dedicated connection per store that LISTENs on the store's channel.
 * It survives `pg_terminate_backend` and server restarts: on `error` or
 * `end` it drops the client and reconnects with capped exponential backoff,
 * then LISTENs again. While it is down, the store's waiters fall back to
 * polling, so a lost notification costs time, never safety.
 */
export class PgListener {
  private client: pg.Client | null = null;
  private generation = 0;
  private timer: NodeJS.Timeout | null = null;
  private backoff: number;
  private closed = false;
  private readonly minBackoff: number;
  private readonly maxBackoff: number;

  constructor(private readonly options: ListenerOptions) {
    this.minBackoff = options.minBackoffMs ?? 100;
    this.maxBackoff = options.maxBackoffMs ?? 5_000;
    this.backoff = this.minBackoff;
  }

  /** True while a client is connected and listening. */
  get listening(): boolean {
    return this.client !== null;
  }

  /** First connection attempt; resolves either way (failure schedules a retry). */
  start(): Promise<void> {
    return this.track(this.connect());
  }

  private connecting: Promise<void> | null = null;

  private track(p: Promise<void>): Promise<void> {
    const tracked = p.finally(() => {
      if (this.connecting === tracked) this.connecting = null;
    });
    this.connecting = tracked;
    return tracked;
  }

  private async connect(): Promise<void> {
    if (this.closed) return;
    const gen = ++this.generation;
    const client = this.options.makeClient();
    const lost = (err?: Error) => this.lost(gen, client, err);
    client.on('error', lost);
    client.on('end', () => lost());
    client.on('notification', (msg) => {
      if (msg.channel === this.options.channel && msg.payload !== undefined) this.options.onNotify(msg.payload);
    });
    try {
      await client.connect();
      await client.query(`LISTEN ${this.options.channel}`);
    } catch (err) {
      if (gen !== this.generation) client.end().catch(() => {});
      else lost(err as Error);
      return;
    }
    if (gen !== this.generation || this.closed) {
      // Closed (or superseded) while connecting.
      client.end().catch(() => {});
      return;
    }
    this.client = client;
    this.backoff = this.minBackoff;
    this.options.onListening();
  }

  private lost(gen: number, client: pg.Client, err?: Error): void {
    if (gen !== this.generation) return;
    this.generation++;
    this.client = null;
    client.removeAllListeners('notification');
    // A dead client may still emit; never let that reach the process.
    client.on('error', () => {});
    client.end().catch(() => {});
    if (this.closed) return;
    if (err !== undefined) this.options.onError(err);
    const delay = this.backoff;
    this.backoff = Math.min(this.maxBackoff, this.backoff * 2);
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.track(this.connect());
    }, delay);
    this.timer.unref();
  }

  /** Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.generation++;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    // A connect in flight notices the close and ends its own client.
    await this.connecting?.catch(() => {});
    const client = this.client;
    this.client = null;
    if (client !== null) {
      client.on('error', () => {});
      await client.end().catch(() => {});
    }
  }
}
