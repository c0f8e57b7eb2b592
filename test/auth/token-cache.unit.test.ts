import { describe, expect, it } from 'vitest';
import { createTokenVerifier } from '../../src/http/middleware/auth/verify.js';
import { verificationKeys } from '../../src/protocol/keys.js';
import { AUDIENCE, ISSUER, SECRET, token } from './tokens.js';

// The verifier keeps a token that verified until its exp (createTokenVerifier):
// the same string is not verified again. What it must never do: answer for a
// token past its exp, for another string, or keep a refused one.

const keys = verificationKeys({ secret: SECRET }, {}, 'auth');
const verifier = (cacheSize?: number) =>
  createTokenVerifier({ keys, issuer: ISSUER, audience: AUDIENCE, clockToleranceSec: 0, ...(cacheSize !== undefined ? { cacheSize } : {}) });

describe('the verified-token cache', () => {
  it('answers the same token again from the cache (the same caller object), another token by verifying it', async () => {
    const verify = verifier();
    const a = await token({ sub: 'billing' });
    const first = await verify(a);
    const again = await verify(a);
    expect(first.ok && again.ok).toBe(true);
    expect(again.ok && first.ok && again.caller).toBe(first.ok && first.caller);
    const other = await verify(await token({ sub: 'billing', scope: 'fencegate:proxy fencegate:audit' }));
    expect(other.ok && first.ok && other.caller).not.toBe(first.ok && first.caller);
    // Control: without the cache every answer is a fresh verification.
    const uncached = verifier(0);
    const x = await uncached(a);
    const y = await uncached(a);
    expect(x.ok && y.ok && x.caller).not.toBe(y.ok && y.caller);
  });

  it('never answers for a token past its exp, although it verified before', async () => {
    const verify = verifier();
    const short = await token({ expIn: 1 });
    expect((await verify(short)).ok).toBe(true);
    await new Promise((r) => setTimeout(r, 2100));
    expect(await verify(short)).toEqual({ ok: false, why: expect.stringMatching(/exp/) });
  });

  it('a tampered copy of a cached token is verified, and refused', async () => {
    const verify = verifier();
    const good = await token();
    expect((await verify(good)).ok).toBe(true);
    const [h, p, sig] = good.split('.');
    const forged = `${h}.${p}.${sig!.slice(0, -2)}${sig!.endsWith('AA') ? 'BB' : 'AA'}`;
    expect((await verify(forged)).ok).toBe(false);
    expect((await verify(forged)).ok).toBe(false);
  });

  it('keeps at most cacheSize tokens, the least recently used leaving first', async () => {
    const verify = verifier(2);
    const callerOf = async (t: string) => {
      const check = await verify(t);
      if (!check.ok) throw new Error(check.why);
      return check.caller;
    };
    const [a, b, c] = [await token({ sub: 'a' }), await token({ sub: 'b' }), await token({ sub: 'c' })];
    const ca = await callerOf(a);
    const cb = await callerOf(b);
    expect(await callerOf(a)).toBe(ca); // a used again: b is now the least recently used
    await callerOf(c); // a third token: b leaves
    expect(await callerOf(a)).toBe(ca);
    expect(await callerOf(b)).not.toBe(cb); // verified again
  });
});
