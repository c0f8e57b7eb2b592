import { afterEach, describe, expect, it } from 'vitest';
import { LocalNotifier, setNotifyRelay, wakeFromElsewhere } from '../../src/store/notifier.js';

// The hooks a `serve --workers` group uses to wake a SQLite waiter in one
// worker on a change made in another (src/entry/cluster.ts relayWakeups).
// The notifiers here never poll (an infinite poll), so a wait that ends was
// woken, not timed out.

afterEach(() => setNotifyRelay(null));

function recorder() {
  const calls: string[] = [];
  setNotifyRelay({
    watch: (t) => calls.push(`watch ${t}`),
    unwatch: (t) => calls.push(`unwatch ${t}`),
    changed: (t) => calls.push(`changed ${t}`),
  });
  return calls;
}

describe('LocalNotifier with a relay', () => {
  it('says when the process starts and stops waiting on a topic, once per topic, and reports each local change', async () => {
    const calls = recorder();
    const n = new LocalNotifier(Number.POSITIVE_INFINITY);
    const a = n.wait('entity:e', 60_000);
    const b = n.wait('entity:e', 60_000);
    expect(calls).toEqual(['watch entity:e']);
    n.notify('entity:e');
    await Promise.all([a, b]);
    expect(calls).toEqual(['watch entity:e', 'unwatch entity:e', 'changed entity:e']);
    n.close();
  });

  it('a change reported by another process wakes the waiters here, and is not relayed back', async () => {
    const calls = recorder();
    const n = new LocalNotifier(Number.POSITIVE_INFINITY);
    let woken = false;
    const w = n.wait('record:k', 60_000).then(() => (woken = true));
    wakeFromElsewhere('record:other');
    await Promise.resolve();
    expect(woken).toBe(false);
    wakeFromElsewhere('record:k');
    await w;
    expect(woken).toBe(true);
    expect(calls).toEqual(['watch record:k', 'unwatch record:k']);
    n.close();
  });

  it('negative control: without the relay a change elsewhere reaches no notifier of this process but its own wakes', async () => {
    const n = new LocalNotifier(Number.POSITIVE_INFINITY);
    let woken = false;
    const ac = new AbortController();
    const w = n.wait('entity:x', 60_000, ac.signal).then(() => (woken = true));
    n.notify('entity:y');
    await new Promise((r) => setImmediate(r));
    expect(woken).toBe(false);
    ac.abort();
    await w;
    n.close();
  });

  it('a waiter that gives up (abort) unwatches; a closed notifier is woken no more from elsewhere', async () => {
    const calls = recorder();
    const n = new LocalNotifier(Number.POSITIVE_INFINITY);
    const ac = new AbortController();
    const w = n.wait('entity:z', 60_000, ac.signal);
    ac.abort();
    await w;
    expect(calls).toEqual(['watch entity:z', 'unwatch entity:z']);
    n.close();
    // Resolves at once after close, and nothing is watched.
    await n.wait('entity:z', 60_000);
    expect(calls).toHaveLength(2);
  });
});
