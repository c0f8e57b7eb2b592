/**
 * The request path the gateway routes, fingerprints and forwards (DESIGN §3,
 * step 1), and the other ways an upstream might read it.
 *
 * Routing on the path as sent lets an encoding pick the route: `/%70ayments/a`
 * is `/payments/a` to any upstream that decodes `%70` (RFC 3986 §6.2.2.2 says
 * they are equivalent), yet it does not match `/payments/*` literally and would
 * fall through to a broader route with no fence. So the gateway first brings
 * the path to its RFC 3986 §6.2.2 normal form, and routes and forwards that.
 *
 * Some readings are not equivalences but habits of particular servers, and no
 * single normal form can hold them all: decoding `%2F` or `%5C` into a
 * separator, dropping `;params` from a segment (Tomcat and other Java
 * servlet containers), merging `//` (nginx's `merge_slashes`).
 * `alternativeReadings` lists them; the proxy refuses a path whose
 * alternatives would be routed differently (./router.ts `divergentReading`).
 * A raw `\` never gets this far on Node (../entry/node-listener.ts refuses
 * it, as @hono/node-server does); elsewhere URL parsing has made it `/`.
 */

/** RFC 3986 §2.3 unreserved characters: their percent-encodings are equivalent to them. */
const UNRESERVED = /^[A-Za-z0-9._~-]$/;

/**
 * RFC 3986 §6.2.2 normal form of a path as URL parsing leaves it (WHATWG
 * `URL.pathname`): percent-encoded unreserved characters decoded, the hex of
 * every other percent-encoding upper-cased, and the dot segments that
 * decoding produced removed (§5.2.4). `%25` stays `%25`: nothing is decoded
 * twice. A `%` not followed by two hex digits is left as it is.
 *
 * @example
 * normalizePath('/%70ayments/a%2fb') // '/payments/a%2Fb'
 */
export function normalizePath(pathname: string): string {
  if (!pathname.includes('%') && !pathname.includes('/.')) return pathname;
  const decoded = pathname.replace(/%([0-9A-Fa-f]{2})/g, (_m, hex: string) => {
    const ch = String.fromCharCode(parseInt(hex, 16));
    return UNRESERVED.test(ch) ? ch : `%${hex.toUpperCase()}`;
  });
  return removeDotSegments(decoded);
}

/** RFC 3986 §5.2.4 for an absolute path: `.` dropped, `..` drops the segment before it (never past the root). */
export function removeDotSegments(path: string): string {
  if (!path.startsWith('/') || !/(^|\/)\.\.?(\/|$)/.test(path)) return path;
  const input = path.split('/');
  const out: string[] = [];
  for (let i = 1; i < input.length; i++) {
    const s = input[i]!;
    if (s === '.' || s === '..') {
      if (s === '..') out.pop();
      // `/a/b/..` is `/a/`: the last segment resolved away leaves its slash.
      if (i === input.length - 1) out.push('');
    } else {
      out.push(s);
    }
  }
  return `/${out.join('/')}`;
}

/** A way some upstream might read a path other than its normal form. */
interface Reading {
  applies(path: string): boolean;
  apply(path: string): string;
}

const READINGS: Reading[] = [
  // An encoded slash or backslash taken as a separator (many servers decode
  // the path before splitting it; IIS and others take `\` for `/`).
  { applies: (p) => /%2F/.test(p), apply: (p) => removeDotSegments(p.replace(/%2F/g, '/')) },
  { applies: (p) => /%5C/.test(p), apply: (p) => removeDotSegments(p.replace(/%5C/g, '/')) },
  // Path parameters dropped from each segment (`/payments;x/a`, `/..;/`), as
  // servlet containers do before matching.
  { applies: (p) => p.includes(';'), apply: (p) => removeDotSegments(p.replace(/;[^/]*/g, '')) },
  // Empty segments merged (`//payments/a` is `/payments/a` to nginx).
  { applies: (p) => p.includes('//'), apply: (p) => p.replace(/\/{2,}/g, '/') },
  // A trailing slash dropped (Express and most frameworks route `/a/b/` as
  // `/a/b` unless told to be strict). Only dropped: no upstream adds one.
  { applies: (p) => p.length > 1 && p.endsWith('/'), apply: (p) => p.replace(/\/+$/, '') || '/' },
];

/**
 * The other readings of `path` (already normal) that an upstream might
 * apply, alone and combined, without `path` itself.
 */
export function alternativeReadings(path: string): string[] {
  const applicable = READINGS.filter((r) => r.applies(path));
  if (applicable.length === 0) return [];
  const out = new Set<string>();
  // Every subset, in a fixed order: at most 2^4 readings, and only for a path
  // that has the characters they act on.
  for (let mask = 1; mask < 1 << applicable.length; mask++) {
    let p = path;
    applicable.forEach((r, i) => {
      if (mask & (1 << i)) p = r.apply(p);
    });
    out.add(p);
  }
  out.delete(path);
  return [...out];
}
