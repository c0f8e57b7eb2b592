import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { CUT_MARKER, REJECTION_TEXT_LIMITS, boundRejectionText, cutText } from '../../src/store/bounds.js';
import { audit } from './conformance.js';

describe("cutText / boundRejectionText (the rejection log's bounds)", () => {
  it('keeps a value that fits, cuts a longer one to the limit with the marker at the end', () => {
    expect(cutText('abc', 3)).toBe('abc');
    expect(cutText('abcd', 3 + CUT_MARKER.length)).toBe('abcd');
    const cut = cutText('x'.repeat(50), 20);
    expect(cut).toBe('x'.repeat(20 - CUT_MARKER.length) + CUT_MARKER);
    expect(cut).toHaveLength(20);
  });

  it('never splits a surrogate pair', () => {
    const max = 10;
    const keep = max - CUT_MARKER.length; // 4 code units before the marker
    const s = 'abc' + '😀'.repeat(10); // the 4th and 5th code units are one emoji
    const cut = cutText(s, max);
    expect(cut).toBe('abc' + CUT_MARKER);
    expect(cut.length).toBeLessThanOrEqual(max);
    expect(cutText('abcd' + '😀'.repeat(5), max)).toBe('abcd'.slice(0, keep) + CUT_MARKER);
    expect(() => encodeURIComponent(cut)).not.toThrow(); // no lone surrogate
  });

  it('bounds every text field, and only those; an unread body stays null', () => {
    const L = REJECTION_TEXT_LIMITS;
    const t = boundRejectionText({
      entity: 'e'.repeat(10_000),
      idempotencyKey: null,
      audit: audit({ path: '/p'.repeat(10_000), clientRequestId: null, payloadSha256: '' }),
      detail: undefined,
    });
    expect(t.entity).toHaveLength(L.entity);
    expect(t.path).toHaveLength(L.path);
    expect(t.entity!.endsWith(CUT_MARKER) && t.path.endsWith(CUT_MARKER)).toBe(true);
    expect([t.idempotencyKey, t.clientRequestId, t.detail, t.payloadSha256]).toEqual([null, null, null, null]);
    expect(t.method).toBe('POST');
  });
});

describe('config: entityRetention and operatorActionRetention', () => {
  const routes = [{ name: 'p', match: { path: '/p/*' }, upstream: 'http://127.0.0.1:9' }];
  it('default to 90 days and 400 days', () => {
    const c = parseConfig({ routes });
    expect(c.entityRetention).toBe(90 * 86_400_000);
    expect(c.operatorActionRetention).toBe(400 * 86_400_000);
  });
  it('take durations; entityRetention below an hour is refused, naming the field', () => {
    expect(parseConfig({ routes, entityRetention: '2h', operatorActionRetention: '30d' })).toMatchObject({
      entityRetention: 7_200_000,
      operatorActionRetention: 30 * 86_400_000,
    });
    expect(() => parseConfig({ routes, entityRetention: '10m' })).toThrow(/entityRetention: must be at least 1h/);
  });
});
