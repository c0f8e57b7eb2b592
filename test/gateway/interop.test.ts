import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { createFetchForwarder } from '../../src/http/forward-fetch.js';
import { createGateway } from '../../src/http/gateway.js';
import { SqliteGatewayStore } from '../../src/store/sqlite/gateway-store.js';
import { expectProblem, recordRows, snapshot } from '../helpers/gateway.js';
import { inProcessGateway, inProcessUpstream, type InProcessGateway } from '../helpers/in-process.js';

// The options a user switching from an idempotency middleware reaches for,
// through the real app (`app.request`, SQLite in memory, an in-process
// upstream that counts effects). Fences are off: these routes are the
// middleware's job, keys only.

const P = '/pay/charges';
const open: InProcessGateway[] = [];
afterEach(async () => {
  for (const g of open.splice(0)) await g.close();
});

function gateway(route: Record<string, unknown> = {}): InProcessGateway {
  const g = inProcessGateway({ routes: [{ name: 'pay', match: { path: '/pay/*' }, fence: 'off', mode: 'concurrent', ...route }] });
  open.push(g);
  return g;
}

describe('a quoted key keeps the spaces inside its quotes', () => {
  it('" padded key " is the key ` padded key `: forwarded once, replayed, another key than the bare one', async () => {
    const g = gateway();
    expect((await g.command(P, { key: '" padded key "' })).status).toBe(201);
    const again = await g.command(P, { key: '" padded key "' });
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(recordRows(g.sqlite, ' padded key ')).toHaveLength(1);
    // The upstream gets the header as sent, so it reads the same key.
    expect(g.upstream.calls[0]!.key).toBe('" padded key "');
    expect((await g.command(P, { key: 'padded key' })).headers.get('idempotent-replayed')).toBeNull();
    expect(g.upstream.effects).toBe(2);
  });
});

describe('maxKeyLength', () => {
  it('refuses a longer key (400, no state, no upstream call) and accepts one at the limit', async () => {
    const g = gateway({ maxKeyLength: 8 });
    const before = snapshot(g.sqlite);
    await expectProblem(await g.command(P, { key: 'k'.repeat(9) }), 400, 'invalid-idempotency-key');
    expect(snapshot(g.sqlite)).toBe(before);
    expect(g.upstream.effects).toBe(0);
    expect((await g.command(P, { key: 'k'.repeat(8) })).status).toBe(201);
  });

  it('may be raised past the default of 255', async () => {
    expect((await gateway({ maxKeyLength: 300 }).command(P, { key: 'k'.repeat(300) })).status).toBe(201);
    await expectProblem(await gateway().command(P, { key: 'k'.repeat(256) }), 400, 'invalid-idempotency-key');
  });
});

describe('idempotencyKeyFrom: the key from the body', () => {
  const route = { idempotencyKeyFrom: { json: '/request_id' } };

  it('without a key header, the body field is the key: its retry is the replay', async () => {
    const g = gateway(route);
    const body = '{"request_id":"req-1","amount":5}';
    expect((await g.command(P, { body })).status).toBe(201);
    expect((await g.command(P, { body })).headers.get('idempotent-replayed')).toBe('true');
    expect(recordRows(g.sqlite, 'req-1')).toHaveLength(1);
    // An integer is its decimal text.
    expect((await g.command(P, { body: '{"request_id":42}' })).status).toBe(201);
    expect(recordRows(g.sqlite, '42')).toHaveLength(1);
    expect(g.upstream.effects).toBe(2);
  });

  it('a header and a body key that agree are one key; that disagree: 400, no state, no upstream call', async () => {
    const g = gateway(route);
    expect((await g.command(P, { key: 'same', body: '{"request_id":"same"}' })).status).toBe(201);
    expect(recordRows(g.sqlite, 'same')).toHaveLength(1);
    const before = snapshot(g.sqlite);
    await expectProblem(await g.command(P, { key: 'from-header', body: '{"request_id":"from-body"}' }), 400, 'invalid-idempotency-key');
    expect(snapshot(g.sqlite)).toBe(before);
    expect(g.upstream.effects).toBe(1);
    // A header key with a body that holds no key there is the header's key.
    expect((await g.command(P, { key: 'only-header', body: '{"amount":5}' })).status).toBe(201);
    expect(recordRows(g.sqlite, 'only-header')).toHaveLength(1);
  });

  it('refusals: no key anywhere (400 missing), a repeated member (400 invalid), a key that breaks the rules', async () => {
    const g = gateway(route);
    const before = snapshot(g.sqlite);
    await expectProblem(await g.command(P, { body: '{"amount":5}' }), 400, 'missing-idempotency-key');
    await expectProblem(await g.command(P, { body: 'not json' }), 400, 'missing-idempotency-key');
    await expectProblem(await g.command(P, { body: '{"request_id":"a","request_id":"b"}' }), 400, 'invalid-idempotency-key');
    await expectProblem(await g.command(P, { body: '{"request_id":".."}' }), 400, 'invalid-idempotency-key');
    expect(snapshot(g.sqlite)).toBe(before);
    expect(g.upstream.effects).toBe(0);
  });

  it('idempotency "optional": a body without the field is forwarded without a record', async () => {
    const g = gateway({ ...route, idempotency: 'optional' });
    expect((await g.command(P, { body: '{"amount":5}' })).status).toBe(201);
    expect((await g.command(P, { body: '{"amount":5}' })).status).toBe(201);
    expect(g.upstream.effects).toBe(2);
  });
});

describe('fingerprint options', () => {
  const first = '{"amount":1200,"currency":"eur","timestamp":"2024-05-01T10:00:00Z"}';
  const retry = '{"amount":1200,"currency":"eur","timestamp":"2024-05-01T10:00:07Z"}';

  it('ignore: a retry with a regenerated timestamp is the replay; another amount is 422', async () => {
    const g = gateway({ fingerprint: { ignore: ['/timestamp'] } });
    expect((await g.command(P, { key: 'k1', body: first })).status).toBe(201);
    const again = await g.command(P, { key: 'k1', body: retry });
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    await expectProblem(await g.command(P, { key: 'k1', body: retry.replace('1200', '1300') }), 422, 'idempotency-key-reused');
    expect(g.upstream.effects).toBe(1);
  });

  it('negative control: with the default (raw body) the same retry is 422', async () => {
    const g = gateway();
    expect((await g.command(P, { key: 'k1', body: first })).status).toBe(201);
    await expectProblem(await g.command(P, { key: 'k1', body: retry }), 422, 'idempotency-key-reused');
  });

  it('json: only the named fields count', async () => {
    const g = gateway({ fingerprint: { json: ['/amount', '/currency'] } });
    await g.command(P, { key: 'k1', body: first });
    expect((await g.command(P, { key: 'k1', body: '{"currency":"eur","amount":1200,"note":"x"}' })).headers.get('idempotent-replayed')).toBe('true');
    await expectProblem(await g.command(P, { key: 'k1', body: first.replace('eur', 'usd') }), 422, 'idempotency-key-reused');
  });

  it('a non-JSON body is fingerprinted raw: the same bytes replay, other bytes are 422', async () => {
    const g = gateway({ fingerprint: { ignore: ['/timestamp'] } });
    const form = 'amount=1200&timestamp=1';
    await g.command(P, { key: 'f1', body: form, headers: { 'content-type': 'application/x-www-form-urlencoded' } });
    expect(
      (await g.command(P, { key: 'f1', body: form, headers: { 'content-type': 'application/x-www-form-urlencoded' } })).headers.get('idempotent-replayed'),
    ).toBe('true');
    await expectProblem(
      await g.command(P, { key: 'f1', body: 'amount=1200&timestamp=2', headers: { 'content-type': 'application/x-www-form-urlencoded' } }),
      422,
      'idempotency-key-reused',
    );
  });

  it('a body that repeats a member name is fingerprinted raw, so it never shares an answer with the body one parser reads it as', async () => {
    const g = gateway({ fingerprint: { ignore: ['/timestamp'] } });
    await g.command(P, { key: 'd1', body: '{"amount":1,"amount":2}' });
    await expectProblem(await g.command(P, { key: 'd1', body: '{"amount":2}' }), 422, 'idempotency-key-reused');
    // Negative control: canonicalising what JSON.parse read would have made them one command.
    const naive = (s: string) => JSON.stringify(JSON.parse(s));
    expect(naive('{"amount":1,"amount":2}')).toBe(naive('{"amount":2}'));
  });
});

describe('keyScope: keys per tenant without caller auth', () => {
  it('two tenants with one key are two commands; one tenant retrying gets its replay', async () => {
    const g = gateway({ keyScope: { header: 'X-Tenant-Id' } });
    const a = await g.command(P, { key: 'order-1', headers: { 'x-tenant-id': 'acme' } });
    const b = await g.command(P, { key: 'order-1', headers: { 'x-tenant-id': 'globex' } });
    expect(await b.text()).not.toBe(await a.text());
    expect((await g.command(P, { key: 'order-1', headers: { 'x-tenant-id': 'acme' } })).headers.get('idempotent-replayed')).toBe('true');
    expect(g.upstream.effects).toBe(2);
  });

  it("negative control: without keyScope the second tenant is handed the first tenant's answer", async () => {
    const g = gateway();
    const a = await g.command(P, { key: 'order-1', headers: { 'x-tenant-id': 'acme' } });
    const b = await g.command(P, { key: 'order-1', headers: { 'x-tenant-id': 'globex' } });
    expect(b.headers.get('idempotent-replayed')).toBe('true');
    expect(await b.text()).toBe(await a.text());
  });

  it('a missing or repeated scope header is 400, no state, no upstream call', async () => {
    const g = gateway({ keyScope: { header: 'X-Tenant-Id' } });
    const before = snapshot(g.sqlite);
    await expectProblem(await g.command(P, { key: 'order-1' }), 400, 'invalid-request');
    await expectProblem(await g.command(P, { key: 'order-1', headers: { 'x-tenant-id': 'a, b' } }), 400, 'invalid-request');
    expect(snapshot(g.sqlite)).toBe(before);
    expect(g.upstream.effects).toBe(0);
  });

  it('start-up warns once per route whose keys are global (no auth)', async () => {
    const lines: { msg: string; route?: string }[] = [];
    const logger = { info() {}, error() {}, warn: (msg: string, f?: Record<string, unknown>) => lines.push({ msg, ...(f as object) }) };
    const up = inProcessUpstream();
    const config = parseConfig({
      store: { sqlite: ':memory:' },
      routes: [
        { name: 'global', match: { path: '/a/*' }, upstream: up.url, fence: 'off' },
        { name: 'scoped', match: { path: '/b/*' }, upstream: up.url, fence: 'off', keyScope: { header: 'X-Tenant-Id' } },
        { name: 'keyless', match: { path: '/c/*' }, upstream: up.url, fence: 'off', idempotency: 'off' },
      ],
    });
    const gw = createGateway({
      config,
      store: new SqliteGatewayStore({ path: ':memory:' }),
      forwarder: createFetchForwarder({ fetch: (r) => up.fetch(r) }),
      env: {},
      logger,
    });
    await gw.close();
    // keyScope without auth warns too: its header is whatever the caller sends (interop-hostile.test.ts).
    expect(lines.filter((l) => l.msg === 'global-keys').map((l) => l.route)).toEqual(['global', 'scoped']);
  });
});

describe('echoKey', () => {
  it('the key comes back on the first answer and on the replay, in a form that reads back as the key', async () => {
    const g = gateway({ echoKey: true });
    const first = await g.command(P, { key: 'pay-7' });
    expect(first.headers.get('idempotency-key')).toBe('pay-7');
    expect((await g.command(P, { key: 'pay-7' })).headers.get('idempotency-key')).toBe('pay-7');
    expect((await g.command(P, { key: '" spaced "' })).headers.get('idempotency-key')).toBe('" spaced "');
  });

  it('off by default', async () => {
    expect((await gateway().command(P, { key: 'pay-7' })).headers.get('idempotency-key')).toBeNull();
  });
});

describe('a key header the gateway rewrites', () => {
  it('X-Request-Id is refused at start-up, naming the field', () => {
    expect(() => parseConfig({ routes: [{ name: 'r', match: { path: '/r/*' }, upstream: 'http://127.0.0.1:9', idempotencyHeader: 'X-Request-Id' }] })).toThrow(
      /routes\[0\]\.idempotencyHeader: "X-Request-Id" is a header the gateway writes itself/,
    );
  });

  it('negative control: past the check, the upstream is sent another X-Request-Id than the key it was stored under', async () => {
    const g = gateway();
    // What the start-up check refuses, set after it ran.
    g.config.routes[0]!.idempotencyHeader = 'X-Request-Id';
    const res = await g.command(P, { headers: { 'x-request-id': 'caller-key-1' } });
    expect(res.status).toBe(201);
    expect(recordRows(g.sqlite, 'caller-key-1')).toHaveLength(1);
    expect(g.upstream.calls[0]!.headers.get('x-request-id')).not.toBe('caller-key-1');
  });
});
