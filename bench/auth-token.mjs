// The caller auth of the benchmarks' auth targets: an HS256 secret, and one
// token with the proxy scope sent on every request (the gateway verifies it,
// then keeps it verified until its exp: docs/auth-audit.md).
import { SignJWT } from 'jose';

export const AUTH = { secret: 'bench-secret-0123456789-abcdefghijklmnop', issuer: 'https://bench.invalid', audience: 'fencegate-bench' };

export const bearer = `Bearer ${await new SignJWT({ scope: 'fencegate:proxy' })
  .setProtectedHeader({ alg: 'HS256' })
  .setIssuer(AUTH.issuer)
  .setAudience(AUTH.audience)
  .setSubject('bench')
  .setIssuedAt()
  .setExpirationTime('6h')
  .sign(new TextEncoder().encode(AUTH.secret))}`;
