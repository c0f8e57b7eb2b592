import type { RouteConfig } from '../config/schema.js';
import { METHOD_QUERY_PARAMETER } from '../protocol/headers.js';
import type { HeaderReader } from './inbound.js';

/**
 * What Node's HTTP parser leaves to the gateway. The parser already refuses
 * Content-Length with Transfer-Encoding, two lengths, obs-fold, bare LF and
 * a Transfer-Encoding whose last coding is not chunked; these three get
 * through it, and each would let the upstream see a request other than the
 * one the gateway decided on:
 *
 * - Transfer-Encoding with a coding besides chunked (`gzip, chunked`): Node
 *   removes the chunking but not the gzip, and Transfer-Encoding is hop-by-hop,
 *   so the upstream would receive compressed bytes that nothing announces
 *   (RFC 9112 §6.1: a server SHOULD refuse a coding it does not understand).
 * - More than one Host (RFC 9112 §3.2: a server MUST answer 400): proxies in
 *   front that pick different copies disagree on what the command was for.
 * - A dot segment hidden behind an encoded separator (`/payments/..%2Fadmin`,
 *   `..%5C`): URL parsing keeps the path inside the route, while an upstream
 *   that decodes %2F or %5C resolves it outside (a route with fence "off" on
 *   the same upstream would otherwise reach fenced paths unfenced).
 *   An encoded slash inside a segment (`/invoices/inv%2F10/pay`) is fine.
 *
 * And one the request line carries: a `_method` query parameter, which PHP
 * frameworks (Symfony, Laravel) read as the method (../protocol/headers.ts
 * OVERRIDE_FIELDS). Refused rather than removed: removing it would forward
 * a query other than the one the caller sent and the fingerprint covers.
 * Allowed when the route's `allowOverrides` names `_method`.
 *
 * Returns the reason for a 400 `invalid-request`, or null.
 */
export function requestShapeProblem(headers: HeaderReader, pathname: string, search = '', route?: Pick<RouteConfig, 'allowOverrides'>): string | null {
  const te = headers.get('transfer-encoding');
  if (te !== null && te.trim().toLowerCase() !== 'chunked') {
    return `Transfer-Encoding "${te}" is not accepted: only chunked (another coding would reach the upstream undecoded and unannounced)`;
  }
  // Headers joins repeated fields with ", "; a host name never contains a comma.
  if (headers.get('host')?.includes(',')) return 'more than one Host header (RFC 9112 §3.2)';
  if (/%(2f|5c)/i.test(pathname)) {
    const segments = pathname.replace(/%2e/gi, '.').split(/\/|\\|%2f|%5c/i);
    if (segments.some((s) => s === '.' || s === '..')) {
      return 'the path hides a dot segment behind an encoded separator (%2F or %5C): an upstream that decodes it would resolve it outside the route';
    }
  }
  if (search.length > 1 && hasMethodParameter(search) && !route?.allowOverrides.some((n) => n.toLowerCase() === METHOD_QUERY_PARAMETER)) {
    return 'the query has a "_method" parameter, which some upstream frameworks (Symfony, Laravel) take as the request method instead of the one the gateway decided on; send the method in the request line';
  }
  return null;
}

/**
 * Whether a parameter of `search` is `_method` as PHP names it: `+` and
 * `%XX` decoded, cut at a NUL, leading spaces dropped, the name before any
 * `[`, spaces and dots read as `_` (`.method`, `%20method`), compared
 * without regard to case. `&` and `;` both separate parameters. Reads more
 * names as `_method` than any one framework does, never fewer.
 */
function hasMethodParameter(search: string): boolean {
  for (const part of search.slice(1).split(/[&;]/)) {
    const eq = part.indexOf('=');
    let name = (eq === -1 ? part : part.slice(0, eq)).replace(/\+/g, ' ');
    if (name.includes('%')) name = name.replace(/(?:%[0-9A-Fa-f]{2})+/g, decodeRun);
    name = name.split('\0')[0]!.replace(/^ +/, '').split('[')[0]!.replace(/[ .]/g, '_');
    if (name.toLowerCase() === METHOD_QUERY_PARAMETER) return true;
  }
  return false;
}

function decodeRun(run: string): string {
  try {
    return decodeURIComponent(run);
  } catch {
    // Not UTF-8: byte by byte, as latin1 (a name with such bytes is never `_method`, but its ASCII bytes still count).
    return run.replace(/%([0-9A-Fa-f]{2})/g, (_m, h: string) => String.fromCharCode(parseInt(h, 16)));
  }
}
