import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { command, paymentsRoute, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// The first admin API (issue 2 §5), read by the other gateway tests as the
// operator would; here its own contract.

let up: FakeUpstream;
let gw: TestGateway;

beforeAll(async () => {
  up = await startUpstream();
  gw = await startTestGateway({ routes: [paymentsRoute(up.url)] });
  expect((await command(gw.url, '/payments/charges', { fence: 10, entity: 'job-a', key: 'paid', body: '{"secret":"card-4242"}' })).status).toBe(201);
  for (let f = 1; f <= 5; f++) expect((await command(gw.url, '/payments/charges', { fence: f, entity: 'job-a', key: `stale-${f}` })).status).toBe(409);
  expect((await command(gw.url, '/payments/charges', { fence: 10, entity: 'job-a', key: 'paid', body: '{"other":1}' })).status).toBe(422);
});

afterAll(async () => {
  await up?.close();
  await gw?.close();
});

describe('admin API', () => {
  it('GET /health', async () => {
    expect(await gw.admin('/health')).toEqual({ status: 200, body: { status: 'ok' } });
  });

  it('GET /v1/rejections: newest first, filters, keyset pagination, ISO times, no bodies', async () => {
    const all = await gw.admin('/v1/rejections');
    expect(all.body.items.map((r: any) => r.reason)).toEqual(['idempotency-key-reused', ...Array(5).fill('stale-fence')]);
    expect(all.body.next_cursor).toBeNull();
    const item = all.body.items[1];
    for (const field of ['id', 'at', 'reason', 'entity', 'presented_fence', 'current_fence', 'idempotency_key', 'method', 'path', 'payload_sha256', 'request_id']) {
      expect(item, field).toHaveProperty(field);
    }
    expect(new Date(item.at).toISOString()).toBe(item.at);
    expect(JSON.stringify(all.body)).not.toContain('card-4242');

    const pages: string[][] = [];
    let cursor: string | null = null;
    do {
      const page: any = await gw.admin(`/v1/rejections?reason=stale-fence&limit=2${cursor ? `&cursor=${cursor}` : ''}`);
      pages.push(page.body.items.map((r: any) => r.presented_fence));
      cursor = page.body.next_cursor;
    } while (cursor !== null);
    expect(pages).toEqual([['5', '4'], ['3', '2'], ['1']]);

    expect((await gw.admin('/v1/rejections?entity=nobody')).body.items).toEqual([]);
    expect((await gw.admin('/v1/rejections?since=1h')).body.items).toHaveLength(6);
    expect((await gw.admin(`/v1/rejections?until=${encodeURIComponent('2000-01-01T00:00:00Z')}`)).body.items).toHaveLength(0);
  });

  it('GET /v1/rejections with a bad parameter is a 400 naming it', async () => {
    for (const [q, name] of [['limit=0', 'limit'], ['limit=abc', 'limit'], ['since=yesterday', 'since'], ['cursor=x', 'cursor']]) {
      const res = await gw.admin(`/v1/rejections?${q}`);
      expect(res.status).toBe(400);
      expect(res.body.detail).toMatch(new RegExp(`^${name}`));
    }
  });

  it('GET /v1/entities/:entity, 404 when unknown', async () => {
    const e = await gw.admin('/v1/entities/job-a');
    expect(e.body).toMatchObject({ entity: 'job-a', fence: '10', inflight: null });
    expect(new Date(e.body.accepted_at).toISOString()).toBe(e.body.accepted_at);
    const missing = await gw.admin('/v1/entities/nobody');
    expect(missing.status).toBe(404);
    expect(missing.body.type).toMatch(/\/not-found$/);
  });

  it('GET /v1/idempotency/:key: state and metadata, never the stored body', async () => {
    const r = await gw.admin('/v1/idempotency/paid');
    expect(r.body.records).toMatchObject([{ scope: 'payments', state: 'completed', entity: 'job-a', fence: '10', status: 201 }]);
    expect(JSON.stringify(r.body)).not.toContain('effect');
    expect((await gw.admin('/v1/idempotency/never')).status).toBe(404);
  });
});
