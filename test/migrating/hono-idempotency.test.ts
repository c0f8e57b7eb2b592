import { afterEach, describe, expect, it } from 'vitest';
import { expectProblem } from '../helpers/gateway.js';
import type { InProcessGateway } from '../helpers/in-process.js';
import { peerGateway, send } from './peer.js';

// examples/migrating/hono-idempotency.json: the peer's defaults as far as a
// gateway can have them (docs/migrating.md, "hono-idempotency").

const open: InProcessGateway[] = [];
afterEach(async () => {
  for (const g of open.splice(0)) await g.close();
});
function gw(): InProcessGateway {
  const { g } = peerGateway('hono-idempotency');
  open.push(g);
  return g;
}

describe('hono-idempotency defaults', () => {
  it('POST and PATCH with a key: forwarded once, then replayed (Idempotent-Replayed)', async () => {
    const g = gw();
    for (const method of ['POST', 'PATCH']) {
      expect((await send(g, '/api/payments', { method, key: `k-${method}` })).status).toBe(201);
      expect((await send(g, '/api/payments', { method, key: `k-${method}` })).headers.get('idempotent-replayed')).toBe('true');
    }
    expect(g.upstream.effects).toBe(2);
  });

  it('other methods and keyless requests pass through, never stored', async () => {
    const g = gw();
    await send(g, '/api/payments', { method: 'PUT', key: 'k' });
    await send(g, '/api/payments', { method: 'PUT', key: 'k' });
    await send(g, '/api/payments');
    await send(g, '/api/payments');
    expect((await send(g, '/api/payments', { method: 'GET' })).status).toBe(201);
    expect(g.upstream.effects).toBe(5);
  });

  it('a non-2xx answer is not stored: the retry runs again (releaseStatuses 300-599)', async () => {
    const g = gw();
    g.upstream.behave((c) => (c.seq === 1 ? { kind: 'respond', status: 500, body: 'boom' } : undefined));
    expect((await send(g, '/api/payments', { key: 'k1' })).status).toBe(500);
    expect((await send(g, '/api/payments', { key: 'k1' })).status).toBe(201);
    expect(g.upstream.effects).toBe(2);
  });

  it('key rules: 256 characters pass, 257 are 400; another body under the key is 422', async () => {
    const g = gw();
    expect((await send(g, '/api/payments', { key: 'k'.repeat(256) })).status).toBe(201);
    await expectProblem(await send(g, '/api/payments', { key: 'k'.repeat(257) }), 400, 'invalid-idempotency-key');
    await expectProblem(await send(g, '/api/payments', { key: 'k'.repeat(256), body: '{"amount":1}' }), 422, 'idempotency-key-reused');
  });

  it('a key in flight is 409 with Retry-After', async () => {
    const g = gw();
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    g.upstream.behave(() => ({ kind: 'hold', gate }));
    const first = send(g, '/api/payments', { key: 'slow' });
    await g.upstream.arrived(1);
    const second = await expectProblem(await send(g, '/api/payments', { key: 'slow' }), 409, 'idempotency-in-progress');
    expect(second.retry_after).toBeGreaterThan(0);
    release();
    expect((await first).status).toBe(201);
  });
});
