/**
 * What the queue worker children share: JSON lines out, commands in, and a
 * `fetch` that stands for a request already on the wire.
 */
import { createInterface } from 'node:readline';

export const reply = (message: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(message)}\n`);

const waiting = new Map<string, () => void>();
const early = new Set<string>();
createInterface({ input: process.stdin }).on('line', (line) => {
  const w = waiting.get(line.trim());
  if (w) {
    waiting.delete(line.trim());
    w();
  } else early.add(line.trim());
});

/** Resolves when the test writes `command` to stdin (also if it already did). */
export function command(name: string): Promise<void> {
  if (early.delete(name)) return Promise.resolve();
  return new Promise((resolve) => waiting.set(name, resolve));
}

/**
 * Announces `sending`, then waits for `go` before the bytes leave: the test
 * freezes the process in between (SIGSTOP), as a GC pause or a suspended VM
 * would freeze a worker whose request had passed every check of its own.
 * The signal is dropped: nothing can recall a request already sent (DESIGN §2).
 */
export function holdingFetch(): typeof fetch {
  return async (input, init) => {
    reply({ msg: 'sending' });
    await command('go');
    return fetch(input, { ...init, signal: null });
  };
}

export function errorFields(err: unknown): Record<string, unknown> {
  const e = err as { name?: unknown; code?: unknown; message?: unknown };
  return { name: e?.name, code: e?.code, message: String(e?.message ?? err) };
}
