import { afterEach, describe, expect, it } from 'vitest';
import { expectProblem } from '../helpers/gateway.js';
import type { InProcessGateway } from '../helpers/in-process.js';
import { peerGateway, send } from './peer.js';

// examples/migrating/node-idempotency.json: @node-idempotency's defaults as
// its documentation and source state them (docs/migrating.md), not run here.

const open: InProcessGateway[] = [];
afterEach(async () => {
  for (const g of open.splice(0)) await g.close();
});
function gw(): InProcessGateway {
  const { g } = peerGateway('node-idempotency');
  open.push(g);
  return g;
}

describe('@node-idempotency defaults', () => {
  it('every status is kept, errors too: a 500 is replayed, not run again (releaseStatuses [])', async () => {
    const g = gw();
    g.upstream.behave(() => ({ kind: 'respond', status: 500, headers: { 'content-type': 'application/json' }, body: '{"error":"boom"}' }));
    expect((await send(g, '/orders', { key: 'k1' })).status).toBe(500);
    const again = await send(g, '/orders', { key: 'k1' });
    expect(again.status).toBe(500);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(await again.text()).toBe('{"error":"boom"}');
    expect(g.upstream.effects).toBe(1);
  });

  it('only Content-Type is replayed', async () => {
    const g = gw();
    g.upstream.behave(() => ({ kind: 'respond', status: 201, headers: { 'content-type': 'application/json', etag: '"v1"' }, body: '{}' }));
    expect((await send(g, '/orders', { key: 'k2' })).headers.get('etag')).toBe('"v1"');
    const again = await send(g, '/orders', { key: 'k2' });
    expect(again.headers.get('content-type')).toBe('application/json');
    expect(again.headers.get('etag')).toBeNull();
  });

  it('keys of 256 characters pass, 257 are 400; a missing key is not enforced', async () => {
    const g = gw();
    expect((await send(g, '/orders', { key: 'k'.repeat(256) })).status).toBe(201);
    await expectProblem(await send(g, '/orders', { key: 'k'.repeat(257) }), 400, 'invalid-idempotency-key');
    expect((await send(g, '/orders')).status).toBe(201);
  });

  it('409 with Retry-After while the first is in flight; 422 for another body', async () => {
    const g = gw();
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    g.upstream.behave((c) => (c.seq === 1 ? { kind: 'hold', gate } : undefined));
    const first = send(g, '/orders', { key: 'k3' });
    await g.upstream.arrived(1);
    const busy = await send(g, '/orders', { key: 'k3' });
    expect(busy.status).toBe(409);
    expect(busy.headers.get('retry-after')).not.toBeNull();
    release();
    await first;
    await expectProblem(await send(g, '/orders', { key: 'k3', body: '{"amount":1}' }), 422, 'idempotency-key-reused');
  });

  it('GET, HEAD and OPTIONS pass through untouched', async () => {
    const g = gw();
    await send(g, '/orders/1', { method: 'GET', key: 'k4' });
    await send(g, '/orders/1', { method: 'GET', key: 'k4' });
    expect(g.upstream.effects).toBe(2);
  });
});
