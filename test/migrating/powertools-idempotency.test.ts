import { afterEach, describe, expect, it } from 'vitest';
import { recordRows } from '../helpers/gateway.js';
import type { InProcessGateway } from '../helpers/in-process.js';
import { peerGateway, send } from './peer.js';

// examples/migrating/powertools-idempotency.json: Powertools for AWS Lambda
// (TypeScript) idempotency with `eventKeyJmesPath: 'powertools_json(body).request_id'`
// and its defaults, as documented (docs/migrating.md; not run here).

const open: InProcessGateway[] = [];
afterEach(async () => {
  for (const g of open.splice(0)) await g.close();
});
function gw(): { g: InProcessGateway; file: any } {
  const r = peerGateway('powertools-idempotency');
  open.push(r.g);
  return r;
}

describe('Powertools idempotency defaults', () => {
  it('the key is the body field: a retry is the replay, kept for 1 hour', async () => {
    const { g, file } = gw();
    const body = '{"request_id":"ord-1","amount":5}';
    expect((await send(g, '/orders', { body })).status).toBe(201);
    expect((await send(g, '/orders', { body })).headers.get('idempotent-replayed')).toBe('true');
    expect(recordRows(g.sqlite, 'ord-1')).toHaveLength(1);
    expect(file.routes[0].retention).toBe('1h');
    expect(g.config.routes[0]!.retention).toBe(3_600_000);
  });

  it('no payload validation by default: another payload with the same key gets the stored answer (the risk)', async () => {
    const { g } = gw();
    const first = await send(g, '/orders', { body: '{"request_id":"ord-2","amount":5}' });
    const other = await send(g, '/orders', { body: '{"request_id":"ord-2","amount":999}' });
    expect(other.status).toBe(201);
    expect(other.headers.get('idempotent-replayed')).toBe('true');
    expect(await other.text()).toBe(await first.text());
    expect(g.upstream.effects).toBe(1);
  });

  it('no key in the event: it runs, without idempotency (throwOnNoIdempotencyKey false)', async () => {
    const { g } = gw();
    await send(g, '/orders', { body: '{"amount":5}' });
    await send(g, '/orders', { body: '{"amount":5}' });
    expect(g.upstream.effects).toBe(2);
  });

  it('a handler that throws leaves no record (500/502 released); a returned 4xx is kept', async () => {
    const { g } = gw();
    g.upstream.behave((c) =>
      c.seq === 1
        ? { kind: 'respond', status: 502, body: 'Internal server error' }
        : c.seq === 3
          ? { kind: 'respond', status: 400, body: '{"error":"bad"}' }
          : undefined,
    );
    expect((await send(g, '/orders', { body: '{"request_id":"ord-3"}' })).status).toBe(502);
    expect((await send(g, '/orders', { body: '{"request_id":"ord-3"}' })).status).toBe(201);
    expect((await send(g, '/orders', { body: '{"request_id":"ord-4"}' })).status).toBe(400);
    expect((await send(g, '/orders', { body: '{"request_id":"ord-4"}' })).status).toBe(400);
    expect(g.upstream.effects).toBe(3);
  });
});
