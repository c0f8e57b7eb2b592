import type { StoredResponse } from '../../store/types.js';
import { connectionTokens, isHopByHop } from '../forward.js';
import type { Reply } from '../inbound.js';

/** A stored or upstream answer as the caller's Reply; `hop-by-hop` drops the fields that belong to one connection (RFC 9110 §7.6.1). */
export function responseFrom(stored: StoredResponse, filter: 'hop-by-hop' | null): Reply {
  const headers: [string, string][] = [];
  const conn = filter ? connectionTokens(stored.headers.find(([n]) => n.toLowerCase() === 'connection')?.[1]) : new Set<string>();
  for (const [name, value] of stored.headers) {
    if (filter && isHopByHop(name, conn)) continue;
    headers.push([name.toLowerCase(), value]);
  }
  const noBody = stored.status === 204 || stored.status === 304 || (stored.status >= 100 && stored.status < 200);
  return { status: stored.status, headers, body: noBody ? null : stored.body };
}

/** Sets a header of a Reply (names are lower case there), replacing any value it had, as `Headers.set` does. */
export function setHeader(reply: Reply, name: string, value: string): void {
  reply.headers = reply.headers.filter(([n]) => n !== name);
  reply.headers.push([name, value]);
}
