import { createHash } from 'node:crypto';
import type pg from 'pg';
import { LocalNotifier } from '../notifier.js';
import { entityTopic, recordTopic } from '../types.js';
import { PgListener } from './listener.js';

/**
 * How waiters learn that a topic changed (DESIGN §3.5 e/h across replicas).
 *
 * LISTEN/NOTIFY, with a bounded poll as the safety net. Every finish calls
 * pg_notify(channel, md5(topic)) inside its own transaction, so every
 * replica's listener hears it at commit; a local finish also wakes local
 * waiters at once. A waiter re-runs the admission when woken, and at least
 * every `pollMs` anyway: a lost notification, a listener reconnecting, a lock
 * that expired because its gateway died, none of these notify.
 *
 * Listening is the default because a waiter then learns of a finish on
 * another replica within milliseconds and runs no admissions while it waits,
 * where polling costs 1000/pollMs write transactions per second per waiter
 * and wakes it up to a whole interval late (bench/postgres-wait.mjs; the
 * figures are in docs/performance.md, "Cross-replica wake-ups").
 */
export const DEFAULT_POLL_MS_LISTENING = 500;
/** Without a listener, waiters poll as often as the SQLite store's do. */
export const DEFAULT_POLL_MS_POLLING = 50;

export interface WakeupOptions {
  /** The schema the tables live in: replicas on one schema share a channel. */
  resolvedSchema: string;
  /** Opens a LISTEN connection, or null to poll only. */
  makeListenClient: (() => pg.Client) | null;
  pollMs?: number;
  onError: (err: Error) => void;
}

/** The store's waiters, its LISTEN connection and the NOTIFY channel they share. */
export class PgWakeups {
  /** The NOTIFY channel of this schema (all replicas on the schema share it). */
  readonly channel: string;
  private readonly notifier: LocalNotifier;
  private readonly listener: PgListener | null;
  /** Topic hashes someone waits on, with how many waiters. */
  private readonly waiting = new Map<string, number>();

  constructor(init: WakeupOptions) {
    // Channel names are identifiers (≤ 63 bytes): derive one per schema, so
    // replicas of one deployment hear each other and nobody else.
    this.channel = `fencegate_${createHash('sha1').update(init.resolvedSchema).digest('hex').slice(0, 20)}`;
    const listening = init.makeListenClient !== null;
    this.notifier = new LocalNotifier(init.pollMs ?? (listening ? DEFAULT_POLL_MS_LISTENING : DEFAULT_POLL_MS_POLLING));
    this.listener = listening
      ? new PgListener({
          makeClient: init.makeListenClient!,
          channel: this.channel,
          onNotify: (payload) => this.notifier.notify(payload),
          onListening: () => this.wakeAll(),
          onError: init.onError,
        })
      : null;
  }

  /** The channel a finish notifies, or null when no replica of this store listens (polling only). */
  get notifyChannel(): string | null {
    return this.listener === null ? null : this.channel;
  }

  /** True when cross-replica wake-ups are live. */
  get listening(): boolean {
    return this.listener?.listening ?? false;
  }

  /** Starts the listener (resolves even if it could not connect yet: it retries). */
  async start(): Promise<void> {
    await this.listener?.start();
  }

  /** Wakes this replica's waiters on a topic hash (a finish here need not wait for its own NOTIFY). */
  notify(hash: string): void {
    this.notifier.notify(hash);
  }

  wait(topic: string, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    const hash = topicHash(topic);
    this.waiting.set(hash, (this.waiting.get(hash) ?? 0) + 1);
    return this.notifier.wait(hash, timeoutMs, signal).finally(() => {
      const n = (this.waiting.get(hash) ?? 1) - 1;
      if (n <= 0) this.waiting.delete(hash);
      else this.waiting.set(hash, n);
    });
  }

  /** Wakes every waiter and stops the listener. */
  async close(): Promise<void> {
    this.notifier.close();
    await this.listener?.close();
  }

  /** After a (re)connect of the listener: notifications sent while it was away are lost. */
  private wakeAll(): void {
    for (const hash of [...this.waiting.keys()]) this.notifier.notify(hash);
  }
}

/** A topic as a NOTIFY payload and a local waiter key: topics may hold U+0000 and any length. */
export function topicHash(topic: string): string {
  return createHash('md5').update(topic).digest('hex');
}

/** The topic hashes of a decision's entity and record (null where it has none): what its NOTIFYs carry and its local waiters wait on. */
export interface DecisionTopics {
  entity: string | null;
  record: string | null;
}

export function decisionTopics(d: { scope: string; key: string | null; entity: string | null }): DecisionTopics {
  return { entity: d.entity === null ? null : topicHash(entityTopic(d.entity)), record: d.key === null ? null : topicHash(recordTopic(d.scope, d.key)) };
}

/** Wakes this replica's waiters on a decision's topics, without waiting for its own NOTIFY to come back. */
export function wakeLocal(wakeups: Pick<PgWakeups, 'notify'>, topics: DecisionTopics): void {
  if (topics.entity !== null) wakeups.notify(topics.entity);
  if (topics.record !== null) wakeups.notify(topics.record);
}
