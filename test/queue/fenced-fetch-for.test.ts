/**
 * `fencedFetchFor` against the real gateway (in this process, on loopback)
 * in front of a counting upstream: the lease module's fencedFetch with a
 * fence that came from a FenceSource.
 */
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { LeaseLostError } from '../../src/lease/errors.js';
import { fencedFetchFor } from '../../src/queue/fenced-fetch-for.js';
import { jobKeys } from '../../src/queue/keys.js';
import { command, paymentsRoute, rejectionRows, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

const STORE = '0123456789abcdef0123456789abcdef';
const charge = { step: 'charge', method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"amount":1200}' };

describe('fencedFetchFor through the real gateway', () => {
  let upstream: FakeUpstream;
  let gateway: TestGateway;
  beforeAll(async () => {
    upstream = await startUpstream();
    gateway = await startTestGateway({ routes: [paymentsRoute(upstream.url)] });
  });
  afterAll(async () => {
    await gateway?.close();
    await upstream?.close();
  });

  test('sends the fence, the entity and <keyPrefix>:<step>; the same step again is a replay', async () => {
    const keys = jobKeys(STORE, { queue: 'bull:payments', id: 'a1' });
    const f = fencedFetchFor({ fence: 3, ...keys });
    const first = await f(`${gateway.url}/payments/charges`, charge);
    expect(first.status).toBe(201);
    expect(upstream.calls.at(-1)).toMatchObject({ fence: '3', entity: keys.entity, key: `${keys.keyPrefix}:charge` });
    const before = upstream.effects;
    const again = await f(`${gateway.url}/payments/charges`, charge);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(upstream.effects).toBe(before);
  });

  test('a stale fence becomes LeaseLostError, aborts the attempt once, and no later call leaves', async () => {
    const keys = jobKeys(STORE, { queue: 'bull:payments', id: 'a2' });
    // A newer attempt of the same job already sent fence 5.
    expect((await command(gateway.url, '/payments/charges', { fence: 5, entity: keys.entity, key: `${keys.keyPrefix}:other` })).status).toBe(201);
    const job = new AbortController();
    const stale: LeaseLostError[] = [];
    const f = fencedFetchFor({ fence: 4, ...keys, signal: job.signal, onStale: (e) => stale.push(e) });
    const effects = upstream.effects;
    await expect(f(`${gateway.url}/payments/charges`, charge)).rejects.toBeInstanceOf(LeaseLostError);
    expect(stale).toHaveLength(1);
    expect(rejectionRows(gateway.sqlite, 'stale-fence')).toContainEqual(expect.objectContaining({ entity: keys.entity, presented_fence: 4, current_fence: 5 }));
    const refusals = rejectionRows(gateway.sqlite).length;
    await expect(f(`${gateway.url}/payments/charges`, { ...charge, step: 'refund' })).rejects.toBeInstanceOf(LeaseLostError);
    expect(rejectionRows(gateway.sqlite).length).toBe(refusals); // never reached the gateway
    expect(stale).toHaveLength(1);
    expect(upstream.effects).toBe(effects);
  });

  test('other refusals are answers, not lease loss: a reused key comes back as 422 and the attempt goes on', async () => {
    const keys = jobKeys(STORE, { queue: 'bull:payments', id: 'a3' });
    const stale: LeaseLostError[] = [];
    const f = fencedFetchFor({ fence: 1, ...keys, onStale: (e) => stale.push(e) });
    expect((await f(`${gateway.url}/payments/charges`, charge)).status).toBe(201);
    const reused = await f(`${gateway.url}/payments/charges`, { ...charge, body: '{"amount":1}' });
    expect(reused.status).toBe(422);
    expect(stale).toHaveLength(0);
    expect((await f(`${gateway.url}/payments/charges`, { ...charge, step: 'receipt' })).status).toBe(201);
  });

  test('an aborted job sends nothing', async () => {
    const keys = jobKeys(STORE, { queue: 'bull:payments', id: 'a4' });
    const job = new AbortController();
    job.abort(new Error('job cancelled'));
    const calls = upstream.calls.length;
    await expect(fencedFetchFor({ fence: 1, ...keys, signal: job.signal })(`${gateway.url}/payments/charges`, charge)).rejects.toThrow('job cancelled');
    expect(upstream.calls.length).toBe(calls);
  });

  test('bad options fail at once, with the field named', () => {
    const keys = jobKeys(STORE, { queue: 'q', id: '1' });
    expect(() => fencedFetchFor({ fence: -1, ...keys })).toThrow(/fence must be/);
    expect(() => fencedFetchFor({ fence: 1.5, ...keys })).toThrow(/fence must be/);
    expect(() => fencedFetchFor({ fence: 1, entity: '', keyPrefix: 'k' })).toThrow(/entity/);
    expect(() => fencedFetchFor({ fence: 1, entity: 'e', keyPrefix: 'k'.repeat(200) })).toThrow(/keyPrefix/);
    expect(() => fencedFetchFor({ fence: 1, ...keys, fenceSigner: () => 'x' })).toThrow(/leaseUntil/);
  });
});
