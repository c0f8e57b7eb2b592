import { join } from 'node:path';
import { CompactSign, exportJWK, generateKeyPair } from 'jose';
import { afterEach, describe, expect, it } from 'vitest';
import { createFenceSigner, mintFence, verifyFence } from '../../src/protocol/fence-token.js';
import { verificationKeys } from '../../src/protocol/keys.js';
import { createSqliteJobStore } from '../../src/lease/sqlite/store.js';
import { command, expectProblem, paymentsRoute, startTestGateway, tempDir, type RouteInput, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { bearer, hsAuth, token } from './tokens.js';

// Signed fences (DESIGN §7). The forged giant fence and the
// paused worker, each with its negative control.

const FENCE_SECRET = 'fence-secret-0123456789-abcdefghijklmnopq';
const GIANT = '9223372036854775807';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function upstream(): Promise<FakeUpstream> {
  const u = await startUpstream();
  cleanups.push(() => u.close());
  return u;
}

async function gateway(routes: RouteInput[], config: Record<string, unknown> = { fence: { signed: { secret: FENCE_SECRET } } }): Promise<TestGateway> {
  const gw = await startTestGateway({ routes, config });
  cleanups.unshift(() => gw.close());
  return gw;
}

const inSec = (s: number) => Math.floor(Date.now() / 1000) + s;
const fence = (ent: string, value: number | string, o: { sub?: string; exp?: number; secret?: string } = {}) =>
  mintFence({ ent, fence: value, sub: o.sub ?? 'worker-a', exp: o.exp ?? inSec(60) }, { secret: o.secret ?? FENCE_SECRET });

function rejections(gw: TestGateway): { reason: string; entity: string | null; presented_fence: string | null; detail: string | null }[] {
  return gw.sqlite.db.prepare('SELECT reason, entity, CAST(presented_fence AS TEXT) AS presented_fence, detail FROM rejections ORDER BY id').all() as any[];
}

const entityFence = (gw: TestGateway, entity: string) =>
  (gw.sqlite.db.prepare('SELECT CAST(fence AS TEXT) AS fence FROM fence_entities WHERE entity = ?').get(entity) as { fence: string } | undefined)?.fence ??
  null;

describe('signed fences: a forged fence cannot lock an entity', () => {
  it('a bare giant integer is 401 invalid-fence-signature, logged, and the real owner still gets through', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    const e = 'tool-job:42';
    const forged = await command(gw.url, '/payments/charges', { fence: GIANT, entity: e, key: 'evil-1' });
    const body = await expectProblem(forged, 401, 'invalid-fence-signature', { entity: e, presented_fence: GIANT });
    expect(body.detail).toMatch(/bare integer/);
    // A JWS with the giant fence, signed with a key the gateway does not hold.
    const otherKey = await fence(e, GIANT, { secret: 'not-the-gateway-secret-0123456789-abcdefg' });
    await expectProblem(await command(gw.url, '/payments/charges', { fence: otherKey, entity: e, key: 'evil-2' }), 401, 'invalid-fence-signature', {
      presented_fence: GIANT,
    });
    // The same claims with alg none.
    const none = `${Buffer.from('{"alg":"none","typ":"fence+jwt"}').toString('base64url')}.${otherKey.split('.')[1]}.`;
    await expectProblem(await command(gw.url, '/payments/charges', { fence: none, entity: e, key: 'evil-3' }), 401, 'invalid-fence-signature');
    expect(up.effects).toBe(0);
    expect(entityFence(gw, e)).toBeNull();

    // The genuine owner, with a small fence: accepted, and the upstream sees the integer.
    const genuine = await fence(e, 5);
    const ok = await command(gw.url, '/payments/charges', { fence: genuine, entity: e, key: 'real-1' });
    expect(ok.status).toBe(201);
    expect(up.calls[0]!.fence).toBe('5');
    expect(entityFence(gw, e)).toBe('5');

    const log = rejections(gw);
    expect(log.map((r) => [r.reason, r.entity, r.presented_fence])).toEqual([
      ['invalid-fence-signature', e, GIANT],
      ['invalid-fence-signature', e, GIANT],
      ['invalid-fence-signature', e, GIANT],
    ]);
    expect(log[1]!.detail).toMatch(/^signature verification failed; jws sha256 [0-9a-f]{16}$/);
    // The JWS is a credential: never stored.
    const dump = JSON.stringify(gw.sqlite.db.prepare('SELECT * FROM rejections').all());
    expect(dump).not.toContain(otherKey.split('.')[2]);
  });

  it('negative control: without fence.signed the giant fence DOES lock the entity', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], {});
    const e = 'tool-job:42';
    expect((await command(gw.url, '/payments/charges', { fence: GIANT, entity: e, key: 'evil-1' })).status).toBe(201);
    await expectProblem(await command(gw.url, '/payments/charges', { fence: 5, entity: e, key: 'real-1' }), 409, 'stale-fence', { current_fence: GIANT });
    expect(entityFence(gw, e)).toBe(GIANT);
  });

  it('a fence signed for another entity is 401, even when it has expired too', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);
    const forB = await fence('tool-job:B', 9);
    const body = await expectProblem(
      await command(gw.url, '/payments/charges', { fence: forB, entity: 'tool-job:A', key: 'x' }),
      401,
      'invalid-fence-signature',
    );
    expect(body.detail).toMatch(/another entity/);
    const expiredForB = await fence('tool-job:B', 9, { exp: inSec(-30) });
    await expectProblem(await command(gw.url, '/payments/charges', { fence: expiredForB, entity: 'tool-job:A', key: 'y' }), 401, 'invalid-fence-signature');
    expect(up.effects).toBe(0);
  });

  it('the entity from a JSON body is matched against ent too', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url, { entity: { json: '/invoice' } })]);
    const f = await fence('inv-7', 3);
    const ok = await command(gw.url, '/payments/charges', { fence: f, key: 'a', body: '{"invoice":"inv-7"}' });
    expect(ok.status).toBe(201);
    await expectProblem(await command(gw.url, '/payments/charges', { fence: f, key: 'b', body: '{"invoice":"inv-8"}' }), 401, 'invalid-fence-signature');
    // A signed fence without any entity: 400 missing-entity, as for an integer.
    await expectProblem(await command(gw.url, '/payments/charges', { fence: f, key: 'c', body: '{}' }), 400, 'missing-entity');
  });

  it('EdDSA-signed fences verify with a public JWKS; the HS256 secret of auth is not a fence key', async () => {
    const ed = await generateKeyPair('EdDSA', { extractable: true });
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], {
      auth: hsAuth(),
      fence: { signed: { jwks: { keys: [{ ...(await exportJWK(ed.publicKey)), alg: 'EdDSA' }] } } },
    });
    const t = await token({ sub: 'billing' });
    const signed = await mintFence({ ent: 'job:1', fence: 4, sub: 'w', exp: inSec(60) }, { privateKey: ed.privateKey, alg: 'EdDSA' });
    expect((await command(gw.url, '/payments/charges', { fence: signed, entity: 'job:1', key: 'a', headers: bearer(t) })).status).toBe(201);
    const hs = await fence('job:1', 9, { secret: 'test-secret-0123456789-abcdefghijklmnop' });
    await expectProblem(
      await command(gw.url, '/payments/charges', { fence: hs, entity: 'job:1', key: 'b', headers: bearer(t) }),
      401,
      'invalid-fence-signature',
    );
  });

  it('a signed fence is not a bearer token, and a bearer token is not a fence (typ)', async () => {
    const up = await upstream();
    // One HS256 secret for both, the worst case.
    const shared = 'test-secret-0123456789-abcdefghijklmnop';
    const gw = await gateway([paymentsRoute(up.url)], { auth: hsAuth(), fence: { signed: { secret: shared } } });
    const f = await fence('job:1', 1, { secret: shared });
    await expectProblem(await command(gw.url, '/payments/charges', { fence: f, entity: 'job:1', key: 'a', headers: bearer(f) }), 401, 'unauthorized');
    const t = await token({ sub: 'billing' });
    await expectProblem(
      await command(gw.url, '/payments/charges', { fence: t, entity: 'job:1', key: 'b', headers: bearer(t) }),
      401,
      'invalid-fence-signature',
    );
    expect(up.effects).toBe(0);
  });
});

describe('signed fences: a worker paused past its lease', () => {
  it('is refused 409 fence-expired before any newer owner shows up, and logged', async () => {
    const tmp = tempDir();
    cleanups.push(() => tmp.cleanup());
    // The signed exp is the lease end rounded down to the second, so the
    // first charge has leaseMs − 1 s at worst to land before it: 5 s, room
    // for a stalled disk or CPU. The wait past it below is the test's point.
    const jobs = createSqliteJobStore({ path: join(tmp.dir, 'jobs.db'), leaseMs: 6_000 });
    cleanups.push(() => jobs.close());
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)]);

    const { job } = (await jobs.enqueue({ kind: 'pay', idempotencyKey: 'order-1', payload: { amount: 1200 } })) as { job: { fenceKey: string } };
    const { lease } = await jobs.claim({ workerId: 'worker-a' });
    expect(lease).not.toBeNull();
    // The lease module's seam: exp = the lease end (database time), the signer adds its grace (none here).
    const sign = createFenceSigner({ secret: FENCE_SECRET }, { graceSeconds: 0 });
    const jws = await sign({ ent: lease!.fenceKey, fence: lease!.fencingToken, sub: lease!.ownerId, exp: Math.floor(lease!.leaseUntil.getTime() / 1000) });
    expect(lease!.fenceKey).toBe(job.fenceKey);

    const first = await command(gw.url, '/payments/charges', { fence: jws, entity: lease!.fenceKey, key: 'order-1:pay' });
    expect(first.status).toBe(201);

    // The worker freezes past its lease (and the signed exp)…
    const expMs = Math.floor(lease!.leaseUntil.getTime() / 1000) * 1000;
    await new Promise((r) => setTimeout(r, Math.max(0, expMs - Date.now()) + 100));
    // …then wakes up and sends its next step. Nobody has claimed the job since.
    expect((await jobs.get(lease!.id))!.fencingToken).toBe(lease!.fencingToken);
    const late = await command(gw.url, '/payments/charges', { fence: jws, entity: lease!.fenceKey, key: 'order-1:refund' });
    await expectProblem(late, 409, 'fence-expired', { entity: lease!.fenceKey, presented_fence: String(lease!.fencingToken) });
    expect(up.effects).toBe(1);
    expect(rejections(gw).map((r) => [r.reason, r.presented_fence])).toEqual([['fence-expired', String(lease!.fencingToken)]]);
    expect(rejections(gw)[0]!.detail).toMatch(/^fence expired \d+s ago \(holder worker-a\); jws sha256 [0-9a-f]{16}$/);
  });

  it('negative control: without fence.signed the same late request is forwarded (no newer owner yet)', async () => {
    const up = await upstream();
    const gw = await gateway([paymentsRoute(up.url)], {});
    expect((await command(gw.url, '/payments/charges', { fence: 1, entity: 'tool-job:1', key: 'order-1:pay' })).status).toBe(201);
    expect((await command(gw.url, '/payments/charges', { fence: 1, entity: 'tool-job:1', key: 'order-1:refund' })).status).toBe(201);
    expect(up.effects).toBe(2);
  });
});

describe('verifyFence (unit)', () => {
  const keys = verificationKeys({ secret: FENCE_SECRET }, {}, 'fence.signed');

  it('checks signature, typ, ent and exp in that order, on the given clock', async () => {
    const now = Date.now();
    const jws = await mintFence({ ent: 'e', fence: 7n, sub: 'w', exp: Math.floor(now / 1000) + 10 }, { secret: FENCE_SECRET });
    expect(await verifyFence(jws, keys, { entity: 'e', now })).toMatchObject({ ok: true, fence: { ent: 'e', fence: 7n, sub: 'w' } });
    expect(await verifyFence(jws, keys, { entity: 'e', now: now + 11_000 })).toMatchObject({ ok: false, code: 'fence-expired', presented: 7n });
    expect(await verifyFence(jws, keys, { entity: 'e', now: now + 11_000, clockToleranceSec: 5 })).toMatchObject({ ok: true });
    expect(await verifyFence(jws, keys, { entity: 'other', now: now + 11_000 })).toMatchObject({
      ok: false,
      code: 'invalid-fence-signature',
      why: 'wrong-entity',
    });
    // Not typed as a fence.
    const untyped = await new CompactSign(new TextEncoder().encode(JSON.stringify({ ent: 'e', fence: '7', exp: Math.floor(now / 1000) + 10 })))
      .setProtectedHeader({ alg: 'HS256' })
      .sign(new TextEncoder().encode(FENCE_SECRET));
    expect(await verifyFence(untyped, keys, { entity: 'e', now })).toMatchObject({ ok: false, code: 'invalid-fence-signature' });
    // A fence over 2^63-1 cannot be minted.
    await expect(mintFence({ ent: 'e', fence: 9223372036854775808n, sub: 'w', exp: 1 }, { secret: FENCE_SECRET })).rejects.toThrow(RangeError);
  });
});
