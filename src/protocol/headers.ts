/**
 * Parsing of the wire contract's request headers (DESIGN §3). Every function
 * is strict and total: it returns a value or a refusal, never throws, and
 * accepts exactly one canonical form, so that two gateways (or a gateway and
 * a cooperating upstream) can never read one header two ways.
 */

/** 2^63 − 1: fences are signed 64-bit integers in every store. */
export const MAX_FENCE = 9223372036854775807n;

export type Parsed<T> = { ok: true; value: T } | { ok: false; reason: string };

/** Canonical decimal: `0` or no leading zero; no sign, spaces, decimals or exponent. */
const CANONICAL_DECIMAL = /^(0|[1-9][0-9]{0,18})$/;

/**
 * `X-Execution-Fence`: a decimal integer 0 … 2^63−1. Several values (HTTP
 * joins repeated headers with ", "), a leading `+`, leading zeros, spaces
 * inside, decimals and exponents are all refused.
 */
export function parseFence(raw: string): Parsed<bigint> {
  if (!CANONICAL_DECIMAL.test(raw)) {
    return { ok: false, reason: 'the fence must be one decimal integer from 0 to 9223372036854775807, without sign, leading zeros or spaces' };
  }
  const value = BigInt(raw);
  if (value > MAX_FENCE) return { ok: false, reason: 'the fence exceeds 9223372036854775807 (2^63-1)' };
  return { ok: true, value };
}

/** Printable ASCII (RFC 9110 VCHAR) and the space. */
const PRINTABLE = /^[\x20-\x7e]*$/;

/**
 * The fence entity: 1–512 bytes of printable ASCII, no leading or trailing
 * space (a header value cannot carry them unambiguously).
 */
export function parseEntity(raw: string, what = 'the entity'): Parsed<string> {
  if (raw.length === 0) return { ok: false, reason: `${what} is empty` };
  if (!PRINTABLE.test(raw)) return { ok: false, reason: `${what} must be printable ASCII` };
  if (raw.length > 512) return { ok: false, reason: `${what} is longer than 512 bytes` };
  if (raw !== raw.trim()) return { ok: false, reason: `${what} has leading or trailing spaces` };
  return { ok: true, value: raw };
}

/** A route's `maxKeyLength` by default, and the most it may be set to. */
export const DEFAULT_MAX_KEY_LENGTH = 255;
export const MAX_KEY_LENGTH_LIMIT = 1024;

/**
 * `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header: the value is
 * an RFC 8941 sf-string). A quoted value (`"abc"`, with `\"` and `\\`
 * escapes) is unquoted, and every character inside the quotes is the key's,
 * spaces at either end included: `" padded key "` is the key ` padded key `.
 * A bare value is taken as it is, for the many clients that send one; it may
 * not contain `"` or `,` (a comma is how HTTP joins repeated headers, so a key
 * with a comma must be quoted), nor start or end with a space: HTTP strips
 * whitespace around a field value (RFC 9110 §5.5), so such spaces were never
 * part of what the client meant and a parser that kept them would read
 * another key than the upstream. Then the key rules of `checkKey`.
 */
export function parseIdempotencyKey(raw: string, maxLength = DEFAULT_MAX_KEY_LENGTH): Parsed<string> {
  let key: string;
  if (raw.startsWith('"')) {
    const unq = unquoteSfString(raw);
    if (unq === null) return { ok: false, reason: 'the key is not a valid quoted string (RFC 8941 sf-string), or there are several keys' };
    key = unq;
  } else {
    if (/[",]/.test(raw)) return { ok: false, reason: 'an unquoted key may not contain `"` or `,` (several keys were sent, or the key needs quoting)' };
    if (raw !== raw.trim())
      return {
        ok: false,
        reason:
          'an unquoted key has leading or trailing spaces, which HTTP does not count as part of a header value; send the key as a quoted string to keep them',
      };
    key = raw;
  }
  return checkKey(key, maxLength);
}

/**
 * The rules every key obeys, however it arrived (a header, or a JSON body
 * field with `idempotencyKeyFrom`): 1–`maxLength` printable ASCII characters
 * (RFC 9110 VCHAR and the space), not exactly `.` or `..`.
 */
export function checkKey(key: string, maxLength = DEFAULT_MAX_KEY_LENGTH): Parsed<string> {
  if (key.length === 0) return { ok: false, reason: 'the key is empty' };
  if (key.length > maxLength) return { ok: false, reason: `the key is longer than ${maxLength} characters` };
  if (!PRINTABLE.test(key)) return { ok: false, reason: 'the key must be printable ASCII' };
  // URLs resolve a path segment "." or ".." away (also when written %2E), so
  // the admin API (GET /v1/idempotency/:key, …/resolve) could never name the
  // record: an outcome_unknown one could not be settled.
  if (key === '.' || key === '..') return { ok: false, reason: 'the keys "." and ".." cannot be named in a URL path (the admin API looks records up by key)' };
  return { ok: true, value: key };
}

/**
 * A key as a header value that `parseIdempotencyKey` reads back as the same
 * key: bare when it can be, else an sf-string (`echoKey`).
 */
export function formatIdempotencyKey(key: string): string {
  if (/^[\x21\x23-\x2b\x2d-\x7e]+$/.test(key)) return key;
  return `"${key.replace(/["\\]/g, '\\$&')}"`;
}

/**
 * Headers the gateway writes itself or HTTP frames a message with. A key read
 * from one of them is not the key the upstream sees: the gateway replaces a
 * caller's `X-Request-Id` with its own id upstream (../http/request-id.ts),
 * sets `X-Fence-Entity` and the fence header from what it decided, writes its
 * own trace context (`traceparent`, `tracestate`) when tracing is on, drops
 * the caller's `Authorization` when it checks caller auth, drops a route's
 * `stripHeaders`, and a hop-by-hop header never reaches the upstream. With
 * `onUnknown: "retry"` an upstream that deduplicates by the header would
 * then see two ids for one key. So such a key header is refused at start-up
 * (`keyHeaderCollision`), and so is such a `keyScope` header
 * (`keyScopeCollision`): the gateway would scope the key by one tenant while
 * the upstream acts for the tenant it is sent.
 */
const GATEWAY_HEADERS = ['x-request-id', 'x-fence-entity', 'idempotent-replayed', 'traceparent', 'tracestate'];
const FRAMING_HEADERS = [
  'host',
  'content-length',
  'content-type',
  'content-encoding',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'te',
  'trailer',
  'upgrade',
  'proxy-connection',
  'proxy-authorization',
  'proxy-authenticate',
];

/**
 * Request fields that some upstream stacks read as the request's real path
 * or method: IIS URL Rewrite and Symfony or Laravel behind trusted proxies
 * take `X-Original-URL` / `X-Rewrite-URL` for the path; Symfony, Laravel,
 * ASP.NET and many Express or Rails setups take the method from
 * `X-HTTP-Method-Override`, `X-HTTP-Method` or `X-Method-Override`, and PHP
 * frameworks, and Rails, from a `_method` query parameter or POST body
 * field (../http/request-shape.ts). The gateway routes and
 * fences on the request line, so an upstream that honoured them would act on
 * another route's path, or with another method, under this route's policy
 * (a POST to an unfenced route acting on a fenced path). Unless a route's
 * `allowOverrides` names one, the headers are not forwarded
 * (../http/upstream-request.ts) and the query parameter is refused
 * (../http/request-shape.ts); DESIGN §3.3, §3.6.
 */
export const OVERRIDE_FIELDS = ['X-Original-URL', 'X-Rewrite-URL', 'X-HTTP-Method-Override', 'X-HTTP-Method', 'X-Method-Override', '_method'] as const;

/** The query parameter of OVERRIDE_FIELDS; the others are headers. */
export const METHOD_QUERY_PARAMETER = '_method';

/**
 * A request header's name as CGI-style stacks see it (`X_Original_URL` is
 * `HTTP_X_ORIGINAL_URL`, the same variable as `X-Original-URL`), lower case,
 * for comparing with OVERRIDE_FIELDS.
 */
export function overrideHeaderName(name: string): string {
  return name.toLowerCase().replace(/_/g, '-');
}

/**
 * Response headers that mean something to a client or a cache besides the
 * key (`echoKey` would write the key into them): cookies, redirects, caching,
 * content metadata, authentication challenges, CORS and security policy.
 */
const RESPONSE_SIGNIFICANT = [
  'set-cookie',
  'set-cookie2',
  'location',
  'content-location',
  'refresh',
  'link',
  'vary',
  'etag',
  'last-modified',
  'cache-control',
  'expires',
  'age',
  'date',
  'retry-after',
  'www-authenticate',
  'authentication-info',
  'strict-transport-security',
  'alt-svc',
  'clear-site-data',
  'server',
  'allow',
];
const RESPONSE_SIGNIFICANT_PREFIXES = ['content-', 'access-control-', 'cross-origin-', 'x-frame-', 'x-content-'];

/** What `keyHeaderCollision` needs of a route (a subset of its config). */
export interface KeyHeaderRoute {
  idempotency: string;
  idempotencyHeader: string;
  fenceHeader: string;
  entity: { header: string } | object;
  upstreamHeaders: Record<string, unknown>;
  stripHeaders?: string[];
  allowOverrides?: string[];
  keyScope?: { header: string } | { claim: string } | undefined;
  echoKey?: boolean;
}

/** Whether the gateway checks caller auth (it then drops the caller's `Authorization` upstream). */
export interface CollisionContext {
  auth: boolean;
}

/** Why a route's `idempotencyHeader` cannot carry its key unchanged to the upstream, or null. */
export function keyHeaderCollision(route: KeyHeaderRoute, context: CollisionContext = { auth: false }): string | null {
  if (route.idempotency === 'off') return null;
  const name = route.idempotencyHeader.toLowerCase();
  const said = `"${route.idempotencyHeader}"`;
  if (route.keyScope !== undefined && 'header' in route.keyScope && name === route.keyScope.header.toLowerCase())
    return `${said} is also this route's keyScope header`;
  return rewrittenHeader(name, said, route, context);
}

/** Why a route's `keyScope.header` cannot carry its value unchanged to the upstream, or null (always null for a claim scope: no header). */
export function keyScopeCollision(route: KeyHeaderRoute, context: CollisionContext = { auth: false }): string | null {
  if (route.keyScope === undefined || !('header' in route.keyScope) || route.idempotency === 'off') return null;
  return rewrittenHeader(route.keyScope.header.toLowerCase(), `"${route.keyScope.header}"`, route, context);
}

/** Why `echoKey` may not write the key into the route's key header on answers, or null. */
export function echoKeyCollision(route: KeyHeaderRoute): string | null {
  if (route.echoKey !== true || route.idempotency === 'off') return null;
  const name = route.idempotencyHeader.toLowerCase();
  if (RESPONSE_SIGNIFICANT.includes(name) || RESPONSE_SIGNIFICANT_PREFIXES.some((p) => name.startsWith(p))) {
    return `"${route.idempotencyHeader}" means something else in a response (cookies, redirects, caching, content or security metadata); echoKey would write the key into it. Use Idempotency-Key or another header of your own, or leave echoKey off`;
  }
  return null;
}

/**
 * Why a header a route lists in `credentialHeaders` cannot scope its keys by
 * what the upstream sees, or null: the scope must be the credential the
 * upstream authenticates the caller by, so it must reach the upstream as
 * sent (the checks of the key header).
 */
export function credentialHeaderCollision(route: KeyHeaderRoute, header: string, context: CollisionContext = { auth: false }): string | null {
  const name = header.toLowerCase();
  const said = `"${header}"`;
  if (name === route.idempotencyHeader.toLowerCase()) return `${said} is this route's idempotencyHeader, not a credential`;
  return rewrittenHeader(name, said, route, context);
}

function rewrittenHeader(name: string, said: string, route: KeyHeaderRoute, context: CollisionContext): string | null {
  if (GATEWAY_HEADERS.includes(name))
    return `${said} is a header the gateway writes itself (its own X-Request-Id, X-Fence-Entity and trace context), so the upstream would not see the value sent; use Idempotency-Key or another header of your own`;
  if (name === route.fenceHeader.toLowerCase()) return `${said} is also this route's fenceHeader`;
  if ('header' in route.entity && name === route.entity.header.toLowerCase()) return `${said} is also this route's entity header`;
  if (FRAMING_HEADERS.includes(name)) return `${said} frames the HTTP message (or is hop-by-hop) and does not reach the upstream as sent`;
  if (context.auth && name === 'authorization') return `${said} carries the caller's credentials, which the gateway checks and does not forward`;
  if ((route.stripHeaders ?? []).some((h) => h.toLowerCase() === name)) return `${said} is in this route's stripHeaders, so it never reaches the upstream`;
  if (
    OVERRIDE_FIELDS.some((f) => f.toLowerCase() === overrideHeaderName(name)) &&
    !(route.allowOverrides ?? []).some((f) => overrideHeaderName(f) === overrideHeaderName(name))
  ) {
    return `${said} is a path or method override header, which the gateway does not forward unless the route's allowOverrides names it`;
  }
  if (Object.keys(route.upstreamHeaders).some((h) => h.toLowerCase() === name)) return `${said} is replaced by this route's upstreamHeaders`;
  return null;
}

/** RFC 8941 §4.2.5: the whole input must be exactly one sf-string. */
function unquoteSfString(raw: string): string | null {
  let out = '';
  for (let i = 1; i < raw.length; i++) {
    const ch = raw[i]!;
    if (ch === '\\') {
      const next = raw[++i];
      if (next !== '"' && next !== '\\') return null;
      out += next;
    } else if (ch === '"') {
      return i === raw.length - 1 ? out : null;
    } else if (ch < '\x20' || ch > '\x7e') {
      return null;
    } else {
      out += ch;
    }
  }
  return null; // no closing quote
}

/**
 * `Prefer: wait=N` (RFC 7240 §4.3): the number of seconds the client is
 * willing to wait, or null. Other preferences are ignored; a malformed wait
 * is ignored too (a preference is a hint, never an error).
 */
export function parsePreferWait(raw: string | undefined): number | null {
  if (raw === undefined) return null;
  for (const part of raw.split(',')) {
    const pref = part.split(';')[0]!.trim();
    const m = /^wait\s*=\s*"?(\d{1,9})"?$/i.exec(pref);
    if (m) return Number(m[1]);
  }
  return null;
}
