/**
 * The credential binding of a key's record (DESIGN §2 G2) on Workers, as on
 * Node (test/auth/credential-scope.db.test.ts): inside workerd, on the local
 * D1, through the Worker's own `fetch` to the recording upstream. Default
 * (`credentialBinding: "fingerprint"`): two callers with different
 * `Authorization` (or a listed `x-api-key`) and one `Idempotency-Key` are one
 * execution, the second caller and a refreshed token get 422, the first
 * caller gets its replay; the D1 row holds a digest over the HMAC under the
 * Worker secret, never the credential. `"scope"` (the `/scoped/*` route):
 * two executions, each replayed, and the rotation hazard (a refreshed token
 * runs again). The control: a header the route does not list binds nothing,
 * so the second caller is handed the first one's answer, which is what the
 * binding refuses.
 */
import { createExecutionContext, waitOnExecutionContext } from 'cloudflare:test';
import { env } from 'cloudflare:workers';
import { describe, expect, inject, it } from 'vitest';
import worker, { type WorkerEnv } from '../../src/entry/worker.js';

const upstreamUrl = inject('upstreamUrl');
const HASH_KEY = 'workers-credential-hash-key-0123456789';
const route = { match: { methods: ['POST'] }, upstream: upstreamUrl, fence: 'off', mode: 'concurrent', timeoutMs: 1_500, credentialHeaders: ['X-Api-Key'] };

const gatewayEnv: WorkerEnv = {
  ...env,
  FENCEGATE_LOG_LEVEL: 'error',
  FG_CRED_KEY: HASH_KEY,
  FENCEGATE_CONFIG: JSON.stringify({
    store: { d1: 'DB' },
    credentialHashKey: { env: 'FG_CRED_KEY' },
    routes: [
      { ...route, name: 'payments', match: { ...route.match, path: '/payments/*' } },
      { ...route, name: 'scoped', match: { ...route.match, path: '/scoped/*' }, credentialBinding: 'scope' },
    ],
  }),
};

let n = 0;
const uniq = () => `cred-${Date.now().toString(36)}-${++n}`;
const BODY = '{"amount":1}';

interface Answer {
  status: number;
  effect?: number;
  type?: string;
  replayed: boolean;
  text: string;
}

async function send(path: string, key: string, headers: Record<string, string>): Promise<Answer> {
  const ctx = createExecutionContext();
  const res = await worker.fetch(
    new Request(`http://localhost${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-fence-entity': `e-${key}`, ...headers },
      body: BODY,
    }),
    gatewayEnv,
    ctx,
  );
  const text = await res.text();
  await waitOnExecutionContext(ctx);
  const body = JSON.parse(text) as { effect?: number; type?: string };
  return { status: res.status, effect: body.effect, type: body.type, replayed: res.headers.get('idempotent-replayed') === 'true', text };
}

/** A first answer or a replay of the upstream's 201. */
async function charge(key: string, headers: Record<string, string>, path = '/payments/charges'): Promise<{ effect: number; replayed: boolean }> {
  const a = await send(path, key, headers);
  expect(a.status, a.text).toBe(201);
  return { effect: a.effect!, replayed: a.replayed };
}

/** 422 idempotency-key-reused, carrying nothing of the record's answer. */
async function reused(key: string, headers: Record<string, string>, path = '/payments/charges'): Promise<void> {
  const a = await send(path, key, headers);
  expect(a.status, a.text).toBe(422);
  expect(a.type).toMatch(/\/idempotency-key-reused$/);
  expect(a.text).not.toMatch(/effect/);
  expect(a.replayed).toBe(false);
}

const callsFor = async (key: string) => ((await (await fetch(`${upstreamUrl}/__calls?key=${encodeURIComponent(key)}`)).json()) as unknown[]).length;

const hex = (bytes: ArrayBuffer) => [...new Uint8Array(bytes)].map((b) => b.toString(16).padStart(2, '0')).join('');
async function hmacHex(key: string, text: string): Promise<string> {
  const k = await crypto.subtle.importKey('raw', new TextEncoder().encode(key), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
  return hex(await crypto.subtle.sign('HMAC', k, new TextEncoder().encode(text)));
}
const sha256Hex = async (text: string) => hex(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(text)));

const a = { authorization: 'Bearer alice-token' };
const b = { authorization: 'Bearer bob-token' };

describe('credentials bind records on Workers (default: in the fingerprint)', () => {
  it('two Authorization values, one key: one execution, the second caller and a refreshed token get 422, the first caller its replay', async () => {
    const key = uniq();
    const a1 = await charge(key, a);
    await reused(key, b);
    await reused(key, { authorization: 'Bearer alice-token-refreshed' });
    await reused(key, {});
    expect(await charge(key, a)).toEqual({ effect: a1.effect, replayed: true });
    expect(await callsFor(key)).toBe(1);
  });

  it("a listed x-api-key binds the record; control: an unlisted header does not, so the second caller is handed the first one's answer", async () => {
    const key = uniq();
    const one = await charge(key, { 'x-api-key': 'key-one' });
    await reused(key, { 'x-api-key': 'key-two' });
    expect(await charge(key, { 'x-api-key': 'key-one' })).toEqual({ effect: one.effect, replayed: true });
    const other = uniq();
    const first = await charge(other, { 'x-other-key': 'key-one' });
    expect(await charge(other, { 'x-other-key': 'key-two' })).toEqual({ effect: first.effect, replayed: true });
    expect(await callsFor(key)).toBe(1);
    expect(await callsFor(other)).toBe(1);
  });

  it('the D1 row holds a digest over the HMAC under the Worker secret, in the route scope, not the credential', async () => {
    const key = uniq();
    await charge(key, { authorization: 'Bearer carol-token' });
    const rows =
      (await env.DB.prepare('SELECT scope, fingerprint FROM idempotency_records WHERE key = ?').bind(key).all<{ scope: string; fingerprint: string }>())
        .results ?? [];
    const material =
      'fencegate/key-scope/credentials/v1\u0000' +
      JSON.stringify([
        ['authorization', 'Bearer carol-token'],
        ['x-api-key', null],
      ]);
    const fields = `POST\u0000/payments/charges\u0000application/json\u0000${await sha256Hex(BODY)}\u0000e-${key}`;
    expect(rows).toEqual([{ scope: 'payments', fingerprint: await sha256Hex(`${fields}\u0000cred:${await hmacHex(HASH_KEY, material)}`) }]);
    expect(JSON.stringify(rows)).not.toContain('carol');
  });
});

describe('credentialBinding "scope" on Workers', () => {
  it('two Authorization values, one key: two executions, each replayed to its own caller; the D1 row holds the HMAC', async () => {
    const key = uniq();
    const a1 = await charge(key, a, '/scoped/charges');
    const b1 = await charge(key, b, '/scoped/charges');
    expect(b1.effect).not.toBe(a1.effect);
    expect(await charge(key, a, '/scoped/charges')).toEqual({ effect: a1.effect, replayed: true });
    expect(await charge(key, b, '/scoped/charges')).toEqual({ effect: b1.effect, replayed: true });
    expect(await callsFor(key)).toBe(2);
    const rows = (await env.DB.prepare('SELECT scope FROM idempotency_records WHERE key = ?').bind(key).all<{ scope: string }>()).results ?? [];
    const material =
      'fencegate/key-scope/credentials/v1\u0000' +
      JSON.stringify([
        ['authorization', a.authorization],
        ['x-api-key', null],
      ]);
    expect(rows.map((r) => r.scope)).toContain(`scoped\u0000cred:${await hmacHex(HASH_KEY, material)}`);
    expect(JSON.stringify(rows)).not.toContain('alice');
  });

  it('the rotation hazard, as documented: a retry with a refreshed token is executed again', async () => {
    const key = uniq();
    const a1 = await charge(key, a, '/scoped/charges');
    const again = await charge(key, { authorization: 'Bearer alice-token-refreshed' }, '/scoped/charges');
    expect(again.replayed).toBe(false);
    expect(again.effect).not.toBe(a1.effect);
    expect(await callsFor(key)).toBe(2);
  });
});
