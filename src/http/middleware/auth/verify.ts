import { base64url, decodeProtectedHeader, jwtVerify, type JWTPayload } from 'jose';
import { keyTextOf, scanPointer } from '../../../core/json-duplicates.js';
import { FENCE_TYP, joseWhy } from '../../../protocol/fence-token.js';
import type { VerificationKeys } from '../../../protocol/keys.js';

/** The scopes fencegate knows. `fencegate:admin` implies `fencegate:audit`. */
export const SCOPES = ['fencegate:proxy', 'fencegate:audit', 'fencegate:admin'] as const;
export type Scope = (typeof SCOPES)[number];

/** An authenticated caller: who (`sub`, or the configured claim) and what it may do. */
export interface Caller {
  /** Recorded in the rejection log; scopes idempotency keys. */
  id: string;
  scopes: ReadonlySet<string>;
  /**
   * The claims the verifier was asked to keep (`claims` option: those a
   * route's `keyScope.claim` names), each a string claim, or an integer
   * claim as its decimal text. A claim that is absent or of another type
   * (object, array, boolean, fraction) is not here. Never the whole payload.
   */
  claims: Readonly<Record<string, string>>;
}

export type TokenCheck = { ok: true; caller: Caller } | { ok: false; why: string };

export interface TokenVerifierOptions {
  keys: VerificationKeys;
  issuer: string | string[];
  audience: string | string[];
  /** Seconds of clock skew accepted on `exp` / `nbf`. Default 5. */
  clockToleranceSec?: number;
  /** The claim that names the caller. Default `sub`. */
  callerClaim?: string;
  /** Top-level claims to keep on the Caller (`caller.claims`), e.g. a tenant id for `keyScope.claim`. Default none. */
  claims?: readonly string[];
  /** Verified tokens kept (see createTokenVerifier). Default 10,000; 0 keeps none. */
  cacheSize?: number;
}

/** How long a verified token is kept at most, whatever its `exp`. */
const CACHE_TTL_MS = 10 * 60_000;

export type TokenVerifier = (token: string) => Promise<TokenCheck>;

/**
 * Verifies caller tokens with jose: signature with the configured keys only
 * (`alg: none` and any algorithm outside the keys' allow-list are refused),
 * `exp`, `nbf`, `iss`, `aud`. The answer says why a token failed, in words
 * that are safe to log: never the token itself.
 *
 * A token that verified is kept, as the same string, until its `exp` (not
 * the clock tolerance past it) and at most CACHE_TTL_MS: the same caller's
 * next request is not verified again (a signature check was most of what
 * caller auth cost a request). Nothing a cached token could not do at
 * that moment is allowed: the keys are fixed for the verifier's life (a
 * reload builds another), a refused token is never kept, and the cache
 * holds at most `cacheSize` tokens, the least recently used leaving first.
 *
 * @example
 * const verify = createTokenVerifier({ keys, issuer: 'https://id.example', audience: 'fencegate' });
 * const check = await verify(bearer); // { ok: true, caller: { id: 'billing', scopes } }
 */
export function createTokenVerifier(options: TokenVerifierOptions): TokenVerifier {
  const { keys } = options;
  const claim = options.callerClaim ?? 'sub';
  const kept = [...new Set(options.claims ?? [])];
  const verifyOptions = {
    algorithms: keys.algorithms,
    issuer: options.issuer,
    audience: options.audience,
    clockTolerance: options.clockToleranceSec ?? 5,
    requiredClaims: ['exp'],
  };
  const cacheSize = options.cacheSize ?? 10_000;
  const cache = new Map<string, { caller: Caller; until: number }>();
  return async function verifyToken(token: string): Promise<TokenCheck> {
    const hit = cache.get(token);
    if (hit !== undefined) {
      cache.delete(token);
      if (Date.now() < hit.until) {
        cache.set(token, hit);
        return { ok: true, caller: hit.caller };
      }
    }
    const check = await verifyOnce(token);
    if (check.ok && cacheSize > 0) {
      const exp = decodedExp(token);
      const until = Math.min(exp === null ? 0 : exp * 1000, Date.now() + CACHE_TTL_MS);
      if (until > Date.now()) {
        cache.set(token, { caller: check.caller, until });
        if (cache.size > cacheSize) cache.delete(cache.keys().next().value!);
      }
    }
    return check;
  };

  async function verifyOnce(token: string): Promise<TokenCheck> {
    let header: ReturnType<typeof decodeProtectedHeader>;
    try {
      header = decodeProtectedHeader(token);
    } catch {
      return { ok: false, why: 'malformed token' };
    }
    if (typeof header.alg !== 'string' || header.alg.toLowerCase() === 'none') return { ok: false, why: 'unsigned token (alg none)' };
    if (header.typ === FENCE_TYP) return { ok: false, why: 'a signed fence is not a credential' };
    let payload: JWTPayload;
    try {
      ({ payload } = await jwtVerify(token, keys.getKey, verifyOptions));
    } catch (err) {
      return { ok: false, why: claimWhy(err) };
    }
    const id = payload[claim];
    if (typeof id !== 'string' || id === '') return { ok: false, why: `no ${claim} claim` };
    return { ok: true, caller: { id, scopes: scopesOf(payload), claims: keptClaims(payload, kept, token) } };
  }
}

/** The `exp` of a token that verified (a number: jose required it), or null. */
function decodedExp(token: string): number | null {
  try {
    const payload = JSON.parse(new TextDecoder().decode(base64url.decode(token.split('.')[1]!))) as { exp?: unknown };
    return typeof payload.exp === 'number' ? payload.exp : null;
  } catch {
    return null;
  }
}

/**
 * The named claims that are strings or integers, read from the verified
 * payload's text as written (an integer as its decimal text: `42` and `"42"`
 * are one tenant, as a JSON-pointer key reads them). A number that is not a
 * plain integer within ±(2^53−1) as written (`-0`, `42.0`, `4.2e1`, a
 * fraction that rounds to an integer), a claim name the payload repeats
 * (parsers disagree on which one counts), or anything else is left out, and
 * the route that needs it refuses the request: a scope made of `0` for `-0`,
 * or of `[object Object]`, would put unrelated tenants together.
 */
function keptClaims(payload: JWTPayload, names: readonly string[], token: string): Record<string, string> {
  // No prototype: a claim named `__proto__` is a claim like any other.
  const out: Record<string, string> = Object.create(null);
  if (!names.some((name) => Object.hasOwn(payload, name))) return out;
  const text = new TextDecoder().decode(base64url.decode(token.split('.')[1]!));
  for (const name of names) {
    // Claim names are compared exactly (JSON, RFC 7519 §4), not folded as body members are.
    const found = scanPointer(text, [name], (n) => n);
    if (!('start' in found)) continue;
    // The rule of a JSON-pointer key (idempotencyKeyFrom): the same text is the same tenant to every parser.
    const value = keyTextOf(text.slice(found.start, found.end));
    if (value !== null) out[name] = value;
  }
  return out;
}

/** OAuth 2 `scope` (space-separated, RFC 8693 / 9068) or `scp` (string or array). */
export function scopesOf(payload: JWTPayload): Set<string> {
  const out = new Set<string>();
  for (const v of [payload.scope, payload.scp]) {
    if (typeof v === 'string') v.split(' ').forEach((s) => s && out.add(s));
    else if (Array.isArray(v)) v.forEach((s) => typeof s === 'string' && out.add(s));
  }
  return out;
}

/** Whether `caller` holds `scope`; admin implies audit. */
export function hasScope(caller: Caller, scope: Scope): boolean {
  if (caller.scopes.has(scope)) return true;
  return scope === 'fencegate:audit' && caller.scopes.has('fencegate:admin');
}

function claimWhy(err: unknown): string {
  const e = err as { code?: string; claim?: string; reason?: string };
  if (e?.code === 'ERR_JWT_CLAIM_VALIDATION_FAILED') {
    if (e.reason === 'missing') return `no ${e.claim} claim`;
    if (e.claim === 'aud') return 'wrong audience';
    if (e.claim === 'iss') return 'wrong issuer';
    if (e.claim === 'nbf') return 'not valid yet (nbf)';
    return `invalid ${e.claim} claim`;
  }
  return joseWhy(err);
}
