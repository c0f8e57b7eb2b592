/**
 * The credential part of the key scope (DESIGN §2 G2) on Workers, as on
 * Node (test/auth/credential-scope.test.ts): inside workerd, on the local
 * D1, through the Worker's own `fetch` to the recording upstream. Two
 * callers with different `Authorization` (or a listed `x-api-key`) and one
 * `Idempotency-Key` are two executions; the same caller gets its replay; the
 * D1 row holds the HMAC under the Worker secret, never the credential.
 */
import { createExecutionContext, waitOnExecutionContext } from 'cloudflare:test';
import { env } from 'cloudflare:workers';
import { describe, expect, inject, it } from 'vitest';
import worker, { type WorkerEnv } from '../../src/entry/worker.js';

const upstreamUrl = inject('upstreamUrl');
const HASH_KEY = 'workers-credential-hash-key-0123456789';

const gatewayEnv: WorkerEnv = {
  ...env,
  FENCEGATE_LOG_LEVEL: 'error',
  FG_CRED_KEY: HASH_KEY,
  FENCEGATE_CONFIG: JSON.stringify({
    store: { d1: 'DB' },
    credentialHashKey: { env: 'FG_CRED_KEY' },
    routes: [{ name: 'payments', match: { path: '/payments/*', methods: ['POST'] }, upstream: upstreamUrl, fence: 'off', mode: 'concurrent', timeoutMs: 1_500, credentialHeaders: ['X-Api-Key'] }],
  }),
};

let n = 0;
const uniq = () => `cred-${Date.now().toString(36)}-${++n}`;

async function charge(key: string, headers: Record<string, string>): Promise<{ effect: number; replayed: boolean }> {
  const ctx = createExecutionContext();
  const res = await worker.fetch(
    new Request('http://localhost/payments/charges', { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-fence-entity': `e-${key}`, ...headers }, body: '{"amount":1}' }),
    gatewayEnv,
    ctx,
  );
  const body = (await res.json()) as { effect: number };
  await waitOnExecutionContext(ctx);
  expect(res.status).toBe(201);
  return { effect: body.effect, replayed: res.headers.get('idempotent-replayed') === 'true' };
}

const callsFor = async (key: string) => ((await (await fetch(`${upstreamUrl}/__calls?key=${encodeURIComponent(key)}`)).json()) as unknown[]).length;

async function hmacHex(key: string, text: string): Promise<string> {
  const k = await crypto.subtle.importKey('raw', new TextEncoder().encode(key), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
  const mac = new Uint8Array(await crypto.subtle.sign('HMAC', k, new TextEncoder().encode(text)));
  return [...mac].map((b) => b.toString(16).padStart(2, '0')).join('');
}

describe('credentials scope keys on Workers', () => {
  it('two Authorization values, one key: two executions, each replayed to its own caller', async () => {
    const key = uniq();
    const a = { authorization: 'Bearer alice-token' };
    const b = { authorization: 'Bearer bob-token' };
    const a1 = await charge(key, a);
    const b1 = await charge(key, b);
    expect(b1.effect).not.toBe(a1.effect);
    expect(await charge(key, a)).toEqual({ effect: a1.effect, replayed: true });
    expect(await charge(key, b)).toEqual({ effect: b1.effect, replayed: true });
    expect(await callsFor(key)).toBe(2);
  });

  it('a listed x-api-key scopes keys; control: the same API key is a replay, not a second execution', async () => {
    const key = uniq();
    const one = await charge(key, { 'x-api-key': 'key-one' });
    const two = await charge(key, { 'x-api-key': 'key-two' });
    expect(two.effect).not.toBe(one.effect);
    expect(await charge(key, { 'x-api-key': 'key-one' })).toEqual({ effect: one.effect, replayed: true });
    expect(await callsFor(key)).toBe(2);
  });

  it('the D1 row holds the HMAC under the Worker secret, not the credential', async () => {
    const key = uniq();
    await charge(key, { authorization: 'Bearer carol-token' });
    const rows = (await env.DB.prepare('SELECT scope FROM idempotency_records WHERE key = ?').bind(key).all<{ scope: string }>()).results ?? [];
    const material = 'fencegate/key-scope/credentials/v1\u0000' + JSON.stringify([['authorization', 'Bearer carol-token'], ['x-api-key', null]]);
    expect(rows.map((r) => r.scope)).toEqual([`payments\u0000cred:${await hmacHex(HASH_KEY, material)}`]);
    expect(JSON.stringify(rows)).not.toContain('carol');
  });
});
