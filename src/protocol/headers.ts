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
export function parseEntity(raw: string): Parsed<string> {
  if (raw.length === 0) return { ok: false, reason: 'the entity is empty' };
  if (!PRINTABLE.test(raw)) return { ok: false, reason: 'the entity must be printable ASCII' };
  if (raw.length > 512) return { ok: false, reason: 'the entity is longer than 512 bytes' };
  if (raw !== raw.trim()) return { ok: false, reason: 'the entity has leading or trailing spaces' };
  return { ok: true, value: raw };
}

/**
 * `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header): an RFC 8941
 * sf-string (`"abc"`, with `\"` and `\\` escapes) is unquoted; a bare token is
 * taken as it is. 1–255 printable ASCII characters after unquoting. A bare
 * value may not contain `"` or `,` (a comma is how HTTP joins repeated
 * headers, so a key with a comma must be sent as an sf-string).
 */
export function parseIdempotencyKey(raw: string): Parsed<string> {
  let key: string;
  if (raw.startsWith('"')) {
    const unq = unquoteSfString(raw);
    if (unq === null) return { ok: false, reason: 'the key is not a valid quoted string (RFC 8941 sf-string), or there are several keys' };
    key = unq;
  } else {
    if (/[",]/.test(raw)) return { ok: false, reason: 'an unquoted key may not contain `"` or `,` (several keys were sent, or the key needs quoting)' };
    key = raw;
  }
  if (key.length === 0) return { ok: false, reason: 'the key is empty' };
  if (key.length > 255) return { ok: false, reason: 'the key is longer than 255 characters' };
  if (!PRINTABLE.test(key)) return { ok: false, reason: 'the key must be printable ASCII' };
  if (key !== key.trim()) return { ok: false, reason: 'the key has leading or trailing spaces' };
  // URLs resolve a path segment "." or ".." away (also when written %2E), so
  // the admin API (GET /v1/idempotency/:key, …/resolve) could never name the
  // record: an outcome_unknown one could not be settled.
  if (key === '.' || key === '..') return { ok: false, reason: 'the keys "." and ".." cannot be named in a URL path (the admin API looks records up by key)' };
  return { ok: true, value: key };
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
