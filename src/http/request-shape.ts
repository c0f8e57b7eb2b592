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
 * Returns the reason for a 400 `invalid-request`, or null.
 */
export function requestShapeProblem(headers: HeaderReader, pathname: string): string | null {
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
  return null;
}
