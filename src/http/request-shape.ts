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
 * A `_method` field in the body of a POST, where the frameworks that read
 * one look for it: Rails (Rack::MethodOverride, in every full Rails app)
 * reads it only from a form body, Symfony and Laravel from a form body
 * before the query, Laravel also from a JSON object (its request bag holds
 * the decoded JSON). All of them override POST only. So, unless the route's
 * `allowOverrides` names `_method`, a POST is refused when its body is
 * - a form (`application/x-www-form-urlencoded`, or no Content-Type, which
 *   Rack reads as a form) with a `_method` parameter, named as in the query
 *   (`hasMethodParameter`);
 * - `multipart/form-data` with a part whose `name` is `_method` so named;
 * - JSON (`application/json`, `+json`) whose top-level object has a
 *   `_method` member (as the decoder reads it: `"\u005fmethod"` too).
 * The body is not changed, for the reason the query is not (DESIGN §3.3).
 * Such a body under a `Content-Encoding` (gzip, …) is refused too: the scan
 * would read compressed bytes and see no field, while a server that
 * decompresses request bodies before the framework reads them (Apache's
 * `SetInputFilter DEFLATE` in front of PHP) would see one.
 * Returns the reason for a 400 `invalid-request`, or null.
 */
export function bodyMethodProblem(
  method: string,
  contentType: string | null,
  body: Uint8Array,
  route: Pick<RouteConfig, 'allowOverrides'>,
  contentEncoding: string | null = null,
): string | null {
  if (method !== 'POST' || body.byteLength === 0) return null;
  if (route.allowOverrides.some((n) => n.toLowerCase() === METHOD_QUERY_PARAMETER)) return null;
  const media = (contentType ?? '').split(';')[0]!.trim().toLowerCase();
  const form = media === '' || media === 'application/x-www-form-urlencoded';
  const json = media === 'application/json' || media.endsWith('+json');
  if (
    (form || json || media === 'multipart/form-data') &&
    contentEncoding !== null &&
    contentEncoding.split(',').some((c) => c.trim() !== '' && c.trim().toLowerCase() !== 'identity')
  ) {
    return `the body is ${media === '' ? 'a form' : media} sent with Content-Encoding ${JSON.stringify(contentEncoding.slice(0, 64))}, in which the gateway cannot see whether it holds a "_method" field, which some upstream frameworks (Rails, Symfony, Laravel) take as the method of a POST once their server has decoded the body; send it uncoded, or name _method in the route's allowOverrides`;
  }
  // UTF-8 with replacement: every ASCII byte stays itself, whatever the
  // charset, and no other byte can become one, so no ASCII name is missed.
  const text = new TextDecoder().decode(body);
  let found = false;
  if (form) {
    found = hasMethodParameter(`?${text}`);
  } else if (media === 'multipart/form-data') {
    // Each part's `Content-Disposition: form-data; name="…"` (quoted or not),
    // a header line of its own: anchored at line starts, so the scan stays
    // linear in the body whatever it repeats.
    for (const line of text.matchAll(/^content-disposition[ \t]*:([^\r\n]*)/gim)) {
      for (const m of line[1]!.matchAll(/;\s*name\s*=\s*("[^"]*"|[^;\s]*)/gi)) {
        if (hasMethodParameter(`?${encodeURIComponent(m[1]!.replace(/^"|"$/g, ''))}`)) found = true;
      }
    }
  } else if (json) {
    // No member can decode to `_method` without `method` or an escape in the text.
    if (/method|\\u/i.test(text)) found = topLevelMember(body, METHOD_QUERY_PARAMETER);
  }
  if (!found) return null;
  return 'the body has a "_method" field, which some upstream frameworks (Rails, Symfony, Laravel) take as the method of a POST instead of the one the gateway decided on; send the method in the request line';
}

function topLevelMember(body: Uint8Array, name: string): boolean {
  try {
    const doc: unknown = JSON.parse(new TextDecoder('utf-8').decode(body));
    return doc !== null && typeof doc === 'object' && !Array.isArray(doc) && Object.hasOwn(doc, name);
  } catch {
    return false;
  }
}

/**
 * Whether a parameter of `search` is `_method` as PHP names it: `+` and
 * `%XX` decoded, cut at a NUL, leading spaces dropped, the name before any
 * `[`, spaces and dots read as `_` (`.method`, `%20method`), compared
 * without regard to case. `&` and `;` both separate parameters. Reads more
 * names as `_method` than any one framework does, never fewer.
 *
 * One regular expression over the whole text, each character of the name
 * raw or %-encoded: linear, with no string made per parameter (a form body
 * may hold hundreds of thousands; decoding each name took ~1 µs apiece).
 */
function hasMethodParameter(search: string): boolean {
  return METHOD_PARAMETER.test(search.slice(1));
}

const SPACE = '(?:\\+| |%20)';
const letter = (c: string) => `(?:${c}|%${c.toUpperCase().charCodeAt(0).toString(16)}|%${c.charCodeAt(0).toString(16)})`;
/** A parameter start, leading spaces (PHP drops them), `_` or `.` (PHP reads `.` as `_`), `method`, then the name's end: `=`, the next parameter, `[`, a NUL. */
const METHOD_PARAMETER = new RegExp(`(?:^|[&;])${SPACE}*(?:_|\\.|%5F|%2E)${[...'method'].map(letter).join('')}(?:$|[=&;[\\x00]|%5B|%00)`, 'i');
