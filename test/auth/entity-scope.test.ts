import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { createJsonLogger } from '../../src/http/logger.js';
import { command, expectProblem, paymentsRoute, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { bearer, hsAuth, token } from './tokens.js';

// Auth on, fences unsigned: a fence is a number any caller may send. With
// the default (`fence.entityScope: "global"`) caller B's 9223372036854775807
// locks caller A's entity, and the gateway says so at start-up; with
// "caller" each caller's fences are its own. Real gateway on loopback, real
// SQLite file, recording upstream.

const GIANT = '9223372036854775807';
const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function gateway(
  fence: Record<string, unknown> | undefined,
  extra: Record<string, unknown> = {},
): Promise<{ gw: TestGateway; up: FakeUpstream; warnings: () => { msg: string; reason: string }[] }> {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const logs: string[] = [];
  const gw = await startTestGateway({
    routes: [paymentsRoute(up.url)],
    config: { auth: hsAuth(), ...(fence ? { fence } : {}), ...extra },
    logger: createJsonLogger({ write: (l) => logs.push(l) }),
  });
  cleanups.unshift(() => gw.close());
  return { gw, up, warnings: () => logs.map((l) => JSON.parse(l)).filter((l) => l.level === 'warn' && l.msg === 'unsigned-fences') };
}

const as = async (sub: string) => bearer(await token({ sub }));
const pay = (gw: TestGateway, who: Record<string, string>, fence: string, key: string, entity = 'tool-job:1') =>
  command(gw.url, '/payments/charges', { fence: fence as unknown as number, entity, key, headers: who });

describe('fence.entityScope with auth and unsigned fences', () => {
  it('"caller": caller B\'s giant fence does not lock caller A\'s entity; each caller is still fenced against itself', async () => {
    const { gw, up, warnings } = await gateway({ entityScope: 'caller' });
    const [alice, bob] = [await as('alice'), await as('bob')];

    expect((await pay(gw, bob, GIANT, 'b1')).status).toBe(201);
    const a1 = await pay(gw, alice, '1', 'a1');
    expect(a1.status).toBe(201);
    // The upstream sees the entity as sent, not the store's scoped name.
    expect(up.callsFor('a1')[0]!.headers['x-fence-entity']).toBe('tool-job:1');
    expect(up.callsFor('b1')[0]!.headers['x-fence-entity']).toBe('tool-job:1');

    // G1 per caller: A's own older fence is stale, and so is B's.
    expect((await pay(gw, alice, '5', 'a2')).status).toBe(201);
    await expectProblem(await pay(gw, alice, '4', 'a3'), 409, 'stale-fence', { entity: 'tool-job:1', presented_fence: '4', current_fence: '5' });
    await expectProblem(await pay(gw, bob, '2', 'b2'), 409, 'stale-fence', { entity: 'tool-job:1', current_fence: GIANT });
    expect(up.callsFor('a3')).toEqual([]);
    expect(up.callsFor('b2')).toEqual([]);

    // The store keeps one fence per (caller, entity): caller id, NUL, entity.
    const auditor = bearer(await token({ sub: 'auditor', scope: 'fencegate:audit' }));
    const entity = async (name: string) => (await fetch(`${gw.url}/_fencegate/v1/entities/${encodeURIComponent(name)}`, { headers: auditor })).json();
    expect(await entity('alice\u0000tool-job:1')).toMatchObject({ fence: '5' });
    expect(await entity(`bob\u0000tool-job:1`)).toMatchObject({ fence: GIANT });
    const rows = gw.sqlite.db.prepare('SELECT entity, caller FROM rejections ORDER BY id').all();
    expect(rows).toEqual([
      { entity: 'alice\u0000tool-job:1', caller: 'alice' },
      { entity: 'bob\u0000tool-job:1', caller: 'bob' },
    ]);
    expect(warnings()).toEqual([]);
  });

  it('"caller" in serial mode: a request finishing releases its own slot (the next one for the same caller goes)', async () => {
    const { gw, up } = await gateway({ entityScope: 'caller' });
    const alice = await as('alice');
    for (const key of ['s1', 's2', 's3']) expect((await pay(gw, alice, '1', key)).status).toBe(201);
    expect(up.calls.map((c) => c.key)).toEqual(['s1', 's2', 's3']);
    expect(gw.sqlite.db.prepare('SELECT count(*) AS n FROM fence_entities WHERE inflight_owner IS NOT NULL').get()).toEqual({ n: 0 });
  });

  it('negative control, the default "global": B\'s giant fence locks A\'s entity, and the start-up warning said so', async () => {
    const { gw, up, warnings } = await gateway(undefined);
    expect(warnings()).toHaveLength(1);
    expect(warnings()[0]!.reason).toMatch(/fence\.signed.*entityScope/);
    const [alice, bob] = [await as('alice'), await as('bob')];
    expect((await pay(gw, bob, GIANT, 'b1')).status).toBe(201);
    await expectProblem(await pay(gw, alice, '1', 'a1'), 409, 'stale-fence', { entity: 'tool-job:1', presented_fence: '1', current_fence: GIANT });
    expect(up.callsFor('a1')).toEqual([]);
  });

  it('no warning when fences are signed, or when no route reads a fence', async () => {
    const signed = await gateway({ signed: { secret: 's'.repeat(40) } });
    expect(signed.warnings()).toEqual([]);
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const logs: string[] = [];
    const gw = await startTestGateway({
      routes: [paymentsRoute(up.url, { fence: 'off' })],
      config: { auth: hsAuth() },
      logger: createJsonLogger({ write: (l) => logs.push(l) }),
    });
    cleanups.unshift(() => gw.close());
    expect(logs.filter((l) => l.includes('unsigned-fences'))).toEqual([]);
  });

  it('"caller" needs auth; anything but global / caller is refused', () => {
    const routes = [paymentsRoute('http://127.0.0.1:9')];
    expect(parseConfig({ routes }).fence.entityScope).toBe('global');
    expect(() => parseConfig({ routes, fence: { entityScope: 'caller' } })).toThrow(/fence\.entityScope.*needs "auth"/);
    expect(() => parseConfig({ routes, auth: hsAuth(), fence: { entityScope: 'tenant' } })).toThrow(/fence\.entityScope/);
  });
});
