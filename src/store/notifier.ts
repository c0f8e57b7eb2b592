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
    const set = this.waiters.get(topic);
    if (set === undefined) return;
    this.waiters.delete(topic);
    for (const wake of set) wake();
  }

  wait(topic: string, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    if (this.closed || signal?.aborted || timeoutMs <= 0) return Promise.resolve();
    return new Promise((resolve) => {
      let set = this.waiters.get(topic);
      if (set === undefined) this.waiters.set(topic, (set = new Set()));
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', done);
        set!.delete(done);
        if (set!.size === 0 && this.waiters.get(topic) === set) this.waiters.delete(topic);
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
    for (const topic of [...this.waiters.keys()]) this.notify(topic);
  }
}
