import { afterEach, describe, expect, it } from 'vitest';
import { effectOf, expectProblem, expireLocks, recordRows, rejectionRows, snapshot } from '../helpers/gateway.js';
import { inProcessGateway, type InProcessGateway, type InProcessOptions } from '../helpers/in-process.js';
import { withoutFenceCheck, withoutIdempotency } from '../helpers/store-wrappers.js';

// The decision order of DESIGN §3.5 (a–h) and the finish of DESIGN §3.7, in
// seconds: the real Hono app through `app.request`, SQLite in memory, an
// upstream in this process (test/helpers/in-process.ts). The loopback suites
// under test/gateway cover the same rules over real sockets and files.

const P = '/payments/charges';
const open: InProcessGateway[] = [];
afterEach(async () => {
  for (const g of open.splice(0)) await g.close();
});

function gateway(route: Record<string, unknown> = {}, options: Omit<InProcessOptions, 'routes'> = {}): InProcessGateway {
  const g = inProcessGateway({
    ...options,
    routes: [{ name: 'payments', match: { path: '/payments/*' }, timeoutMs: 5_000, serialWaitMs: 0, ...route }],
  });
  open.push(g);
  return g;
}

function gate(): { promise: Promise<void>; open(): void } {
  let open!: () => void;
  const promise = new Promise<void>((r) => (open = r));
  return { promise, open };
}

describe('refused before admission: no state, no upstream call', () => {
  it('404 no-route, and 400 for each header problem', async () => {
    const g = gateway();
    const before = snapshot(g.sqlite);
    await expectProblem(await g.command('/nothing/here', { fence: 1, entity: 'e', key: 'k' }), 404, 'no-route');
    await expectProblem(await g.command(P, { entity: 'e', key: 'k' }), 400, 'missing-fence');
    await expectProblem(await g.command(P, { fence: '05', entity: 'e', key: 'k' }), 400, 'invalid-fence');
    await expectProblem(await g.command(P, { fence: '9223372036854775808', entity: 'e', key: 'k' }), 400, 'invalid-fence');
    await expectProblem(await g.command(P, { fence: 5, entity: 'e' }), 400, 'missing-idempotency-key');
    await expectProblem(await g.command(P, { fence: 5, entity: 'e', key: '..' }), 400, 'invalid-idempotency-key');
    await expectProblem(await g.command(P, { fence: 5, key: 'k' }), 400, 'missing-entity');
    await expectProblem(await g.command(P, { fence: 5, entity: 'x'.repeat(513), key: 'k' }), 400, 'invalid-entity');
    await expectProblem(await g.command('/payments/a/..%2Fb', { fence: 5, entity: 'e', key: 'k' }), 400, 'invalid-request');
    expect(g.upstream.effects).toBe(0);
    expect(snapshot(g.sqlite)).toBe(before);
  });

  it('413 payload-too-large', async () => {
    const g = gateway({ maxBodyBytes: 16 });
    await expectProblem(await g.command(P, { fence: 1, entity: 'e', key: 'k', body: 'x'.repeat(17) }), 413, 'payload-too-large');
    expect(g.upstream.effects).toBe(0);
  });
});

describe('admission (DESIGN §3.5)', () => {
  it('(b) a new key is forwarded once, (c) its retry is the replay: same status and bytes, Idempotent-Replayed', async () => {
    const g = gateway();
    const first = await g.command(P, { fence: 1, entity: 'job:1', key: 'pay-1' });
    expect(first.status).toBe(201);
    const body = await first.text();
    const again = await g.command(P, { fence: 1, entity: 'job:1', key: 'pay-1' });
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(await again.text()).toBe(body);
    expect(g.upstream.effects).toBe(1);
    expect(g.upstream.calls[0]).toMatchObject({ method: 'POST', url: P, fence: '1', entity: 'job:1', key: 'pay-1' });
    expect(recordRows(g.sqlite, 'pay-1').map((r) => r.state)).toEqual(['completed']);
  });

  /** Fence 5 goes through, then fence 3 for the same entity with a fresh key. */
  async function staleAfterNewer(g: InProcessGateway): Promise<Response> {
    expect((await g.command(P, { fence: 5, entity: 'job:1', key: 'a' })).status).toBe(201);
    return g.command(P, { fence: 3, entity: 'job:1', key: 'b' });
  }

  it('(a) a lower fence is refused 409 stale-fence and logged; an equal one passes', async () => {
    const g = gateway();
    await expectProblem(await staleAfterNewer(g), 409, 'stale-fence', { entity: 'job:1', presented_fence: '3', current_fence: '5' });
    expect(g.upstream.calls.map((c) => c.fence)).toEqual(['5']);
    expect(rejectionRows(g.sqlite, 'stale-fence')).toMatchObject([{ entity: 'job:1', idempotency_key: 'b' }]);
    expect((await g.command(P, { fence: 5, entity: 'job:1', key: 'c' })).status).toBe(201);
    // Negative control: a store that never sees the fence lets the stale command through.
    const blind = gateway({}, { wrapStore: withoutFenceCheck });
    expect((await staleAfterNewer(blind)).status).toBe(201);
    expect(blind.upstream.calls.map((c) => c.fence)).toEqual(['5', '3']);
  });

  it('(a) comes first: a stale fence is refused even for a key with a stored answer; a newer owner reusing it gets the replay', async () => {
    const g = gateway();
    const first = await effectOf(await g.command(P, { fence: 1, entity: 'job:1', key: 'pay' }));
    expect((await g.command(P, { fence: 2, entity: 'job:1', key: 'other' })).status).toBe(201);
    await expectProblem(await g.command(P, { fence: 1, entity: 'job:1', key: 'pay' }), 409, 'stale-fence');
    const newer = await g.command(P, { fence: 3, entity: 'job:1', key: 'pay' });
    expect(newer.headers.get('idempotent-replayed')).toBe('true');
    expect(await effectOf(newer)).toEqual(first);
    expect(g.upstream.effects).toBe(2);
  });

  it('(d) the same key with another body, or for another entity: 422 idempotency-key-reused, logged', async () => {
    const g = gateway();
    expect((await g.command(P, { fence: 1, entity: 'job:1', key: 'k' })).status).toBe(201);
    await expectProblem(await g.command(P, { fence: 1, entity: 'job:1', key: 'k', body: '{"amount":9999}' }), 422, 'idempotency-key-reused');
    await expectProblem(await g.command(P, { fence: 1, entity: 'job:2', key: 'k' }), 422, 'idempotency-key-reused');
    expect(rejectionRows(g.sqlite, 'idempotency-key-reused')).toHaveLength(2);
    expect(g.upstream.effects).toBe(1);
    // Negative control: without the key the store cannot tell, and the second body is charged too.
    const blind = gateway({}, { wrapStore: withoutIdempotency });
    expect((await blind.command(P, { fence: 1, entity: 'job:1', key: 'k' })).status).toBe(201);
    expect((await blind.command(P, { fence: 1, entity: 'job:1', key: 'k', body: '{"amount":9999}' })).status).toBe(201);
    expect(blind.upstream.effects).toBe(2);
  });

  it('(e) the same key while in flight: 409 idempotency-in-progress with Retry-After; (h) another key for the entity in serial mode: 409 entity-busy', async () => {
    const g = gateway();
    const held = gate();
    g.upstream.behave(() => ({ kind: 'hold', gate: held.promise }));
    const first = g.command(P, { fence: 1, entity: 'job:1', key: 'k' });
    await g.upstream.arrived(1);
    const dup = await expectProblem(await g.command(P, { fence: 1, entity: 'job:1', key: 'k' }), 409, 'idempotency-in-progress');
    expect(dup.retry_after).toBeGreaterThan(0);
    const busy = await g.command(P, { fence: 1, entity: 'job:1', key: 'k2' });
    expect(Number(busy.headers.get('retry-after'))).toBeGreaterThan(0);
    await expectProblem(busy, 409, 'entity-busy');
    // Another entity is not held up.
    g.upstream.behave(null);
    expect((await g.command(P, { fence: 1, entity: 'job:2', key: 'k3' })).status).toBe(201);
    held.open();
    expect((await first).status).toBe(201);
    expect(g.upstream.calls.map((c) => c.key)).toEqual(['k', 'k3']);
  });

  it('(f) an in-progress record whose lock expired becomes outcome_unknown; (g) it is refused 409 outcome-unknown, logged', async () => {
    const g = gateway({ mode: 'concurrent' });
    const held = gate();
    g.upstream.behave(() => ({ kind: 'hold', gate: held.promise }));
    const first = g.command(P, { fence: 1, entity: 'job:1', key: 'k' });
    await g.upstream.arrived(1);
    expireLocks(g.sqlite, 'k', 'job:1');
    await expectProblem(await g.command(P, { fence: 1, entity: 'job:1', key: 'k' }), 409, 'outcome-unknown');
    expect(recordRows(g.sqlite, 'k').map((r) => r.state)).toEqual(['outcome_unknown']);
    expect(rejectionRows(g.sqlite, 'outcome-unknown')).toHaveLength(1);
    held.open();
    await (await first).text();
    expect(g.upstream.effects).toBe(1);
  });

  it('(g) with onUnknown "retry" the next request takes the record over and is forwarded again', async () => {
    const g = gateway({ onUnknown: 'retry' });
    g.upstream.behave(() => ({ kind: 'reset' }));
    await expectProblem(await g.command(P, { fence: 1, entity: 'job:1', key: 'k' }), 504, 'upstream-timeout');
    g.upstream.behave(null);
    expect((await g.command(P, { fence: 1, entity: 'job:1', key: 'k' })).status).toBe(201);
    expect(g.upstream.effects).toBe(2);
    expect(recordRows(g.sqlite, 'k').map((r) => r.state)).toEqual(['completed']);
  });
});

describe('finish (DESIGN §3.7)', () => {
  it('nothing sent: 502 upstream-unavailable, record released, the retry is forwarded', async () => {
    const g = gateway();
    g.upstream.behave(() => ({ kind: 'refuse' }));
    await expectProblem(await g.command(P, { fence: 1, entity: 'job:1', key: 'k' }), 502, 'upstream-unavailable');
    expect(recordRows(g.sqlite, 'k')).toEqual([]);
    g.upstream.behave(null);
    expect((await g.command(P, { fence: 1, entity: 'job:1', key: 'k' })).status).toBe(201);
  });

  it('reset after sending: 504 upstream-timeout, record outcome_unknown, the retry refused 409 outcome-unknown', async () => {
    const g = gateway();
    g.upstream.behave(() => ({ kind: 'reset' }));
    await expectProblem(await g.command(P, { fence: 1, entity: 'job:1', key: 'k' }), 504, 'upstream-timeout');
    expect(recordRows(g.sqlite, 'k').map((r) => r.state)).toEqual(['outcome_unknown']);
    g.upstream.behave(null);
    await expectProblem(await g.command(P, { fence: 1, entity: 'job:1', key: 'k' }), 409, 'outcome-unknown');
    expect(g.upstream.effects).toBe(1);
  });

  it('429 and 503 release the record; any other status (500 included) is stored and replayed', async () => {
    const g = gateway();
    g.upstream.behave(() => ({ kind: 'respond', status: 429, body: 'slow down' }));
    expect((await g.command(P, { fence: 1, entity: 'job:1', key: 'k' })).status).toBe(429);
    expect(recordRows(g.sqlite, 'k')).toEqual([]);
    g.upstream.behave(() => ({ kind: 'respond', status: 500, body: 'boom' }));
    expect((await g.command(P, { fence: 1, entity: 'job:1', key: 'k' })).status).toBe(500);
    const replay = await g.command(P, { fence: 1, entity: 'job:1', key: 'k' });
    expect(replay.status).toBe(500);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await replay.text()).toBe('boom');
    expect(g.upstream.effects).toBe(2);
  });
});
