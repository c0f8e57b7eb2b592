import { request } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { hsAuth, token } from '../auth/tokens.js';
import { startTestGateway } from '../helpers/gateway.js';
import { startUpstream } from '../helpers/upstream.js';

// A HEAD answer has no body, and its Content-Length is the length a GET
// would have (RFC 9110 §9.3.2). Over real sockets, on both ways in: the Node
// listener's direct path (no auth) and the Hono app (caller auth on).

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function head(
  url: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; bytes: number }> {
  return new Promise((resolve, reject) => {
    const r = request(url, { method: 'HEAD', headers }, (res) => {
      let bytes = 0;
      res.on('data', (c: Buffer) => (bytes += c.length));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, bytes }));
    });
    r.on('error', reject);
    r.end();
  });
}

async function setup(auth: boolean, route: Record<string, unknown> = {}) {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  up.behave(() => ({ kind: 'respond', status: 200, headers: { 'content-length': '1234', 'content-type': 'application/pdf' } }));
  const gw = await startTestGateway({
    routes: [{ name: 'files', match: { path: '/files/*', methods: ['GET', 'HEAD'] }, upstream: up.url, fence: 'off', idempotency: 'off', ...route }],
    ...(auth ? { config: { auth: hsAuth() } } : {}),
  });
  cleanups.push(() => gw.close());
  const headers: Record<string, string> = auth ? { authorization: `Bearer ${await token()}` } : {};
  return { up, gw, headers };
}

describe('HEAD answers keep the upstream Content-Length', () => {
  for (const auth of [false, true]) {
    it(`${auth ? 'through the Hono app (auth on)' : 'through the Node listener (no auth)'}`, async () => {
      const { up, gw, headers } = await setup(auth);
      const res = await head(`${gw.url}/files/report.pdf`, headers);
      expect(res.status).toBe(200);
      expect(res.headers['content-length']).toBe('1234');
      expect(res.headers['content-type']).toBe('application/pdf');
      expect(res.bytes).toBe(0);
      expect(up.calls[0]!.method).toBe('HEAD');
    });
  }

  it('a HEAD with a key: the replay has the length too', async () => {
    const { up, gw } = await setup(false, { idempotency: 'optional' });
    const first = await head(`${gw.url}/files/report.pdf`, { 'idempotency-key': 'h-1' });
    const again = await head(`${gw.url}/files/report.pdf`, { 'idempotency-key': 'h-1' });
    expect(first.headers['content-length']).toBe('1234');
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.headers['content-length']).toBe('1234');
    expect(up.effects).toBe(1);
  });

  it('a GET is framed by the gateway as before (its own length, from the bytes it writes)', async () => {
    const { up, gw } = await setup(false);
    up.behave(() => ({ kind: 'respond', status: 200, headers: { 'content-type': 'text/plain' }, body: 'hello' }));
    const res = await fetch(`${gw.url}/files/a.txt`);
    expect(res.headers.get('content-length')).toBe('5');
    expect(await res.text()).toBe('hello');
  });
});
