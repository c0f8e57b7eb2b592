import { base64url, CompactSign, compactVerify, decodeProtectedHeader, type CryptoKey, type JWK } from 'jose';
import { parseFence } from './headers.js';
import { NoKeyError, type VerificationKeys } from './keys.js';

/**
 * Signed fences (DESIGN §7). With `fence.signed` configured, the fence header
 * carries a compact JWS minted by the lease module on claim and on every
 * extend, instead of a bare integer that any client could inflate to
 * 2^63−1 and lock an entity with.
 *
 * The JWS header says `typ: "fence+jwt"`, so a fence can never pass for a
 * caller's bearer token nor a bearer token for a fence, even when both are
 * signed with one HS256 secret. The fence is a decimal string in the claims:
 * a JSON number cannot carry 2^63−1 exactly.
 */
export const FENCE_TYP = 'fence+jwt';

export interface FenceClaimsInput {
  /** The entity the fence is scoped to (the job's fence key). */
  ent: string;
  fence: number | bigint | string;
  /** The worker that holds the lease. */
  sub: string;
  /** Expiry, epoch seconds: the lease end plus a small grace. */
  exp: number;
}

export interface VerifiedFence {
  ent: string;
  fence: bigint;
  sub: string | null;
  /** Epoch seconds. */
  exp: number;
}

/** A signing key: the HS256 secret (string or bytes), or a private key with its algorithm. */
export type FenceSigningKey =
  | { secret: string | Uint8Array; kid?: string }
  | { privateKey: CryptoKey | JWK | Uint8Array; alg: 'ES256' | 'EdDSA' | 'RS256'; kid?: string };

/**
 * Mints a signed fence.
 * @example
 * const jws = await mintFence({ ent: 'tool-job:42', fence: 7, sub: 'worker-a', exp: leaseEndSec + 5 }, { secret: process.env.FENCE_SECRET! });
 */
export async function mintFence(claims: FenceClaimsInput, key: FenceSigningKey, options: { issuer?: string } = {}): Promise<string> {
  const fence = typeof claims.fence === 'string' ? claims.fence : BigInt(claims.fence).toString();
  const parsed = parseFence(fence);
  if (!parsed.ok) throw new RangeError(`fence: ${parsed.reason}`);
  if (!Number.isSafeInteger(claims.exp)) throw new RangeError('exp: expected epoch seconds');
  const payload = {
    ent: claims.ent,
    fence,
    sub: claims.sub,
    exp: claims.exp,
    iat: Math.floor(Date.now() / 1000),
    ...(options.issuer ? { iss: options.issuer } : {}),
  };
  const bytes = new TextEncoder().encode(JSON.stringify(payload));
  if ('secret' in key) {
    const secret = typeof key.secret === 'string' ? new TextEncoder().encode(key.secret) : key.secret;
    return new CompactSign(bytes).setProtectedHeader({ alg: 'HS256', typ: FENCE_TYP, ...(key.kid ? { kid: key.kid } : {}) }).sign(secret);
  }
  return new CompactSign(bytes).setProtectedHeader({ alg: key.alg, typ: FENCE_TYP, ...(key.kid ? { kid: key.kid } : {}) }).sign(key.privateKey);
}

/**
 * A `fenceSigner` for `fencegate/lease` (its `FenceSigner` seam): the lease
 * module passes `exp` = the lease end in epoch seconds; this adds the grace.
 * @example
 * runWorker({ ..., fenceSigner: createFenceSigner({ secret: process.env.FENCE_SECRET! }, { graceSeconds: 5 }) });
 */
export function createFenceSigner(key: FenceSigningKey, options: { graceSeconds?: number; issuer?: string } = {}) {
  const grace = options.graceSeconds ?? 5;
  if (!Number.isInteger(grace) || grace < 0) throw new RangeError('graceSeconds: expected a non-negative integer');
  return function signFence(claims: { ent: string; fence: number | bigint; sub: string; exp: number }): Promise<string> {
    return mintFence({ ...claims, exp: claims.exp + grace }, key, options.issuer ? { issuer: options.issuer } : {});
  };
}

export type FenceVerification =
  | { ok: true; fence: VerifiedFence }
  /** Not a fence this gateway signed (forged, malformed, a bare integer, another key): 401. */
  | { ok: false; code: 'invalid-fence-signature'; why: string; presented: bigint | null }
  /** Signed for another entity: 401 too, it is not a fence for this one. */
  | { ok: false; code: 'invalid-fence-signature'; why: 'wrong-entity'; presented: bigint; claimed: string }
  /** Genuine but past `exp` (the holder's lease ran out): 409. */
  | { ok: false; code: 'fence-expired'; presented: bigint; exp: number; sub: string | null };

export interface VerifyFenceOptions {
  /** The entity the route derived for this request; the `ent` claim must equal it. */
  entity: string;
  /** Seconds of clock skew accepted on `exp`. Default 0 (the signer's grace covers skew). */
  clockToleranceSec?: number;
  /** Required `iss`, when configured. */
  issuer?: string;
  /**
   * Current time in epoch milliseconds. `exp` is a JWT claim checked against
   * the gateway's clock, not a lease row in the database (G6 is about rows):
   * the signer derives it from the database's `lease_until` and adds a grace
   * that covers the skew between the two clocks.
   */
  now?: number;
}

/**
 * Verifies a signed fence: signature (with the configured keys, never `alg:
 * none`), `typ`, then `ent` against the route's entity, then `exp`. Order
 * matters: an expired fence for another entity is "not yours" (401), not
 * "too late" (409).
 */
export async function verifyFence(jws: string, keys: VerificationKeys, options: VerifyFenceOptions): Promise<FenceVerification> {
  const presented = presentedFence(jws);
  const invalid = (why: string): FenceVerification => ({ ok: false, code: 'invalid-fence-signature', why, presented });
  if (!/^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+$/.test(jws)) {
    return invalid(/^\d+$/.test(jws) ? 'a bare integer fence is not accepted: this gateway requires signed fences' : 'not a compact JWS');
  }
  let header: ReturnType<typeof decodeProtectedHeader>;
  try {
    header = decodeProtectedHeader(jws);
  } catch {
    return invalid('malformed JWS header');
  }
  if (typeof header.alg !== 'string' || header.alg.toLowerCase() === 'none') return invalid('unsigned (alg none) fences are not accepted');
  if (header.typ !== FENCE_TYP) return invalid(`typ must be "${FENCE_TYP}"`);
  let payloadBytes: Uint8Array;
  try {
    ({ payload: payloadBytes } = await compactVerify(jws, keys.getKey, { algorithms: keys.algorithms }));
  } catch (err) {
    return invalid(joseWhy(err));
  }
  let claims: Record<string, unknown>;
  try {
    claims = JSON.parse(new TextDecoder().decode(payloadBytes)) as Record<string, unknown>;
  } catch {
    return invalid('the payload is not JSON');
  }
  if (claims === null || typeof claims !== 'object') return invalid('the payload is not a JSON object');
  const fence = claimFence(claims.fence);
  if (fence === null) return invalid('the fence claim is not a decimal integer 0 … 2^63-1');
  if (typeof claims.ent !== 'string') return invalid('no ent claim');
  if (typeof claims.exp !== 'number' || !Number.isFinite(claims.exp)) return invalid('no exp claim');
  if (options.issuer !== undefined && claims.iss !== options.issuer) return invalid('unexpected iss claim');
  if (claims.ent !== options.entity) return { ok: false, code: 'invalid-fence-signature', why: 'wrong-entity', presented: fence, claimed: claims.ent };
  const sub = typeof claims.sub === 'string' ? claims.sub : null;
  const nowSec = (options.now ?? Date.now()) / 1000;
  if (claims.exp + (options.clockToleranceSec ?? 0) <= nowSec) return { ok: false, code: 'fence-expired', presented: fence, exp: claims.exp, sub };
  return { ok: true, fence: { ent: claims.ent, fence, sub, exp: claims.exp } };
}

function claimFence(v: unknown): bigint | null {
  if (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0) return BigInt(v);
  if (typeof v !== 'string') return null;
  const parsed = parseFence(v);
  return parsed.ok ? parsed.value : null;
}

/**
 * What the caller claimed, for the rejection log only (`presented_fence`):
 * a bare integer as sent, or the unverified `fence` claim of a JWS. Never
 * trusted for a decision.
 */
function presentedFence(value: string): bigint | null {
  const bare = parseFence(value);
  if (bare.ok) return bare.value;
  const parts = value.split('.');
  if (parts.length !== 3) return null;
  try {
    const json = JSON.parse(new TextDecoder().decode(base64url.decode(parts[1]!))) as { fence?: unknown };
    return claimFence(json?.fence);
  } catch {
    return null;
  }
}

/** jose's failure, in words an auditor can use; never the token. */
export function joseWhy(err: unknown): string {
  if (err instanceof NoKeyError) return err.message;
  const code = (err as { code?: string } | null)?.code;
  switch (code) {
    case 'ERR_JWS_SIGNATURE_VERIFICATION_FAILED':
      return 'signature verification failed';
    case 'ERR_JOSE_ALG_NOT_ALLOWED':
      return 'algorithm not allowed';
    case 'ERR_JWKS_NO_MATCHING_KEY':
      return 'no configured key matches (kid, alg)';
    case 'ERR_JWKS_MULTIPLE_MATCHING_KEYS':
      return 'several configured keys match and none verifies';
    case 'ERR_JOSE_NOT_SUPPORTED':
      return 'unsupported algorithm or key';
    case 'ERR_JWS_INVALID':
    case 'ERR_JWT_INVALID':
      return 'malformed token';
    case 'ERR_JWT_EXPIRED':
      return 'expired';
    default:
      return err instanceof Error ? `verification failed (${err.name})` : 'verification failed';
  }
}
