import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { bodyDigest, isJsonMediaType, sha256Hex } from '../../src/core/fingerprint.js';
import { foldName, scanPointer } from '../../src/core/json-duplicates.js';
import { checkKey, echoKeyCollision, formatIdempotencyKey, keyHeaderCollision, keyScopeCollision, parseIdempotencyKey } from '../../src/protocol/headers.js';

// The pure rules behind the interop options: key parsing (quoted keys keep
// their spaces), the echo form, the start-up refusal of a key header the
// gateway rewrites, and the body part of the fingerprint.

const enc = (s: string) => new TextEncoder().encode(s);
const digest = (mode: Parameters<typeof bodyDigest>[0], body: string) => bodyDigest(mode, enc(body), sha256Hex(enc(body)), 'application/json');

describe('Idempotency-Key parsing', () => {
  it('a quoted key keeps the spaces inside its quotes (RFC 8941 sf-string)', () => {
    expect(parseIdempotencyKey('" padded key "')).toEqual({ ok: true, value: ' padded key ' });
    expect(parseIdempotencyKey('"  "')).toEqual({ ok: true, value: '  ' });
  });

  it('a bare key with outer spaces is refused: HTTP strips them, they cannot be the key', () => {
    expect(parseIdempotencyKey(' padded').ok).toBe(false);
    expect(parseIdempotencyKey('padded ').ok).toBe(false);
    expect(parseIdempotencyKey('in side')).toEqual({ ok: true, value: 'in side' });
  });

  it('maxKeyLength bounds the key after unquoting', () => {
    expect(parseIdempotencyKey('a'.repeat(300), 300).ok).toBe(true);
    expect(parseIdempotencyKey('a'.repeat(301), 300).ok).toBe(false);
    expect(parseIdempotencyKey(`"${'a'.repeat(8)}"`, 8).ok).toBe(true);
    expect(parseIdempotencyKey('a'.repeat(9), 8).ok).toBe(false);
    expect(parseIdempotencyKey('a'.repeat(256)).ok).toBe(false);
  });

  it('the echo form reads back as the same key', () => {
    for (const key of ['abc', ' padded key ', 'a,b', 'say "hi"', 'back\\slash', 'k-1:2/3']) {
      expect(parseIdempotencyKey(formatIdempotencyKey(key))).toEqual({ ok: true, value: key });
    }
    expect(formatIdempotencyKey('abc')).toBe('abc');
    expect(formatIdempotencyKey(' x ')).toBe('" x "');
  });

  it('checkKey holds body keys to the header rules', () => {
    expect(checkKey('..').ok).toBe(false);
    expect(checkKey('').ok).toBe(false);
    expect(checkKey('clé').ok).toBe(false);
    expect(checkKey(' spaced ')).toEqual({ ok: true, value: ' spaced ' });
  });
});

describe('a key header the gateway rewrites is refused at start-up', () => {
  const route = (over: Record<string, unknown>) => ({ name: 'r', match: { path: '/r/*' }, upstream: 'http://127.0.0.1:9', fence: 'off', ...over });

  it.each([
    ['X-Request-Id', {}],
    ['x-fence-entity', {}],
    ['Idempotent-Replayed', {}],
    ['X-Execution-Fence', {}],
    ['X-Job', { entity: { header: 'X-Job' } }],
    ['X-Tenant', { keyScope: { header: 'x-tenant' } }],
    ['Content-Length', {}],
    ['Connection', {}],
    ['X-Api-Key', { upstreamHeaders: { 'x-api-key': 'secret' } }],
  ])('idempotencyHeader %s', (header, extra) => {
    expect(() => parseConfig({ routes: [route({ idempotencyHeader: header, ...extra })] })).toThrow(/routes\[0\]\.idempotencyHeader/);
  });

  it('is accepted for a header of its own, and for any header with idempotency off', () => {
    expect(parseConfig({ routes: [route({ idempotencyHeader: 'X-Idempotency-Key' })] }).routes[0]!.idempotencyHeader).toBe('X-Idempotency-Key');
    expect(parseConfig({ routes: [route({ idempotencyHeader: 'X-Request-Id', idempotency: 'off' })] }).routes).toHaveLength(1);
  });

  it('keyHeaderCollision names the problem, and nothing for a header of its own (the gateway-level negative control is in interop.test.ts)', () => {
    const r = { idempotency: 'required', idempotencyHeader: 'X-Request-Id', fenceHeader: 'X-Execution-Fence', entity: {}, upstreamHeaders: {} };
    expect(keyHeaderCollision(r)).not.toBeNull();
    expect(keyHeaderCollision({ ...r, idempotencyHeader: 'Idempotency-Key' })).toBeNull();
    // Authorization only collides when the gateway checks (and drops) it.
    expect(keyHeaderCollision({ ...r, idempotencyHeader: 'Authorization' }, { auth: true })).toMatch(/credentials/);
    expect(keyHeaderCollision({ ...r, idempotencyHeader: 'Authorization' }, { auth: false })).toBeNull();
    expect(keyScopeCollision({ ...r, idempotencyHeader: 'Idempotency-Key', keyScope: { header: 'TraceParent' } })).toMatch(/writes itself/);
    expect(keyScopeCollision({ ...r, idempotencyHeader: 'Idempotency-Key', keyScope: { header: 'X-Tenant' } })).toBeNull();
    expect(echoKeyCollision({ ...r, idempotencyHeader: 'content-disposition', echoKey: true })).toMatch(/means something else/);
    expect(echoKeyCollision({ ...r, idempotencyHeader: 'content-disposition', echoKey: false })).toBeNull();
  });
});

describe('the body part of the fingerprint', () => {
  const a = '{"amount":1200,"currency":"eur","timestamp":"2024-01-01T00:00:00Z"}';
  const b = '{ "timestamp": "2024-01-01T00:00:09Z", "currency": "eur", "amount": 1200 }';

  it('raw: every byte counts (the default)', () => {
    expect(digest('raw', a)).toBe(sha256Hex(enc(a)));
    expect(digest('raw', a)).not.toBe(digest('raw', b));
  });

  it('ignore: canonical JSON without the named fields', () => {
    expect(digest({ ignore: ['/timestamp'] }, a)).toBe(digest({ ignore: ['/timestamp'] }, b));
    expect(digest({ ignore: ['/timestamp'] }, a)).not.toBe(digest({ ignore: ['/timestamp'] }, a.replace('1200', '1300')));
    // Nothing ignored: member order and whitespace still do not count.
    expect(digest({ ignore: [] }, '{"a":1,"b":[1,2]}')).toBe(digest({ ignore: [] }, '{ "b": [1, 2], "a": 1 }'));
    expect(digest({ ignore: [] }, '{"b":[1,2]}')).not.toBe(digest({ ignore: [] }, '{"b":[2,1]}'));
  });

  it('json: only the named fields; an absent field differs from null', () => {
    const mode = { json: ['/amount', '/currency'] };
    expect(digest(mode, a)).toBe(digest(mode, b));
    expect(digest(mode, '{"amount":1}')).not.toBe(digest(mode, '{"amount":1,"currency":null}'));
    expect(digest(mode, a)).not.toBe(digest(mode, a.replace('eur', 'usd')));
  });

  it('numbers keep their text: two amounts one double apart are two commands', () => {
    const mode = { ignore: [] };
    expect(digest(mode, '{"amount":10000000000000001}')).not.toBe(digest(mode, '{"amount":10000000000000000}'));
    expect(digest(mode, '{"s":"\\u0041"}')).toBe(digest(mode, '{"s":"A"}'));
  });

  it('a body that is not JSON, or repeats a member name, is fingerprinted raw (strict)', () => {
    const mode = { ignore: ['/timestamp'] };
    expect(digest(mode, 'amount=1200')).toBe(sha256Hex(enc('amount=1200')));
    const dup = '{"amount":1,"amount":2,"timestamp":1}';
    expect(digest(mode, dup)).toBe(sha256Hex(enc(dup)));
    expect(digest(mode, '{"Amount":1,"amount":2}')).toBe(sha256Hex(enc('{"Amount":1,"amount":2}')));
    expect(digest(mode, a).startsWith('json:')).toBe(true);
    const deep = '['.repeat(200) + ']'.repeat(200);
    expect(digest(mode, deep)).toBe(sha256Hex(enc(deep)));
  });
});

describe('member names and media types', () => {
  it('foldName puts Unicode simple-fold orbits on one string (ſ ~ s, K ~ k, ß ~ ẞ), and keeps other names apart', () => {
    expect(foldName('\u017fku')).toBe(foldName('sku'));
    expect(foldName('\u212aind')).toBe(foldName('kind'));
    expect(foldName('Amount')).toBe(foldName('aMOUNT'));
    expect(foldName('\u00df')).toBe(foldName('\u1e9e'));
    expect(foldName('amount')).not.toBe(foldName('amounts'));
  });

  it('scanPointer hands back the value as written: a number keeps its lexeme', () => {
    const text = '{"a":{"n": 1.0 ,"s":"x"}}';
    const at = (tokens: string[]) => {
      const r = scanPointer(text, tokens);
      return 'start' in r ? text.slice(r.start, r.end) : r;
    };
    expect(at(['a', 'n'])).toBe('1.0');
    expect(at(['a', 's'])).toBe('"x"');
    expect(at(['a'])).toBe('{"n": 1.0 ,"s":"x"}');
    expect(at(['b'])).toEqual({ absent: true });
    expect(scanPointer('{"a":1,"A":2}', ['a'])).toEqual({ duplicate: { object: '', name: 'A' } });
  });

  it('isJsonMediaType: application/json and +json, UTF-8 only', () => {
    for (const ct of ['application/json', 'Application/JSON; charset=utf-8', 'application/problem+json', 'application/json;charset="utf-8"'])
      expect(isJsonMediaType(ct)).toBe(true);
    for (const ct of ['', 'text/plain', 'text/json', 'application/json; charset=latin1', 'application/jsonx', 'multipart/form-data'])
      expect(isJsonMediaType(ct)).toBe(false);
  });
});
