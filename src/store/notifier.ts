/**
 * Wakes waiters in this process when a topic changes, and otherwise lets
 * them re-check after `pollMs` (the change may come from another process
 * sharing the database). A wake-up is only a hint: the caller re-runs its
 * atomic decision, so a spurious or missed one costs time, never safety.
 */
export class LocalNotifier {
  private readonly waiters = new Map<string, Set<() => void>>();
  private closed = false;

  constructor(private readonly pollMs: number) {}

  notify(topic: string): void {
    this.wake(topic);
    relay?.changed(topic);
  }

  /** Wakes this notifier's waiters for `topic` (a change here, or one another process reported). */
  wake(topic: string): void {
    const set = this.waiters.get(topic);
    if (set === undefined) return;
    this.waiters.delete(topic);
    if (this.waiters.size === 0) notifiers.delete(this);
    relay?.unwatch(topic);
    for (const wake of set) wake();
  }

  wait(topic: string, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    if (this.closed || signal?.aborted || timeoutMs <= 0) return Promise.resolve();
    return new Promise((resolve) => {
      let set = this.waiters.get(topic);
      if (set === undefined) {
        this.waiters.set(topic, (set = new Set()));
        if (relay !== null) {
          // Known to wakeFromElsewhere only while it has waiters: a notifier never closed is never kept.
          notifiers.add(this);
          relay.watch(topic);
        }
      }
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', done);
        set!.delete(done);
        if (set!.size === 0 && this.waiters.get(topic) === set) {
          this.waiters.delete(topic);
          if (this.waiters.size === 0) notifiers.delete(this);
          relay?.unwatch(topic);
        }
        resolve();
      };
      const timer = setTimeout(done, Math.min(timeoutMs, this.pollMs));
      signal?.addEventListener('abort', done, { once: true });
      set.add(done);
    });
  }

  /** Wakes everyone; later waits resolve at once. */
  close(): void {
    this.closed = true;
    notifiers.delete(this);
    for (const topic of [...this.waiters.keys()]) this.wake(topic);
  }
}

/**
 * Waiters woken by changes in other processes of a `serve --workers` group
 * on one SQLite file (src/entry/cluster.ts relays them through the group's
 * primary): `watch`/`unwatch` when this process starts or stops waiting on
 * a topic, `changed` on each change made here. Only a hint, as a local
 * wake-up is: a change whose relay is missed or late is seen at the next
 * poll. Without a relay (one process, PostgreSQL's LISTEN) nothing changes.
 */
export interface NotifyRelay {
  watch(topic: string): void;
  unwatch(topic: string): void;
  changed(topic: string): void;
}

let relay: NotifyRelay | null = null;
const notifiers = new Set<LocalNotifier>();

/** Installs (or, with null, removes) the process's relay; waits begun before it are not relayed (they end at their poll). */
export function setNotifyRelay(r: NotifyRelay | null): void {
  relay = r;
}

/** A change another process reported: wakes this process's waiters for it, without relaying it back. */
export function wakeFromElsewhere(topic: string): void {
  for (const n of notifiers) n.wake(topic);
}
