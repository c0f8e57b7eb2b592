import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { command, expectProblem, paymentsRoute, recordRows, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// An upstream answer over the route's maxResponseBytes (DESIGN §3.7): the
// upstream answered, so it acted, but the gateway neither holds nor stores
// more than the limit. The key is finished with a stored refusal (502
// upstream-response-too-large) that the caller and every retry get, so the
// request is never forwarded a second time. Real gateway (SQLite file, undici
// forwarder) in front of a real loopback upstream.

const HUGE = 5 * 1024 * 1024;
const MAX = 100 * 1024 * 1024;

let up: FakeUpstream | null = null;
let gw: TestGateway | null = null;
afterEach(async () => {
  await gw?.close();
  await up?.close();
  gw = up = null;
});

/** Bytes of the stored answer body of `key`, straight from the table; null without a stored answer. */
function storedBytes(g: TestGateway, key: string): number | null {
  const row = g.sqlite.db.prepare('SELECT length(body) AS n FROM idempotency_records WHERE key = ?').get(key) as { n: number | null } | undefined;
  return row?.n ?? null;
}

async function start(route: Record<string, unknown>, answer: { status: number; bytes: number }) {
  up = await startUpstream();
  up.behave(() => ({
    kind: 'respond',
    status: answer.status,
    headers: { 'content-type': 'application/octet-stream' },
    body: Buffer.alloc(answer.bytes, 0x61),
  }));
  gw = await startTestGateway({ routes: [paymentsRoute(up.url, route)] });
  return { up, gw };
}

describe('maxResponseBytes', () => {
  it('an answer over the default limit: 502 upstream-response-too-large, stored small; the retry gets the same refusal as a replay and the upstream sees one request', async () => {
    const { up, gw } = await start({}, { status: 201, bytes: HUGE });
    const first = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'huge-1' });
    const firstText = await first.clone().text();
    const problem = await expectProblem(first, 502, 'upstream-response-too-large', { upstream_status: 201, max_response_bytes: 1_048_576 });
    expect(problem.detail).toMatch(/acted/);
    expect(first.headers.get('idempotent-replayed')).toBeNull();

    const retry = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'huge-1' });
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(retry.status).toBe(502);
    expect(retry.headers.get('content-type')).toBe('application/problem+json');
    expect(await retry.text()).toBe(firstText);

    expect(up.callsFor('huge-1')).toHaveLength(1);
    expect(recordRows(gw.sqlite, 'huge-1')).toMatchObject([{ state: 'completed', status: 502 }]);
    // The refusal is what was stored, not the answer.
    expect(storedBytes(gw, 'huge-1')).toBeLessThan(2_048);
  });

  it('negative control: with the limit at its maximum the same answer is passed through and stored whole', async () => {
    const { up, gw } = await start({ maxResponseBytes: MAX }, { status: 201, bytes: HUGE });
    const res = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'huge-1' });
    expect(res.status).toBe(201);
    expect((await res.arrayBuffer()).byteLength).toBe(HUGE);
    expect(up.callsFor('huge-1')).toHaveLength(1);
    // What the first test's size check guards against.
    expect(storedBytes(gw, 'huge-1')).toBe(HUGE);
  });

  it('exactly at the limit the answer is passed through and stored', async () => {
    const { gw } = await start({ maxResponseBytes: 4_096 }, { status: 201, bytes: 4_096 });
    const res = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'at-limit' });
    expect(res.status).toBe(201);
    expect((await res.arrayBuffer()).byteLength).toBe(4_096);
    expect(storedBytes(gw, 'at-limit')).toBe(4_096);
  });

  it('a "not processed" status (releaseStatuses) over the limit: 502 as well, but the key is released and a retry is forwarded', async () => {
    const { up, gw } = await start({ maxResponseBytes: 4_096 }, { status: 503, bytes: 64 * 1024 });
    const first = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'busy-1' });
    const problem = await expectProblem(first, 502, 'upstream-response-too-large', { upstream_status: 503, max_response_bytes: 4_096 });
    expect(problem.detail).toMatch(/released/);
    expect(recordRows(gw.sqlite, 'busy-1')).toEqual([]);
    const retry = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'busy-1' });
    expect(retry.status).toBe(502);
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    expect(up.callsFor('busy-1')).toHaveLength(2);
  });

  it('in the Stripe error shape the stored refusal says "do not retry", and the replay says the same', async () => {
    const { up, gw } = await start({ maxResponseBytes: 4_096, errors: 'stripe' }, { status: 200, bytes: 64 * 1024 });
    for (const replayed of [null, 'true']) {
      const res = await command(gw.url, '/payments/charges', { fence: 1, entity: 'e', key: 'stripe-1' });
      expect(res.status).toBe(502);
      expect(res.headers.get('idempotent-replayed')).toBe(replayed);
      expect(res.headers.get('stripe-should-retry')).toBe('false');
      expect(((await res.json()) as { error: { code: string; upstream_status: number } }).error).toMatchObject({
        code: 'upstream_response_too_large',
        upstream_status: 200,
      });
    }
    expect(up.callsFor('stripe-1')).toHaveLength(1);
  });

  it('the configuration: 1 MiB by default, at most 100 MiB', () => {
    const routes = (extra: Record<string, unknown>) => [paymentsRoute('http://127.0.0.1:9', extra)];
    expect(parseConfig({ routes: routes({}) }).routes[0]!.maxResponseBytes).toBe(1_048_576);
    expect(parseConfig({ routes: routes({ maxResponseBytes: MAX }) }).routes[0]!.maxResponseBytes).toBe(MAX);
    expect(() => parseConfig({ routes: routes({ maxResponseBytes: MAX + 1 }) })).toThrow(/routes\[0\]\.maxResponseBytes/);
  });
});
