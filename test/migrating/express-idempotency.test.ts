import express from 'express';
import { getSharedIdempotencyService, idempotency } from 'express-idempotency';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { InProcessGateway } from '../helpers/in-process.js';
import { peerGateway, send } from './peer.js';

// examples/migrating/express-idempotency.json against the real
// express-idempotency 1.0.6 (a devDependency): one script of requests is
// played against an Express app with the middleware and against fencegate
// in front of a plain upstream, and what a client observes is compared.
// Where the two differ on purpose (417 vs 422) the test says so.

let peer: Server;
let peerUrl: string;
let peerEffects = 0;
let g: InProcessGateway;

beforeAll(async () => {
  const app = express();
  app.use(express.json());
  app.post('*', idempotency());
  app.post('*', (req, res) => {
    if (getSharedIdempotencyService().isHit(req)) return;
    const effect = ++peerEffects;
    res.setHeader('x-extra', 'first-only');
    if (req.body?.fail === true) return void res.status(500).json({ effect, failed: true });
    res.status(201).json({ effect });
  });
  peer = await new Promise<Server>((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  peerUrl = `http://127.0.0.1:${(peer.address() as AddressInfo).port}`;

  g = peerGateway('express-idempotency').g;
  g.upstream.behave((call) => {
    const failed = call.body.includes('"fail":true');
    return {
      kind: 'respond',
      status: failed ? 500 : 201,
      headers: { 'content-type': 'application/json; charset=utf-8', 'x-extra': 'first-only' },
      body: JSON.stringify({ effect: call.seq, ...(failed ? { failed: true } : {}) }),
    };
  });
});
afterAll(async () => {
  await new Promise((r) => peer.close(r));
  await g.close();
});

interface Seen {
  status: number;
  body: string;
  echoed: string | null;
  extra: string | null;
}
const viaPeer = async (key: string | undefined, body: string): Promise<Seen> => {
  const res = await fetch(`${peerUrl}/charges`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}) },
    body,
  });
  return { status: res.status, body: await res.text(), echoed: res.headers.get('idempotency-key'), extra: res.headers.get('x-extra') };
};
const viaGateway = async (key: string | undefined, body: string): Promise<Seen> => {
  const res = await send(g, '/charges', { ...(key ? { key } : {}), body });
  return { status: res.status, body: await res.text(), echoed: res.headers.get('idempotency-key'), extra: res.headers.get('x-extra') };
};
const both = async (key: string | undefined, body: string) => ({ peer: await viaPeer(key, body), fg: await viaGateway(key, body) });

describe('express-idempotency and fencegate, request for request', () => {
  it('first request and its retry: the same answer, one effect, the key echoed', async () => {
    const a = await both('k1', '{"amount":5}');
    const b = await both('k1', '{"amount":5}');
    for (const side of ['peer', 'fg'] as const) {
      expect(a[side].status).toBe(201);
      expect(b[side].status).toBe(201);
      expect(b[side].body).toBe(a[side].body);
      expect(a[side].echoed).toBe('k1');
      expect(b[side].echoed).toBe('k1');
      // Only content-type is kept for the replay.
      expect(a[side].extra).toBe('first-only');
      expect(b[side].extra).toBeNull();
    }
  });

  it('the same JSON with members reordered is the same command (deep-equal / canonical JSON)', async () => {
    const first = await both('k2', '{"amount":5,"currency":"eur"}');
    const r = await both('k2', '{ "currency": "eur", "amount": 5 }');
    expect(r.peer.body).toBe(first.peer.body);
    expect(r.fg.body).toBe(first.fg.body);
  });

  it('another body under the key is refused by both, with no effect: 417 there, 422 here', async () => {
    const before = { peer: peerEffects, fg: g.upstream.effects };
    await both('k3', '{"amount":5}');
    const r = await both('k3', '{"amount":6}');
    expect(r.peer.status).toBe(417);
    expect(r.fg.status).toBe(422);
    expect(peerEffects - before.peer).toBe(1);
    expect(g.upstream.effects - before.fg).toBe(1);
  });

  it('a 500 is not kept: the retry runs again on both', async () => {
    const before = { peer: peerEffects, fg: g.upstream.effects };
    const a = await both('k4', '{"fail":true}');
    const b = await both('k4', '{"fail":true}');
    expect([a.peer.status, b.peer.status, a.fg.status, b.fg.status]).toEqual([500, 500, 500, 500]);
    expect(peerEffects - before.peer).toBe(2);
    expect(g.upstream.effects - before.fg).toBe(2);
  });

  it('no key: every request runs, on both', async () => {
    const before = { peer: peerEffects, fg: g.upstream.effects };
    await both(undefined, '{"amount":5}');
    await both(undefined, '{"amount":5}');
    expect(peerEffects - before.peer).toBe(2);
    expect(g.upstream.effects - before.fg).toBe(2);
  });
});
