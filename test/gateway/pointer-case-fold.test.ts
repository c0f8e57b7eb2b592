import { afterEach, describe, expect, it, vi } from 'vitest';
import { command, effectOf, expectProblem, paymentsRoute, recordRows, snapshot, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { fold } from '../helpers/fold-switch.js';

// A JSON-pointer entity (`entity: { json }`, DESIGN §3.3) or key
// (`idempotencyKeyFrom: { json }`, DESIGN §3.5) where the body holds no member
// of the token's name but one that differs from it only in case:
// `{"Customer":"bob"}` for `/customer`. To JSON.parse nothing is there, so
// before this check the gateway read "no entity" (on a route whose fence is
// optional: no fence, no serial slot) or "no key from the body", while an
// upstream that binds member names case-insensitively (Go's encoding/json,
// ASP.NET Core) acts on bob, or deduplicates by a key the gateway never
// stored. Names are folded as the fingerprint folds them (DESIGN §3.4,
// src/core/json-duplicates.ts foldName). The fold is switchable here
// (`fold.mode`): with `none` the check is off, and the controls show the
// folded body is then admitted.

vi.mock('../../src/core/json-duplicates.js', async (original) => (await import('../helpers/fold-switch.js')).foldSwitched(await original()));

const LONG_S = '\u017f'; // ſ, folds to s
const P = '/payments/charges';
const open: { close(): Promise<void> }[] = [];
afterEach(async () => {
  fold.mode = 'real';
  for (const o of open.splice(0).reverse()) await o.close();
});

async function setup(overrides: Record<string, unknown>): Promise<{ up: FakeUpstream; gw: TestGateway }> {
  const up = await startUpstream();
  open.push(up);
  const gw = await startTestGateway({ routes: [paymentsRoute(up.url, { fence: 'optional', idempotency: 'optional', mode: 'serial', ...overrides })] });
  open.push(gw);
  return { up, gw };
}

describe('JSON entity: a member that differs from a pointer token only in case is 400 invalid-entity', () => {
  const cases: [string, string, string][] = [
    ['the entity member', '/customer', '{"Customer":"bob-secret","amount":1}'],
    ['with ſ', '/customer', `{"cu${LONG_S}tomer":"bob-secret"}`],
    ['the last token, nested', '/order/customer', '{"order":{"CUSTOMER":"bob-secret"}}'],
    ['an earlier token', '/order/customer', '{"Order":{"customer":"bob-secret"}}'],
  ];

  it.each(cases)('%s: refused in the route shape, nothing stored, nothing forwarded, the value not echoed', async (_c, pointer, body) => {
    const { up, gw } = await setup({ entity: { json: pointer } });
    const before = snapshot(gw.sqlite);
    const problem = await expectProblem(await command(gw.url, P, { key: 'k-e1', body }), 400, 'invalid-entity');
    expect(problem.detail).toContain('a member whose name differs only in case');
    expect(problem.detail).not.toContain('bob-secret');
    expect(snapshot(gw.sqlite)).toBe(before);
    expect(up.calls).toHaveLength(0);
  });

  it('control: the exact-case member is the entity (fenced, forwarded as bob)', async () => {
    const { up, gw } = await setup({ entity: { json: '/order/customer' } });
    const res = await command(gw.url, P, { key: 'k-e2', fence: 5, body: '{"order":{"customer":"bob","Note":"x"}}' });
    expect(res.status).toBe(201);
    expect((await effectOf(res)).entity).toBe('bob');
    expect(up.calls).toHaveLength(1);
  });

  it('the gap, with the fold switched off: the folded body is admitted without an entity and skips the serial slot of bob', async () => {
    const { up, gw } = await setup({ entity: { json: '/customer' } });
    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise }));
    // bob's command is in flight at the upstream, holding bob's serial slot.
    const first = command(gw.url, P, { key: 'k-first', body: '{"customer":"bob"}' });
    await up.waitForCalls(1);
    fold.mode = 'none';
    up.behave(null);
    const second = await command(gw.url, P, { key: 'k-second', body: '{"Customer":"bob"}' });
    // Admitted at once, next to bob's in-flight command: the gateway saw no entity.
    expect(second.status).toBe(201);
    expect(up.calls).toHaveLength(2);
    expect(up.calls[1]!.entity).toBeNull();
    expect(up.maxInflightTotal).toBe(2);
    gate.open();
    expect((await first).status).toBe(201);
    // With the check (the real fold) the same body is refused while bob's slot is held.
    fold.mode = 'real';
    await expectProblem(await command(gw.url, P, { key: 'k-third', body: '{"Customer":"bob"}' }), 400, 'invalid-entity');
    expect(up.calls).toHaveLength(2);
  });
});

describe('key from the body: a member that differs from a pointer token only in case is 400 invalid-idempotency-key', () => {
  const cases: [string, string, string, string | null][] = [
    ['the key member', '/request_id', '{"Request_ID":"k-secret-1"}', null],
    ['the key member, with a key header too', '/request_id', '{"REQUEST_ID":"k-secret-1"}', 'k-header'],
    ['an earlier token', '/meta/request_id', '{"Meta":{"request_id":"k-secret-1"}}', null],
    ['the last token, nested', '/meta/request_id', `{"meta":{"reque${LONG_S}t_id":"k-secret-1"}}`, null],
  ];

  it.each(cases)('%s: refused, nothing stored, nothing forwarded, the value not echoed', async (_c, pointer, body, key) => {
    const { up, gw } = await setup({ entity: { header: 'X-Fence-Entity' }, fence: 'off', idempotencyKeyFrom: { json: pointer } });
    const before = snapshot(gw.sqlite);
    const problem = await expectProblem(await command(gw.url, P, { key, body }), 400, 'invalid-idempotency-key');
    expect(problem.detail).toContain('a member whose name differs only in case');
    expect(problem.detail).not.toContain('k-secret-1');
    expect(snapshot(gw.sqlite)).toBe(before);
    expect(up.calls).toHaveLength(0);
  });

  it('control: the exact-case member is the key', async () => {
    const { up, gw } = await setup({ fence: 'off', idempotencyKeyFrom: { json: '/meta/request_id' } });
    expect((await command(gw.url, P, { body: '{"meta":{"request_id":"k-body"}}' })).status).toBe(201);
    expect(recordRows(gw.sqlite, 'k-body')).toHaveLength(1);
    expect(up.calls).toHaveLength(1);
  });

  it('the gap, with the fold switched off: stored under the header key while a case-insensitive upstream deduplicates by the body key', async () => {
    const { up, gw } = await setup({ fence: 'off', idempotencyKeyFrom: { json: '/request_id' } });
    fold.mode = 'none';
    expect((await command(gw.url, P, { key: 'k-header', body: '{"Request_Id":"k-body"}' })).status).toBe(201);
    expect(recordRows(gw.sqlite, 'k-header')).toHaveLength(1);
    expect(up.calls).toHaveLength(1);
    // The exact-case body with the header is refused as two keys: the folded one was the same disagreement, unseen.
    fold.mode = 'real';
    await expectProblem(await command(gw.url, P, { key: 'k-header-2', body: '{"request_id":"k-body"}' }), 400, 'invalid-idempotency-key');
    await expectProblem(await command(gw.url, P, { key: 'k-header-3', body: '{"Request_Id":"k-body"}' }), 400, 'invalid-idempotency-key');
    expect(up.calls).toHaveLength(1);
  });
});

describe('an array is entered by an index only (RFC 6901)', () => {
  it("`/dimensions/length` on an array names no member: no entity, never the array's length", async () => {
    const { entityFromJson } = await import('../../src/http/command.js');
    const body = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));
    expect(entityFromJson('/dimensions/length', body({ dimensions: [1, 2, 3] }))).toEqual({ ok: true, entity: null });
    // Controls: an index reads the element, and an object's own `length` member is read.
    expect(entityFromJson('/dimensions/1', body({ dimensions: ['a', 'b', 'c'] }))).toEqual({ ok: true, entity: 'b' });
    expect(entityFromJson('/dimensions/length', body({ dimensions: { length: 'box-7' } }))).toEqual({ ok: true, entity: 'box-7' });
    // Not an index: a leading zero, a sign.
    expect(entityFromJson('/dimensions/01', body({ dimensions: ['a', 'b'] }))).toEqual({ ok: true, entity: null });
    expect(entityFromJson('/dimensions/-1', body({ dimensions: ['a', 'b'] }))).toEqual({ ok: true, entity: null });
  });
});
