/**
 * The black-box HTTP contract of a fencegate gateway (DESIGN §3), checked
 * over HTTP only: requests to the gateway, the recording fake upstream, and
 * the admin API (`/v1/entities`, `/v1/idempotency`, `/v1/rejections`) as the
 * only window on its state. The same function runs against the Node gateway
 * on SQLite and on PostgreSQL (contract.test.ts) and against `wrangler dev`
 * (test/workers/wrangler-dev.test.ts), so every deployment shape answers
 * the same way.
 *
 * The gateway under test must be configured with `contractRoutes(...)`
 * (admin API reachable without auth, on loopback). Keys and entities are
 * unique per run, so a gateway shared with other tests is fine; the checks
 * steer the upstream with `behave`, so they must not run concurrently with
 * other tests on the same upstream.
 */
import { randomUUID } from 'node:crypto';
import { expect, it } from 'vitest';
import type { FakeUpstream } from '../helpers/upstream.js';

export interface ContractTarget {
  /** `http://127.0.0.1:<port>` of the gateway. */
  gatewayUrl: string;
  /** The recording upstream that `contractRoutes` points at. */
  upstream: FakeUpstream;
  /** Default `/_fencegate`. */
  adminPrefix?: string;
  /**
   * What a refused upstream connection becomes on this runtime. Node can
   * tell that nothing was sent (`released`: 502, record deleted); workerd
   * cannot tell a refused connection from a reset after sending, so the
   * Workers gateway answers 504 and keeps the record `outcome_unknown`
   * (src/http/forward-fetch.ts). Default `released`.
   */
  refusedUpstream?: 'released' | 'outcome-unknown';
}

/**
 * The routes the contract needs, in the shape of the config file:
 * `/payments/*` (serial, waits for the entity's slot), `/nowait/*` (the same
 * entities, no serial wait: busy is answered at once) and `/refused/*`
 * (an upstream where nothing listens).
 */
export function contractRoutes(upstreamUrl: string, refusedUrl: string, extra: Record<string, unknown> = {}): Record<string, unknown>[] {
  const base = { entity: { header: 'X-Fence-Entity' }, fence: 'required', idempotency: 'required', mode: 'serial', timeoutMs: 10_000, ...extra };
  return [
    { ...base, name: 'payments', match: { path: '/payments/*', methods: ['POST'] }, upstream: upstreamUrl, serialWaitMs: 30_000, maxWaitMs: 30_000 },
    { ...base, name: 'nowait', match: { path: '/nowait/*', methods: ['POST'] }, upstream: upstreamUrl, serialWaitMs: 0 },
    { ...base, name: 'refused', match: { path: '/refused/*', methods: ['POST'] }, upstream: refusedUrl },
  ];
}

interface Sent {
  fence: string;
  entity: string;
  key: string;
  body?: string;
  headers?: Record<string, string>;
}

/** Registers the contract's tests (inside the caller's `describe`); `target` is read when they run. */
export function describeHttpContract(target: () => ContractTarget): void {
  const run = randomUUID().slice(0, 8);
  let n = 0;
  const uniq = (what: string) => `${what}-${run}-${++n}`;
  const t = () => {
    const x = target();
    return { ...x, admin: `${x.gatewayUrl}${x.adminPrefix ?? '/_fencegate'}` };
  };
  const send = (path: string, r: Sent) =>
    fetch(`${t().gatewayUrl}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-execution-fence': r.fence, 'x-fence-entity': r.entity, 'idempotency-key': r.key, ...r.headers },
      body: r.body ?? '{"amount":1200}',
    });
  const adminJson = async (path: string): Promise<{ status: number; body: any }> => {
    const res = await fetch(`${t().admin}${path}`);
    return { status: res.status, body: await res.json() };
  };
  const entityState = async (entity: string) => {
    const r = await adminJson(`/v1/entities/${encodeURIComponent(entity)}`);
    return r.status === 404 ? null : r.body;
  };
  const fenceOf = async (entity: string): Promise<string | null> => (await entityState(entity))?.fence ?? null;
  /** The key's records (404, no record: []). */
  const records = async (key: string): Promise<any[]> => {
    const r = await adminJson(`/v1/idempotency/${encodeURIComponent(key)}`);
    return r.status === 404 ? [] : r.body.records;
  };
  const rejections = async (entity: string): Promise<any[]> => (await adminJson(`/v1/rejections?entity=${encodeURIComponent(entity)}&limit=1000`)).body.items;
  /** Polls the admin API for a state another request is about to write; bounded. */
  const until = async (check: () => Promise<boolean>, what: string) => {
    for (let i = 0; i < 400; i++) {
      if (await check()) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`timed out waiting for ${what}`);
  };
  const problem = async (res: Response, status: number, code: string, fields: Record<string, unknown> = {}) => {
    const text = await res.text();
    expect(res.status, `${code}: ${text}`).toBe(status);
    expect(res.headers.get('content-type')).toBe('application/problem+json');
    const body = JSON.parse(text);
    expect(body.type).toMatch(new RegExp(`/${code}$`));
    expect(body).toMatchObject({ status, title: expect.any(String), detail: expect.any(String), ...fields });
    return body;
  };

  it('contract: a command is forwarded once with its fencing headers; the retry is replayed byte for byte with Idempotent-Replayed: true', async () => {
    const { upstream } = t();
    const entity = uniq('tool-job');
    const key = uniq('pay');
    const payload = new Uint8Array([0x7b, 0x22, 0x69, 0x64, 0x22, 0x3a, 0x22, 0xc3, 0xa9, 0x22, 0x7d, 0x0a]); // {"id":"é"}\n
    upstream.behave((c) =>
      c.key === key
        ? {
            kind: 'respond',
            status: 201,
            headers: { 'content-type': 'application/json; charset=utf-8', etag: '"v1"', 'set-cookie': 'session=secret' },
            body: payload,
          }
        : undefined,
    );
    try {
      const first = await send('/payments/charges', { fence: '7', entity, key });
      expect(first.status).toBe(201);
      expect(first.headers.get('idempotent-replayed')).toBeNull();
      expect(new Uint8Array(await first.arrayBuffer())).toEqual(payload);
      const [call, ...more] = upstream.callsFor(key);
      expect(more).toEqual([]);
      expect(call!.headers).toMatchObject({ 'x-execution-fence': '7', 'x-fence-entity': entity, 'idempotency-key': key });
      expect(call!.body.toString()).toBe('{"amount":1200}');

      const replay = await send('/payments/charges', { fence: '7', entity, key });
      expect(replay.status).toBe(201);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(replay.headers.get('content-type')).toBe('application/json; charset=utf-8');
      expect(replay.headers.get('etag')).toBe('"v1"');
      expect(replay.headers.get('set-cookie')).toBeNull();
      expect(new Uint8Array(await replay.arrayBuffer())).toEqual(payload);
      expect(upstream.callsFor(key)).toHaveLength(1);
      expect((await records(key)).map((r) => r.state)).toEqual(['completed']);
    } finally {
      upstream.behave(null);
    }
  });

  it('contract: a stale fence is refused 409 stale-fence with its fields, never forwarded (even for a completed key), and logged', async () => {
    const { upstream } = t();
    const entity = uniq('tool-job');
    const paidKey = uniq('pay');
    expect((await send('/payments/charges', { fence: '42', entity, key: paidKey })).status).toBe(201);
    const staleKey = uniq('pay');
    const body = await problem(await send('/payments/charges', { fence: '41', entity, key: staleKey }), 409, 'stale-fence', {
      entity,
      presented_fence: '41',
      current_fence: '42',
    });
    expect(body.request_id).toEqual(expect.any(String));
    // The fence check comes first: a lower fence gets no replay of a stored answer.
    await problem(await send('/payments/charges', { fence: '40', entity, key: paidKey }), 409, 'stale-fence', { current_fence: '42' });
    expect(upstream.callsFor(staleKey)).toEqual([]);
    expect(upstream.callsFor(paidKey)).toHaveLength(1);

    const log = await rejections(entity);
    expect(log).toHaveLength(2);
    expect(log.find((r) => r.idempotency_key === staleKey)).toMatchObject({
      reason: 'stale-fence',
      entity,
      presented_fence: '41',
      current_fence: '42',
      method: 'POST',
      path: '/payments/charges',
      payload_sha256: expect.stringMatching(/^[0-9a-f]{64}$/),
      request_id: body.request_id,
    });
    expect(await fenceOf(entity)).toBe('42');
  });

  it('contract: the same key with another body is refused 422 idempotency-key-reused, logged, never forwarded', async () => {
    const { upstream } = t();
    const entity = uniq('tool-job');
    const key = uniq('pay');
    expect((await send('/payments/charges', { fence: '1', entity, key })).status).toBe(201);
    await problem(await send('/payments/charges', { fence: '1', entity, key, body: '{"amount":9900}' }), 422, 'idempotency-key-reused', {
      idempotency_key: key,
    });
    expect(upstream.callsFor(key)).toHaveLength(1);
    expect(await rejections(entity)).toMatchObject([{ reason: 'idempotency-key-reused', idempotency_key: key, entity }]);
  });

  it('contract: malformed fences and keys are refused 400 before anything changes', async () => {
    const { upstream } = t();
    const entity = uniq('tool-job');
    expect((await send('/payments/charges', { fence: '5', entity, key: uniq('pay') })).status).toBe(201);
    const before = JSON.stringify([await entityState(entity), await rejections(entity)]);
    const keys: string[] = [];
    for (const fence of ['+6', '06', '6 7', '6.0', '6e3', '6, 7', '-6', '0x10', 'six', '9223372036854775808']) {
      const key = uniq('bad');
      keys.push(key);
      await problem(await send('/payments/charges', { fence, entity, key }), 400, 'invalid-fence');
    }
    const key = uniq('bad');
    await problem(await send('/payments/charges', { fence: '6', entity, key: `${key}, other` }), 400, 'invalid-idempotency-key');
    keys.push(key);
    expect(upstream.calls.filter((c) => c.entity === entity)).toHaveLength(1);
    expect(JSON.stringify([await entityState(entity), await rejections(entity)])).toBe(before);
    for (const k of keys) expect(await records(k)).toEqual([]);
  });

  it('contract: serial mode — an in-flight key answers 409 with Retry-After, or with Prefer: wait the replay; a busy entity waits or answers 409 entity-busy', async () => {
    const { upstream } = t();
    const entity = uniq('tool-job');
    const [k1, k2, k3] = [uniq('pay'), uniq('pay'), uniq('pay')];

    const gate1 = upstream.gate();
    const gate2 = upstream.gate();
    try {
      // 1. The same key while it is in flight.
      upstream.behave((c) => (c.key === k1 ? { kind: 'hold', gate: gate1.promise } : undefined));
      const holder = send('/payments/charges', { fence: '1', entity, key: k1 });
      await upstream.waitFor(() => upstream.callsFor(k1).length === 1, 'the holder upstream');
      const inProgress = await send('/payments/charges', { fence: '1', entity, key: k1 });
      expect(inProgress.headers.get('retry-after')).toMatch(/^\d+$/);
      await problem(inProgress, 409, 'idempotency-in-progress', { idempotency_key: k1, retry_after: expect.any(Number) });
      // With Prefer: wait and a newer fence: the admission raises the entity's fence (visible), then waits.
      const waiter = send('/payments/charges', { fence: '2', entity, key: k1, headers: { prefer: 'wait=20' } });
      await until(async () => (await fenceOf(entity)) === '2', 'the Prefer: wait request to be admitted');
      gate1.open();
      const [a, b] = await Promise.all([holder, waiter]);
      const bodyA = await a.text();
      expect(a.status).toBe(201);
      expect(b.status).toBe(201);
      expect(b.headers.get('idempotent-replayed')).toBe('true');
      expect(await b.text()).toBe(bodyA);
      expect(upstream.callsFor(k1)).toHaveLength(1);

      // 2. Another key for the busy entity: it waits for the slot (or, without waiting, is told busy).
      upstream.behave((c) => (c.key === k2 ? { kind: 'hold', gate: gate2.promise } : undefined));
      const second = send('/payments/charges', { fence: '3', entity, key: k2 });
      await upstream.waitFor(() => upstream.callsFor(k2).length === 1, 'the second holder upstream');
      const queued = send('/payments/charges', { fence: '4', entity, key: k3 });
      await until(async () => (await fenceOf(entity)) === '4', 'the queued request to be admitted');
      const busy = await send('/nowait/charges', { fence: '4', entity, key: uniq('pay') });
      expect(busy.headers.get('retry-after')).toMatch(/^\d+$/);
      await problem(busy, 409, 'entity-busy', { entity, retry_after: expect.any(Number) });
      expect(upstream.callsFor(k3)).toEqual([]);
      gate2.open();
      const [c, d] = await Promise.all([second, queued]);
      expect([c.status, d.status]).toEqual([201, 201]);
      expect(upstream.calls.filter((x) => x.entity === entity).map((x) => x.key)).toEqual([k1, k2, k3]);
      expect(upstream.maxInflight(entity)).toBe(1);
    } finally {
      upstream.behave(null);
      gate1.open();
      gate2.open();
    }
  });

  it('contract: a refused upstream connection is answered without a stored outcome the runtime cannot know, and frees the entity', async () => {
    const { upstream, refusedUpstream = 'released' } = t();
    const entity = uniq('tool-job');
    const key = uniq('pay');
    if (refusedUpstream === 'released') {
      await problem(await send('/refused/charges', { fence: '1', entity, key }), 502, 'upstream-unavailable');
      // Released: no record, so the same key may be sent again (502 again, not in-progress or unknown).
      expect(await records(key)).toEqual([]);
      await problem(await send('/refused/charges', { fence: '1', entity, key }), 502, 'upstream-unavailable');
      expect(await records(key)).toEqual([]);
    } else {
      await problem(await send('/refused/charges', { fence: '1', entity, key }), 504, 'upstream-timeout');
      expect((await records(key)).map((r) => r.state)).toEqual(['outcome_unknown']);
      await problem(await send('/refused/charges', { fence: '1', entity, key }), 409, 'outcome-unknown');
    }
    // The serial slot was given back: the entity takes the next command at once.
    const next = uniq('pay');
    expect((await send('/nowait/charges', { fence: '1', entity, key: next })).status).toBe(201);
    expect(upstream.callsFor(next)).toHaveLength(1);
    expect(upstream.callsFor(key)).toEqual([]);
  });
}
