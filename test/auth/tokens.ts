import { SignJWT, base64url, type CryptoKey } from 'jose';

export const SECRET = 'test-secret-0123456789-abcdefghijklmnop';
export const ISSUER = 'https://id.test.invalid';
export const AUDIENCE = 'fencegate-test';

/** The `auth` config section for HS256 tests. */
export const hsAuth = (extra: Record<string, unknown> = {}) => ({ secret: SECRET, issuer: ISSUER, audience: AUDIENCE, ...extra });

export interface TokenOptions {
  sub?: string;
  scope?: string;
  iss?: string;
  aud?: string;
  /** Seconds from now; negative: already expired. */
  expIn?: number;
  alg?: string;
  key?: Uint8Array | CryptoKey;
  kid?: string;
  typ?: string;
}

/** A signed JWT; HS256 with the test secret unless told otherwise. */
export async function token(o: TokenOptions = {}): Promise<string> {
  const now = Math.floor(Date.now() / 1000);
  const jwt = new SignJWT({ ...(o.scope === undefined ? { scope: 'fencegate:proxy' } : o.scope === '' ? {} : { scope: o.scope }) })
    .setProtectedHeader({ alg: o.alg ?? 'HS256', ...(o.kid ? { kid: o.kid } : {}), ...(o.typ ? { typ: o.typ } : {}) })
    .setIssuer(o.iss ?? ISSUER)
    .setAudience(o.aud ?? AUDIENCE)
    .setIssuedAt(now - 5)
    .setExpirationTime(now + (o.expIn ?? 600));
  if (o.sub !== '') jwt.setSubject(o.sub ?? 'billing');
  return jwt.sign(o.key ?? new TextEncoder().encode(SECRET));
}

/** An unsigned token (`alg: none`) with valid-looking claims. */
export function unsignedToken(claims: Record<string, unknown> = {}): string {
  const now = Math.floor(Date.now() / 1000);
  const enc = (o: unknown) => base64url.encode(new TextEncoder().encode(JSON.stringify(o)));
  return `${enc({ alg: 'none', typ: 'JWT' })}.${enc({ sub: 'mallory', scope: 'fencegate:proxy fencegate:admin', iss: ISSUER, aud: AUDIENCE, iat: now, exp: now + 600, ...claims })}.`;
}

export const bearer = (t: string) => ({ authorization: `Bearer ${t}` });
