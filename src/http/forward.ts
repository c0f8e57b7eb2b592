/**
 * How the gateway reaches the upstream. The Node entry uses undici; the
 * Workers entry uses `fetch`. The one distinction that matters for safety is
 * whether the request may have reached the upstream (DESIGN §3.7).
 */
export interface UpstreamRequest {
  url: string;
  method: string;
  headers: Record<string, string>;
  body: Uint8Array | null;
  /** Bound on the whole exchange, response body included. */
  timeoutMs: number;
}

export type UpstreamResult =
  | { kind: 'response'; status: number; headers: [string, string][]; body: Uint8Array }
  /** No connection was made: nothing reached the upstream, safe to retry. */
  | { kind: 'refused'; error: string }
  /** Timeout or reset after the request may have been sent: outcome unknown. */
  | { kind: 'unknown'; error: string; timedOut: boolean };

export interface Forwarder {
  forward(request: UpstreamRequest): Promise<UpstreamResult>;
  close?(): Promise<void>;
}

/** The first string `code` on an error or its `cause` chain (Node puts a socket's errno code there); null when none. */
export function causeCode(err: unknown): string | null {
  let e: any = err;
  for (let depth = 0; e && depth < 4; depth++, e = e.cause) {
    if (typeof e.code === 'string') return e.code;
  }
  return null;
}

/** RFC 9110 §7.6.1 hop-by-hop fields, plus ones the transport sets itself. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'host',
  'content-length',
  'expect',
  'http2-settings',
]);

/** Drops hop-by-hop fields, including any the `Connection` header names. */
export function isHopByHop(name: string, connectionTokens: ReadonlySet<string>): boolean {
  const lower = name.toLowerCase();
  return HOP_BY_HOP.has(lower) || connectionTokens.has(lower);
}

export function connectionTokens(connection: string | null | undefined): Set<string> {
  return new Set(
    (connection ?? '')
      .split(',')
      .map((t) => t.trim().toLowerCase())
      .filter(Boolean),
  );
}
