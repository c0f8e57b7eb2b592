import { afterEach, describe, expect, it, vi } from 'vitest';
import { bodyDigest, sha256Hex } from '../../src/core/fingerprint.js';
import { duplicateOnPointerPath } from '../../src/core/json-duplicates.js';
import { expectProblem, recordRows, snapshot } from '../helpers/gateway.js';
import { inProcessGateway, type InProcessGateway } from '../helpers/in-process.js';
import { fold } from '../helpers/fold-switch.js';

// Member names as Go's encoding/json and ASP.NET Core bind them: without
// regard to case, under Unicode simple folding (`ſ` U+017F is `s`, `K`
// U+212A is `k`). A body that one of them reads another way than the gateway
// must not share a stored answer, key or fence with the body the gateway
// read. The fold is switchable here (`fold.mode`), so each test can turn the
// check off and show that the attack then goes through (negative controls).

vi.mock('../../src/core/json-duplicates.js', async (original) => (await import('../helpers/fold-switch.js')).foldSwitched(await original()));

const P = '/pay/charges';
const LONG_S = '\u017f'; // ſ, folds to s
const KELVIN = '\u212a'; // K, folds to k
const open: InProcessGateway[] = [];
afterEach(async () => {
  fold.mode = 'real';
  for (const g of open.splice(0)) await g.close();
});

function gateway(route: Record<string, unknown>): InProcessGateway {
  const g = inProcessGateway({ routes: [{ name: 'pay', match: { path: '/pay/*' }, fence: 'off', mode: 'concurrent', ...route }] });
  open.push(g);
  return g;
}

const enc = (s: string) => new TextEncoder().encode(s);
const digest = (mode: Parameters<typeof bodyDigest>[0], body: string) => bodyDigest(mode, enc(body), sha256Hex(enc(body)), 'application/json');

describe('fingerprint: a member that folds onto another is a repeated member (raw fingerprint)', () => {
  // Go keeps the last of two members it folds together: b1 is "pricey" to it, b2 "cheap".
  const cases = [
    ['ſ', `{"sku":"cheap","${LONG_S}ku":"pricey"}`, `{"${LONG_S}ku":"pricey","sku":"cheap"}`],
    ['K', `{"kind":"cheap","${KELVIN}ind":"pricey"}`, `{"${KELVIN}ind":"pricey","kind":"cheap"}`],
  ] as const;

  it.each(cases)('%s: two bodies Go reads as two commands are 422 under one key, never one replay', async (_c, b1, b2) => {
    for (const fingerprint of [{ ignore: [] }, { json: ['/sku', '/kind'] }]) {
      const g = gateway({ fingerprint });
      expect((await g.command(P, { key: 'k-fold', body: b1 })).status).toBe(201);
      await expectProblem(await g.command(P, { key: 'k-fold', body: b2 }), 422, 'idempotency-key-reused');
      expect(g.upstream.effects).toBe(1);
    }
    expect(digest({ ignore: [] }, b1)).toBe(sha256Hex(enc(b1)));
  });

  // toLowerCase alone folds K onto k but leaves ſ alone; with no folding at all both get through.
  it.each(cases)('%s negative control: a weaker fold makes the two bodies one command (a replay)', async (c, b1, b2) => {
    fold.mode = c === 'ſ' ? 'lower' : 'none';
    const g = gateway({ fingerprint: { ignore: [] } });
    await g.command(P, { key: 'k-fold', body: b1 });
    expect((await g.command(P, { key: 'k-fold', body: b2 })).headers.get('idempotent-replayed')).toBe('true');
  });
});

describe('fingerprint json pointers: a member that folds onto the token without being it', () => {
  it('{"Amount":100} and {"Amount":50000} with json ["/amount"] are fingerprinted raw: 422, not a replay', async () => {
    const g = gateway({ fingerprint: { json: ['/amount'] } });
    expect((await g.command(P, { key: 'k-case', body: '{"Amount":100}' })).status).toBe(201);
    await expectProblem(await g.command(P, { key: 'k-case', body: '{"Amount":50000}' }), 422, 'idempotency-key-reused');
    expect(g.upstream.effects).toBe(1);
    // Nested, and with ſ: the same.
    expect(digest({ json: ['/order/amount'] }, '{"order":{"AMOUNT":1}}')).toBe(sha256Hex(enc('{"order":{"AMOUNT":1}}')));
    expect(digest({ json: ['/sku'] }, `{"${LONG_S}ku":1}`)).toBe(sha256Hex(enc(`{"${LONG_S}ku":1}`)));
    // The exact member, and unrelated members, keep the JSON digest.
    expect(digest({ json: ['/amount'] }, '{"amount":1,"Note":2}').startsWith('json:')).toBe(true);
  });

  it('negative control: without folding, both bodies "have no amount" and the second is replayed', async () => {
    fold.mode = 'none';
    const g = gateway({ fingerprint: { json: ['/amount'] } });
    await g.command(P, { key: 'k-case', body: '{"Amount":100}' });
    expect((await g.command(P, { key: 'k-case', body: '{"Amount":50000}' })).headers.get('idempotent-replayed')).toBe('true');
  });
});

describe('key from the body: a folded repeat is 400 invalid-idempotency-key', () => {
  const route = { idempotencyKeyFrom: { json: '/request_id' } };

  it.each([
    ['ſ', `{"request_id":"A","reque${LONG_S}t_id":"B"}`],
    ['K', `{"k":{"id":"A"},"${KELVIN}":{"id":"B"}}`],
  ])('%s: refused, no state, no upstream call', async (c, body) => {
    const g = gateway(c === 'K' ? { idempotencyKeyFrom: { json: '/k/id' } } : route);
    const before = snapshot(g.sqlite);
    await expectProblem(await g.command(P, { body }), 400, 'invalid-idempotency-key');
    expect(snapshot(g.sqlite)).toBe(before);
    expect(g.upstream.effects).toBe(0);
  });

  it('negative control: folding with toLowerCase only stores the key "A" while Go reads "B"', async () => {
    fold.mode = 'lower';
    const g = gateway(route);
    expect((await g.command(P, { body: `{"request_id":"A","reque${LONG_S}t_id":"B"}` })).status).toBe(201);
    expect(recordRows(g.sqlite, 'A')).toHaveLength(1);
  });
});

describe('JSON entity: a folded repeat is 400 invalid-entity', () => {
  const route = { entity: { json: '/customer' }, fence: 'optional' };

  it.each([
    ['ſ', '/customer', `{"customer":"alice","cu${LONG_S}tomer":"bob"}`],
    ['K', '/kid', `{"kid":"alice","${KELVIN}id":"bob"}`],
  ])('%s: the gateway never fences "alice" while a Go upstream acts on "bob"', async (_c, pointer, body) => {
    const g = gateway({ ...route, entity: { json: pointer } });
    const before = snapshot(g.sqlite);
    await expectProblem(await g.command(P, { key: 'e1', body, fence: 5 }), 400, 'invalid-entity');
    expect(snapshot(g.sqlite)).toBe(before);
    expect(g.upstream.effects).toBe(0);
    expect(duplicateOnPointerPath(body, [pointer.slice(1)])).not.toBeNull();
  });

  it('negative control: folding with toLowerCase only fences "alice"', async () => {
    fold.mode = 'lower';
    const g = gateway(route);
    expect((await g.command(P, { key: 'e1', body: `{"customer":"alice","cu${LONG_S}tomer":"bob"}`, fence: 5 })).status).toBe(201);
    expect(g.upstream.calls[0]!.entity).toBe('alice');
  });
});
