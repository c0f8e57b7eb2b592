/**
 * Whether the store's round trips are being answered: down after one that
 * the server never answered (the client-side bound passed, the connection
 * was lost or could not be made within `connectionTimeoutMs`), up again after
 * the next one that was answered. A statement the server answered with an
 * ERROR (a lock timeout, a constraint) is an answer: the database is there.
 * Only the changes are reported (for the log), not every failed call.
 */
export class RoundTripHealth {
  #healthy = true;
  #onChange: (healthy: boolean, err: Error | null) => void;

  constructor(onChange: (healthy: boolean, err: Error | null) => void = () => {}) {
    this.#onChange = onChange;
  }

  get healthy(): boolean {
    return this.#healthy;
  }

  answered(): void {
    if (this.#healthy) return;
    this.#healthy = true;
    this.#onChange(true, null);
  }

  failed(err: unknown): void {
    if (serverAnswered(err) || !this.#healthy) return;
    this.#healthy = false;
    this.#onChange(false, err instanceof Error ? err : new Error(String(err)));
  }
}

/**
 * A fault of the driver's serialisation (a string past V8's longest, a value
 * it cannot convert) is thrown before the statement is written: a RangeError
 * or TypeError without a SQLSTATE. A connection or server error is never one.
 * Here beside the health that counts it as an answer: ./query.ts imports the
 * health, so in ./query.ts the two modules would import each other.
 */
export function unsentFault(err: unknown): boolean {
  return (err instanceof RangeError || err instanceof TypeError) && !('code' in err);
}

/**
 * An ERROR answer from the server (a SQLSTATE with severity ERROR), or a
 * fault of the driver before anything was sent (`unsentFault` above):
 * not a fault of the round trip itself.
 */
function serverAnswered(err: unknown): boolean {
  if (unsentFault(err)) return true;
  const e = err as { code?: unknown; severity?: unknown } | null;
  return e !== null && typeof e === 'object' && typeof e.code === 'string' && e.severity === 'ERROR';
}
