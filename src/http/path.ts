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
 * single normal form can hold them all: decoding `%uXXXX` (IIS), `%2F` or `%5C` into a
 * separator, decoding twice (`%252F`), dropping `;params` from a segment
 * (Tomcat and other Java servlet containers), dropping trailing dots and
 * spaces from a segment (IIS), folding non-ASCII letters to ASCII (`ſ`, the
 * Kelvin sign, fullwidth forms), merging `//` (nginx's `merge_slashes`).
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

/**
 * Tried in this order, each on the path and on what the readings before it
 * made of it (so `%252F` is first decoded once more, then read as a
 * separator).
 */
const READINGS: Reading[] = [
  // `%uXXXX` decoded to the character it names (IIS and classic ASP.NET's
  // `UrlDecode`): `%u002F` is `%2F` to the readings after it, `%u002e` is
  // `.`, `%u0070` is `p`.
  { applies: (p) => /%u[0-9A-Fa-f]{4}/i.test(p), apply: (p) => removeDotSegments(normalizePath(p.replace(/%u([0-9A-Fa-f]{4})/gi, percentU))) },
  // Non-ASCII letters read as the ASCII ones they fold or normalise to: `ſ`
  // (U+017F) is `s` and the Kelvin sign is `K` to case-insensitive matching
  // (.NET, Go's EqualFold), fullwidth `ｐ` is `p` and `／` is `/` to NFKC and
  // to Windows' best-fit mapping (IIS).
  { applies: (p) => /%[C-F][0-9A-F]%[89AB][0-9A-F]/.test(p), apply: (p) => removeDotSegments(p.replace(/(?:%[0-9A-F]{2})+/g, foldRun)) },
  // Decoded twice (a server that decodes the path before a framework decodes
  // it again): `%252F` is `%2F`, `%252e%252e` is `..`.
  { applies: (p) => p.includes('%25'), apply: (p) => normalizePath(p.replace(/%25/g, '%')) },
  // An encoded slash or backslash taken as a separator (many servers decode
  // the path before splitting it; IIS and others take `\` for `/`).
  { applies: (p) => /%2F/.test(p), apply: (p) => removeDotSegments(p.replace(/%2F/g, '/')) },
  { applies: (p) => /%5C/.test(p), apply: (p) => removeDotSegments(p.replace(/%5C/g, '/')) },
  // Path parameters dropped from each segment (`/payments;x/a`, `/..;/`), as
  // servlet containers do before matching.
  { applies: (p) => p.includes(';'), apply: (p) => removeDotSegments(p.replace(/;[^/]*/g, '')) },
  // Trailing dots and spaces dropped from each segment, as Windows does with
  // file names (IIS): `/payments./a` and `/payments%20/a` are `/payments/a`.
  {
    applies: (p) => /(?:\.|%20)(?:\/|$)/.test(p),
    apply: (p) =>
      p
        .split('/')
        .map((s) => (s === '.' || s === '..' ? s : s.replace(/(?:\.|%20)+$/, '')))
        .join('/'),
  },
  // Empty segments merged (`//payments/a` is `/payments/a` to nginx).
  { applies: (p) => p.includes('//'), apply: (p) => p.replace(/\/{2,}/g, '/') },
  // A trailing slash dropped (Express and most frameworks route `/a/b/` as
  // `/a/b` unless told to be strict). Only dropped: no upstream adds one.
  { applies: (p) => p.length > 1 && p.endsWith('/'), apply: (p) => p.replace(/\/+$/, '') || '/' },
];

/**
 * The other readings of `path` (already normal) that an upstream might
 * apply, alone and combined (in READINGS order), without `path` itself.
 */
export function alternativeReadings(path: string): string[] {
  return readingsWithin(path, Infinity)!;
}

/**
 * How many characters of readings the gateway computes for one request
 * (the path's length once per reading applied, kept or not): 128 KiB.
 * Up to 2^9 combinations, each costing the path's length in every later
 * reading and a route match: a 16 KB path with every kind of ambiguity
 * took ~90 ms of the event loop, its plain form ~1 ms, so a client could
 * stall the gateway with a few such requests a second. Within the bound
 * the check costs a few milliseconds at most; an ordinary long path (few
 * readings) stays far below it (DESIGN §3.1).
 */
export const MAX_READING_CHARS = 128 * 1024;

/** `alternativeReadings`, or null once computing them would pass `maxChars` (MAX_READING_CHARS): the request is refused unread. */
export function readingsWithin(path: string, maxChars: number = MAX_READING_CHARS): string[] | null {
  const out = new Set<string>([path]);
  let spent = 0;
  for (const r of READINGS) {
    // Every reading so far, this one applied to each where it can: every
    // combination, in order, for at most 2^9 readings, and only for a path
    // that has the characters they act on.
    for (const p of [...out]) {
      if (!r.applies(p)) continue;
      spent += p.length;
      if (spent > maxChars) return null;
      out.add(r.apply(p));
    }
  }
  out.delete(path);
  return [...out];
}

/**
 * A run of percent-encodings with each non-ASCII character that folds or
 * NFKC-normalises to ASCII replaced by that ASCII (`/` and `.` raw, `\` as
 * `/`, other characters outside the unreserved set encoded again); the
 * rest, and a run that is not UTF-8, stay as they were.
 */
function foldRun(run: string): string {
  let text: string;
  try {
    text = decodeURIComponent(run);
  } catch {
    return run;
  }
  let out = '';
  let changed = false;
  for (const ch of text) {
    // ASCII in a run is encoded (normal form decoded the unreserved ones): as it was.
    if (ch.charCodeAt(0) < 0x80) {
      out += hexEncoded(ch);
      continue;
    }
    const ascii = asciiFold(ch);
    if (ascii === null) {
      out += encodeURIComponent(ch).toUpperCase();
      continue;
    }
    changed = true;
    for (const c of ascii) out += c === '\\' ? '/' : UNRESERVED.test(c) || c === '/' ? c : hexEncoded(c);
  }
  return changed ? out : run;
}

/** `%uXXXX` as RFC 3986 writes the character: itself if unreserved, else its percent-encoded UTF-8 (`/` as `%2F`; a lone surrogate as U+FFFD, as a decoder would take it). */
function percentU(_m: string, hex: string): string {
  const ch = String.fromCharCode(parseInt(hex, 16));
  return ch >= '\ud800' && ch <= '\udfff' ? '%EF%BF%BD' : encodeURIComponent(ch);
}

function hexEncoded(c: string): string {
  return `%${c.charCodeAt(0).toString(16).toUpperCase().padStart(2, '0')}`;
}

/** What a non-ASCII character is in ASCII to NFKC, or to case folding after it (`ı` is `I`); null when neither gives ASCII. */
function asciiFold(ch: string): string | null {
  const n = ch.normalize('NFKC');
  for (const candidate of [n, n.toUpperCase(), n.toLowerCase()]) if (/^[\x00-\x7f]+$/.test(candidate)) return candidate;
  return null;
}
