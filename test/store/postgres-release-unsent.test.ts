import { randomUUID } from 'node:crypto';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createPostgresStore, type PostgresGatewayStore } from '../../src/store/postgres/index.js';
import type { Admission, AdmitInput } from '../../src/store/types.js';
import { createTestSchema, POSTGRES_URL, rejectionReasons, type TestSchema } from '../helpers/postgres.js';
import { admitInput } from './helpers/inputs.js';

/**
 * An admission whose answer was lost (DESIGN §8.2): the statement committed,
 * then the connection died before its answer reached the gateway, which
 * answers 503 and sends nothing. Whatever it committed under the request's
 * owner token is released, so the key's retry is forwarded, not told
 * `idempotency-in-progress` and later `outcome-unknown`. The connection is
 * cut by a TCP proxy in front of the real server, at the first bytes of the
 * answer (PostgreSQL sends a statement's answer once it committed).
 */

/** A TCP proxy to PostgreSQL that, once armed, ends a connection at its next bytes in the given direction. */
class CuttingProxy {
  private server!: Server;
  private readonly sockets = new Set<Socket>();
  private armed: 'answer' | 'request' | null = null;
  /** New connections are closed at once until this time (the database away). */
  private refuseUntil = 0;
  port = 0;

  async start(target: URL): Promise<void> {
    this.server = createServer((client) => {
      if (Date.now() < this.refuseUntil) {
        client.destroy();
        return;
      }
      const upstream = connect(Number(target.port || 5432), target.hostname);
      for (const s of [client, upstream]) {
        this.sockets.add(s);
        s.on('close', () => this.sockets.delete(s));
        s.on('error', () => {});
      }
      const cut = () => {
        this.armed = null;
        client.destroy();
        upstream.destroy();
      };
      client.on('data', (d) => (this.armed === 'request' ? cut() : upstream.write(d)));
      upstream.on('data', (d) => (this.armed === 'answer' ? cut() : client.write(d)));
      client.on('close', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
    });
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r));
    this.port = (this.server.address() as { port: number }).port;
  }

  /** The next answer (server to gateway), or the next request (gateway to server), ends its connection instead of arriving. */
  arm(direction: 'answer' | 'request'): void {
    this.armed = direction;
  }

  /** Closes every connection and refuses new ones for `ms`. */
  away(ms: number): void {
    this.refuseUntil = Date.now() + ms;
    for (const s of this.sockets) s.destroy();
  }

  async stop(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise((r) => this.server.close(r));
  }
}

let schema: TestSchema;
let proxy: CuttingProxy;
let store: PostgresGatewayStore;

const fresh = (over: Partial<AdmitInput> = {}) =>
  admitInput({ key: `k-${randomUUID()}`, entity: `e-${randomUUID()}`, ownerToken: `o-${randomUUID()}`, fence: 7n, audit: { requestId: `r-${randomUUID()}`, clientRequestId: null, caller: null, method: 'POST', path: '/x', payloadSha256: '0' }, ...over });
/** The same request again (the client's retry after its 503): same key and payload, a new owner. */
const retryOf = (c: AdmitInput): AdmitInput => ({ ...c, ownerToken: `o-${randomUUID()}`, audit: { ...c.audit, requestId: `r-${randomUUID()}` } });

async function stateOf(c: AdmitInput) {
  const rec = await schema.pool.query<{ state: string; owner_token: string }>('SELECT state, owner_token FROM idempotency_records WHERE scope = $1 AND key = $2', [c.scope, c.key]);
  const ent = await schema.pool.query<{ fence: string | null; inflight_owner: string | null }>('SELECT fence, inflight_owner FROM fence_entities WHERE entity = $1', [c.entity]);
  return { record: rec.rows[0]?.state ?? null, owner: rec.rows[0]?.owner_token ?? null, fence: ent.rows[0]?.fence ?? null, slot: ent.rows[0]?.inflight_owner ?? null };
}

/** The store's admission without the release around it: what a lost answer left before the release existed (the negative control). */
const unreleased = (s: PostgresGatewayStore) => (s as unknown as { admission: (i: AdmitInput) => Promise<Admission> }).admission;

describe.skipIf(!POSTGRES_URL)('PostgreSQL: an admission whose answer was lost is released', () => {
  beforeAll(async () => {
    schema = await createTestSchema('fg_unsent');
    proxy = new CuttingProxy();
    await proxy.start(new URL(POSTGRES_URL!));
    const url = new URL(schema.url);
    url.host = `127.0.0.1:${proxy.port}`;
    store = await createPostgresStore({ connectionString: url.toString(), poolSize: 4, listen: false });
  });
  afterAll(async () => {
    await store?.close();
    await proxy?.stop();
    await schema?.drop();
  });
  beforeEach(async () => {
    await store.unsent.idle();
    Object.assign(store.unsent.stats, { released: 0, nothing: 0, gaveUp: 0, failedAttempts: 0 });
  });

  it('a lone admission that committed: its record and slot are released, the fence stays, the retry is forwarded', async () => {
    const c = fresh();
    proxy.arm('answer');
    await expect(store.admit(c)).rejects.toThrow();
    await store.unsent.idle();
    expect(store.unsent.stats).toEqual({ released: 1, nothing: 0, gaveUp: 0, failedAttempts: 0 });
    expect(await stateOf(c)).toEqual({ record: null, owner: null, fence: '7', slot: null });
    expect(await store.admit(retryOf(c))).toEqual({ outcome: 'forward', takeover: false });
    // A release is no refusal: nothing in the rejection log.
    expect(await rejectionReasons(schema, c.audit.requestId)).toEqual([]);
  });

  it('negative control: without the release, the lost answer leaves the record in_progress and the retry is refused', async () => {
    const c = fresh();
    proxy.arm('answer');
    await expect(unreleased(store)(c)).rejects.toThrow();
    expect(await stateOf(c)).toEqual({ record: 'in_progress', owner: c.ownerToken, fence: '7', slot: c.ownerToken });
    const retry = await store.admit(retryOf(c));
    expect(retry.outcome).toBe('idempotency-in-progress');
    expect(store.unsent.stats).toEqual({ released: 0, nothing: 0, gaveUp: 0, failedAttempts: 0 });
  });

  it('a group that committed: every element is released', async () => {
    const cs = Array.from({ length: 5 }, () => fresh());
    proxy.arm('answer');
    const results = await Promise.allSettled(cs.map((c) => store.admit(c)));
    expect(results.map((r) => r.status)).toEqual(cs.map(() => 'rejected'));
    await store.unsent.idle();
    expect(store.unsent.stats).toEqual({ released: 5, nothing: 0, gaveUp: 0, failedAttempts: 0 });
    for (const c of cs) expect(await stateOf(c)).toEqual({ record: null, owner: null, fence: '7', slot: null });
  });

  it('an admission refused in-progress whose answer was lost holds nothing: the first owner keeps its record and slot', async () => {
    const first = fresh();
    expect(await store.admit(first)).toEqual({ outcome: 'forward', takeover: false });
    const second = retryOf(first);
    proxy.arm('answer');
    await expect(store.admit(second)).rejects.toThrow();
    await store.unsent.idle();
    expect(store.unsent.stats).toEqual({ released: 0, nothing: 1, gaveUp: 0, failedAttempts: 0 });
    expect(await stateOf(first)).toEqual({ record: 'in_progress', owner: first.ownerToken, fence: '7', slot: first.ownerToken });
  });

  it('the database away for a while: the release is tried again until it lands', async () => {
    const c = fresh();
    proxy.arm('answer');
    const failed = store.admit(c);
    await expect(failed).rejects.toThrow();
    proxy.away(700);
    await store.unsent.idle();
    expect(store.unsent.stats).toMatchObject({ released: 1, nothing: 0, gaveUp: 0 });
    expect(store.unsent.stats.failedAttempts).toBeGreaterThan(0);
    expect(await stateOf(c)).toEqual({ record: null, owner: null, fence: '7', slot: null });
  });

  it('a statement that never reached the server: nothing to release, nothing changed', async () => {
    const c = fresh();
    proxy.arm('request');
    await expect(store.admit(c)).rejects.toThrow();
    await store.unsent.idle();
    expect(store.unsent.stats).toEqual({ released: 0, nothing: 1, gaveUp: 0, failedAttempts: 0 });
    expect(await stateOf(c)).toEqual({ record: null, owner: null, fence: null, slot: null });
    expect(await store.admit(retryOf(c))).toEqual({ outcome: 'forward', takeover: false });
  });
});
