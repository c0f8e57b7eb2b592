/**
 * Which network errors prove that a request never left this machine, for
 * every side that has to tell (the gateway's forwarders, `fencedFetch`,
 * `fencedMcp`): nothing was sent, so nothing happened upstream, a retry is
 * safe and no record becomes outcome_unknown (DESIGN §3.7; §6.4 for the
 * worker side). Any other failure after a connection may have carried the
 * request is "maybe sent".
 */

/**
 * The error codes (Node's `fetch` puts them in `cause.code`) that only a
 * connect raises. Not EHOSTUNREACH or ENETUNREACH: Linux also reports them
 * on an open connection whose retransmissions ran out, and `fetch` does not
 * say whether the request was written by then (the gateway's undici
 * forwarder can tell, and trusts them before its first byte:
 * src/http/forward-undici.ts).
 */
export const CONNECT_ONLY_CODES: ReadonlySet<string> = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EADDRNOTAVAIL', 'UND_ERR_CONNECT_TIMEOUT']);

/** The first string `code` on an error or its `cause` chain (Node puts a socket's errno code there); null when none. */
export function causeCode(err: unknown): string | null {
  let e: any = err;
  for (let depth = 0; e && depth < 4; depth++, e = e.cause) {
    if (typeof e.code === 'string') return e.code;
  }
  return null;
}

/** Whether a failed `fetch` (or a client built on it) never connected, so never sent its request. */
export function neverConnected(err: unknown): boolean {
  const code = causeCode(err);
  return code !== null && CONNECT_ONLY_CODES.has(code);
}
