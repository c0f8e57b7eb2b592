import { randomBytes } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { ConfigError } from '../../src/config/load.js';
import type { GatewayStore } from '../../src/store/types.js';
import { command, effectOf, expectProblem, paymentsRoute, rejectionRows, startTestGateway, type RouteInput, type TestGateway } from '../helpers/gateway.js';
import { rawRequest } from '../helpers/raw-http.js';
import { withoutFenceCheck, withoutIdempotency } from '../helpers/store-wrappers.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0)) await c();
});

async function setup(routes: (upstream: string) => RouteInput[], env: Record<string, string> = {}): Promise<{ up: FakeUpstream; gw: TestGateway }> {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const gw = await startTestGateway({ routes: routes(up.url), env });
  cleanups.push(() => gw.close());
  return { up, gw };
}

describe('replay', () => {
  it('is byte-identical: status, binary body, allow-listed headers; never set-cookie; marked Idempotent-Replayed', async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(u)]);
    // Every byte value, then noise: a replay that re-encoded the body as text would show.
    const responseBody = Buffer.concat([Buffer.from(Array.from({ length: 256 }, (_, i) => i)), randomBytes(4096)]);
    up.behave(() => ({
      kind: 'respond',
      status: 202,
      headers: {
        'content-type': 'application/octet-stream',
        etag: '"v1"',
        location: '/charges/ch_1',
        'set-cookie': ['session=abc; HttpOnly', 'tracking=1'],
        'x-internal': 'not on the allow-list',
      },
      body: responseBody,
    }));
    const requestBody = randomBytes(2048);
    const headers: [string, string][] = [
      ['X-Execution-Fence', '1'],
      ['X-Fence-Entity', 'e'],
      ['Idempotency-Key', 'bin'],
      ['Content-Type', 'application/octet-stream'],
    ];
    const first = await rawRequest(gw.url, { path: '/payments/blob', headers, body: requestBody });
    expect(first.status).toBe(202);
    expect(first.body.equals(responseBody)).toBe(true);
    expect(first.headers['set-cookie']).toBeDefined(); // the live answer is passed through
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    expect(up.calls[0]!.body.equals(requestBody)).toBe(true);

    for (let i = 0; i < 2; i++) {
      const replay = await rawRequest(gw.url, { path: '/payments/blob', headers, body: requestBody });
      expect(replay.status).toBe(202);
      expect(replay.body.equals(responseBody)).toBe(true);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.headers['content-type']).toBe('application/octet-stream');
      expect(replay.headers.etag).toBe('"v1"');
      expect(replay.headers.location).toBe('/charges/ch_1');
      expect(replay.headers['set-cookie']).toBeUndefined();
      expect(replay.headers['x-internal']).toBeUndefined();
    }
    expect(up.effects).toBe(1);
  });

  it('a quoted key (sf-string) is the same key as the bare one', async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(u)]);
    const first = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'abc' });
    const second = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: '"abc"' });
    expect(second.headers.get('idempotent-replayed')).toBe('true');
    expect(await second.text()).toBe(await first.text());
    expect(up.effects).toBe(1);
  });
});

describe('fence and idempotency interplay (DESIGN §3)', () => {
  it('a newer fence with a completed key gets the replay; a stale fence with a completed key is refused', async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(u)]);
    const w1 = await command(gw.url, '/payments/charges', { fence: 41, entity: 'tool-job:7', key: 'tool-job:7:pay' });
    expect(w1.status).toBe(201);
    const paid = await w1.text();

    // W2 took the job over (fence 42) and retries the step: it learns that W1 paid.
    const w2 = await command(gw.url, '/payments/charges', { fence: 42, entity: 'tool-job:7', key: 'tool-job:7:pay' });
    expect(w2.status).toBe(201);
    expect(w2.headers.get('idempotent-replayed')).toBe('true');
    expect(await w2.text()).toBe(paid);

    // W1 wakes up and retries: the fence check comes first, even with a stored response.
    const late = await command(gw.url, '/payments/charges', { fence: 41, entity: 'tool-job:7', key: 'tool-job:7:pay' });
    await expectProblem(late, 409, 'stale-fence', { entity: 'tool-job:7', presented_fence: '41', current_fence: '42' });
    expect(late.headers.get('idempotent-replayed')).toBeNull();
    expect(rejectionRows(gw.sqlite, 'stale-fence')).toMatchObject([{ entity: 'tool-job:7', idempotency_key: 'tool-job:7:pay' }]);
    expect(up.effects).toBe(1);
  });

  it('fences are per entity: a low fence on another entity is fine', async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(u)]);
    expect((await command(gw.url, '/payments/charges', { fence: 100, entity: 'a', key: 'k1' })).status).toBe(201);
    expect((await command(gw.url, '/payments/charges', { fence: 1, entity: 'b', key: 'k2' })).status).toBe(201);
    expect((await command(gw.url, '/payments/charges', { fence: '9223372036854775807', entity: 'c', key: 'k3' })).status).toBe(201);
    expect((await gw.admin('/v1/entities/c')).body.fence).toBe('9223372036854775807');
    expect(up.effects).toBe(3);
  });
});

describe('forwarding', () => {
  it('keeps method, path, query and body; strips hop-by-hop and configured headers; passes the fencing headers on; injects upstream credentials from the environment', async () => {
    const { up, gw } = await setup(
      (u) => [
        paymentsRoute(u, {
          upstreamHeaders: {
            Authorization: { env: 'PAY_TOKEN', prefix: 'Bearer ' },
            'X-Api-Key': { env: 'PAY_KEY' },
            'X-Static': 'literal',
          },
          stripHeaders: ['X-Gateway-Secret'],
        }),
      ],
      { PAY_TOKEN: 'sk_live_123', PAY_KEY: 'key-456' },
    );
    const body = Buffer.from('{"amount":1200,"currency":"eur"}');
    const res = await rawRequest(gw.url, {
      method: 'PUT',
      path: '/payments/charges/ch_1?expand=customer&note=a%20b',
      headers: [
        ['Connection', 'X-Hop-Secret'],
        ['X-Hop-Secret', 'named by Connection'],
        ['Keep-Alive', 'timeout=5'],
        ['TE', 'trailers'],
        ['Trailer', 'X-Checksum'],
        ['Proxy-Authorization', 'Basic cHJveHk6cHc='],
        ['Proxy-Connection', 'keep-alive'],
        ['Authorization', 'Bearer caller-token'],
        ['X-Gateway-Secret', 'for the gateway only'],
        ['X-Custom', 'kept'],
        ['X-Execution-Fence', '7'],
        ['X-Fence-Entity', 'job-7'],
        ['Idempotency-Key', 'fwd-1'],
        ['Content-Type', 'application/json'],
      ],
      body,
    });
    expect(res.status, res.text).toBe(201);
    const call = up.calls[0]!;
    expect(call.method).toBe('PUT');
    expect(call.url).toBe('/payments/charges/ch_1?expand=customer&note=a%20b');
    expect(call.body.equals(body)).toBe(true);
    const h = call.headers;
    for (const gone of ['x-hop-secret', 'keep-alive', 'te', 'trailer', 'proxy-authorization', 'proxy-connection', 'x-gateway-secret']) {
      expect(h[gone], gone).toBeUndefined();
    }
    expect(h.connection ?? '').not.toMatch(/x-hop-secret/i);
    expect(h['x-custom']).toBe('kept');
    expect(h['content-type']).toBe('application/json');
    expect(h['x-execution-fence']).toBe('7');
    expect(h['x-fence-entity']).toBe('job-7');
    expect(h['idempotency-key']).toBe('fwd-1');
    expect(h['x-request-id']).toBe(res.headers['x-request-id']);
    expect(h.host).toBe(`127.0.0.1:${up.port}`);
    // The caller's credential is for the gateway; the upstream gets the configured one.
    expect(h.authorization).toBe('Bearer sk_live_123');
    expect(h['x-api-key']).toBe('key-456');
    expect(h['x-static']).toBe('literal');
  });

  it("an upstream base path is kept in front of the request path; the X-Request-Id passed on is the gateway's own, not the caller's", async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(`${u}/v1/`)]);
    const res = await command(gw.url, '/payments/charges?expand=a', { fence: 1, entity: 'e', key: 'k', headers: { 'x-request-id': 'req-123' } });
    expect(res.status).toBe(201);
    const id = res.headers.get('x-request-id');
    expect(id).toMatch(/^[0-9a-f-]{36}$/);
    expect(up.calls[0]!.url).toBe('/v1/payments/charges?expand=a');
    expect(up.calls[0]!.headers['x-request-id']).toBe(id);
  });

  it('hop-by-hop headers of the upstream answer are not passed back to the caller', async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(u)]);
    up.behave(() => ({
      kind: 'respond',
      status: 201,
      headers: { connection: 'x-up-hop', 'x-up-hop': 'secret', 'keep-alive': 'timeout=5', 'x-kept': 'yes' },
      body: 'ok',
    }));
    const res = await rawRequest(gw.url, {
      path: '/payments/charges',
      headers: [
        ['X-Execution-Fence', '1'],
        ['X-Fence-Entity', 'e'],
        ['Idempotency-Key', 'k'],
      ],
      body: '{}',
    });
    expect(res.status).toBe(201);
    expect(res.headers['x-up-hop']).toBeUndefined();
    expect(res.headers['keep-alive']).toBeUndefined();
    expect(res.headers['x-kept']).toBe('yes');
    expect(res.text).toBe('ok');
  });

  it('a missing environment variable for upstreamHeaders stops start-up with a ConfigError naming the field', async () => {
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const start = startTestGateway({ routes: [paymentsRoute(up.url, { upstreamHeaders: { Authorization: { env: 'FENCEGATE_TEST_UNSET_TOKEN' } } })], env: {} });
    await expect(start).rejects.toBeInstanceOf(ConfigError);
    await expect(start).rejects.toThrow(/routes\[0\]\.upstreamHeaders\.Authorization.*FENCEGATE_TEST_UNSET_TOKEN/);
  });

  it('entity from a path parameter: percent-decoded, fenced, passed on; a caller-sent X-Fence-Entity cannot override it', async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(u, { name: 'invoices', match: { path: '/invoices/:invoice/pay' }, entity: { path: ':invoice' } })]);
    expect((await command(gw.url, '/invoices/inv-9/pay', { fence: 3, key: 'a', entity: 'spoofed' })).status).toBe(201);
    expect(up.calls[0]!.entity).toBe('inv-9');
    await expectProblem(await command(gw.url, '/invoices/inv-9/pay', { fence: 2, key: 'b' }), 409, 'stale-fence', { entity: 'inv-9', current_fence: '3' });
    expect((await command(gw.url, '/invoices/inv%2F10/pay', { fence: 1, key: 'c' })).status).toBe(201);
    expect(up.calls[1]!.entity).toBe('inv/10');
    expect(up.calls[1]!.url).toBe('/invoices/inv%2F10/pay');
    expect((await gw.admin('/v1/entities/inv-9')).body.fence).toBe('3');
    expect(up.effects).toBe(2);
  });

  it('entity from a JSON pointer into the body: a string or an integer', async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(u, { name: 'orders', match: { path: '/orders/*' }, entity: { json: '/order/id' } })]);
    expect((await command(gw.url, '/orders/pay', { fence: 5, key: 'a', body: '{"order":{"id":"o-1"},"amount":1}' })).status).toBe(201);
    expect(up.calls[0]!.entity).toBe('o-1');
    await expectProblem(await command(gw.url, '/orders/pay', { fence: 4, key: 'b', body: '{"order":{"id":"o-1"}}' }), 409, 'stale-fence', { entity: 'o-1' });
    expect((await command(gw.url, '/orders/pay', { fence: 1, key: 'c', body: '{"order":{"id":42}}' })).status).toBe(201);
    expect(up.calls[1]!.entity).toBe('42');
    expect(up.effects).toBe(2);
  });
});

describe('routes where the fence or the key is optional or off still proxy', () => {
  it('fence and idempotency off: no headers needed, nothing deduplicated, invalid headers ignored', async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(u, { name: 'open', match: { path: '/open/*' }, fence: 'off', idempotency: 'off' })]);
    expect((await command(gw.url, '/open/mail')).status).toBe(201);
    expect((await command(gw.url, '/open/mail')).status).toBe(201);
    expect((await command(gw.url, '/open/mail', { fence: '+1', key: '"bad' })).status).toBe(201);
    expect(up.effects).toBe(3);
  });

  it('fence and idempotency optional: absent headers proxy; present ones are checked', async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(u, { name: 'opt', match: { path: '/opt/*' }, fence: 'optional', idempotency: 'optional' })]);
    // Neither: proxied every time.
    expect((await command(gw.url, '/opt/x')).status).toBe(201);
    expect((await command(gw.url, '/opt/x')).status).toBe(201);
    expect(up.effects).toBe(2);

    // A key without a fence: deduplicated.
    const a = await command(gw.url, '/opt/x', { key: 'k' });
    const b = await command(gw.url, '/opt/x', { key: 'k' });
    expect(b.headers.get('idempotent-replayed')).toBe('true');
    expect((await effectOf(b)).effect).toBe((await effectOf(a)).effect);
    expect(up.effects).toBe(3);

    // A fence without a key: fenced.
    expect((await command(gw.url, '/opt/x', { fence: 5, entity: 'e' })).status).toBe(201);
    await expectProblem(await command(gw.url, '/opt/x', { fence: 4, entity: 'e' }), 409, 'stale-fence');
    // Present but malformed is still an error; a fence still needs its entity.
    await expectProblem(await command(gw.url, '/opt/x', { fence: '05', entity: 'e' }), 400, 'invalid-fence');
    await expectProblem(await command(gw.url, '/opt/x', { key: '' }), 400, 'invalid-idempotency-key');
    await expectProblem(await command(gw.url, '/opt/x', { fence: 6 }), 400, 'missing-entity');
    expect(up.effects).toBe(4);
  });
});

// CONTRIBUTING.md convention 7: a test that would pass with the feature removed is not a
// test. Each scenario runs twice on the same real components: once as
// shipped (the safety property holds), once with the check switched off by
// wrapping the store the gateway is given (the violation shows at the
// upstream). The gateway itself has no switch for this.

async function runControl(wrapStore: ((s: GatewayStore) => GatewayStore) | undefined, scenario: (url: string) => Promise<void>) {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const gw = await startTestGateway({ routes: [paymentsRoute(up.url)], wrapStore });
  cleanups.push(() => gw.close());
  await scenario(gw.url);
  return { up, gw };
}

describe('G1 stale fence', () => {
  // W1 (fence 41) freezes; W2 (fence 42) takes the job over and pays; W1 wakes up and pays too.
  const scenario = async (url: string) => {
    await command(url, '/payments/charges', { fence: 42, entity: 'tool-job:1', key: 'w2-pay' });
    await command(url, '/payments/charges', { fence: 41, entity: 'tool-job:1', key: 'w1-pay' });
  };

  it('as shipped: the late request of the old owner never reaches the upstream', async () => {
    const { up, gw } = await runControl(undefined, scenario);
    expect(up.calls.map((c) => c.fence)).toEqual(['42']);
    expect(rejectionRows(gw.sqlite, 'stale-fence')).toHaveLength(1);
  });

  it('control, fence check off: the stale request reaches the upstream (a second payment)', async () => {
    const { up, gw } = await runControl(withoutFenceCheck, scenario);
    expect(up.calls.map((c) => c.fence)).toEqual(['42', '41']);
    expect(rejectionRows(gw.sqlite, 'stale-fence')).toHaveLength(0);
  });
});

describe('G2 idempotency', () => {
  // An SDK retries after a lost response, with the same key.
  const scenario = async (url: string) => {
    for (let i = 0; i < 3; i++) await command(url, '/payments/charges', { fence: 1, entity: 'tool-job:2', key: 'tool-job:2:pay' });
  };

  it('as shipped: one effect, the retries are replays', async () => {
    const { up } = await runControl(undefined, scenario);
    expect(up.effects).toBe(1);
  });

  it('control, idempotency off: every retry is another effect', async () => {
    const { up } = await runControl(withoutIdempotency, scenario);
    expect(up.effects).toBe(3);
    expect(up.calls.every((c) => c.key === 'tool-job:2:pay')).toBe(true);
  });
});
