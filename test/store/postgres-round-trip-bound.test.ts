import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresStore, type PostgresGatewayStore } from '../../src/store/postgres/index.js';
import type { AdmitInput } from '../../src/store/types.js';
import { FaultProxy } from '../faults/toolkit/tcp-proxy.js';
import { createTestSchema, POSTGRES_URL, until, type TestSchema } from '../helpers/postgres.js';
import { admitInput } from './helpers/inputs.js';

/**
 * The client-side bound of every store round trip (`queryTimeoutMs`,
 * docs/deploy-postgres.md §6): a round trip the server never answers (the
 * fault suite's TCP proxy swallowing the server's bytes, the connection left
 * open) fails after the bound instead of hanging, its connection is
 * destroyed rather than handed to the next call, the admission group moves
 * on, the store reports itself unhealthy and healthy again once a round trip
 * is answered, and the admission, whose COMMIT went through, is released.
 */

let schema: TestSchema;
let proxy: FaultProxy;
let store: PostgresGatewayStore;
const changes: boolean[] = [];

const fresh = (): AdmitInput =>
  admitInput({
    key: `k-${randomUUID()}`,
    entity: `e-${randomUUID()}`,
    ownerToken: `o-${randomUUID()}`,
    fence: 3n,
    audit: { requestId: `r-${randomUUID()}`, clientRequestId: null, caller: null, method: 'POST', path: '/x', payloadSha256: '0' },
  });

describe.skipIf(!POSTGRES_URL)('PostgreSQL: a round trip that is never answered', () => {
  beforeAll(async () => {
    schema = await createTestSchema('fg_bound');
    const target = new URL(POSTGRES_URL!);
    proxy = await FaultProxy.start({ target: { host: target.hostname, port: Number(target.port || 5432) }, name: 'postgres' });
    store = await createPostgresStore({
      connectionString: proxy.wrapUrl(schema.url),
      poolSize: 2,
      listen: false,
      queryTimeoutMs: 1_000,
      onHealth: (healthy) => changes.push(healthy),
    });
  });
  afterAll(async () => {
    proxy?.blackhole(false, 'down');
    await store?.close();
    await proxy?.close();
    await schema?.drop();
  });

  it('fails past the bound, destroys the connection, frees the group, reports unhealthy, then recovers and releases what committed', {
    timeout: 60_000,
  }, async () => {
    // A connection in the pool first (the warm-up is answered).
    const warm = fresh();
    expect((await store.admit(warm)).outcome).toBe('forward');
    const pool = store.pool as pg.Pool;
    const before = pool.totalCount;
    expect(store.healthy).toBe(true);

    proxy.blackhole(true, 'down');
    const lost = [fresh(), fresh(), fresh()];
    // The first goes alone; the two that arrive while it is out wait behind
    // it in the admission group (one round trip in flight), and must not wait forever.
    const first = store.admit(lost[0]!);
    await until(() => (store.pool as pg.Pool).idleCount === 0, 'the first admission on its way');
    const results = await Promise.allSettled([first, ...lost.slice(1).map((c) => store.admit(c))]);
    for (const r of results) {
      expect(r.status).toBe('rejected');
      expect(String((r as PromiseRejectedResult).reason)).toMatch(/timeout/i);
    }
    expect(store.healthy).toBe(false);
    expect(changes).toEqual([false]);
    // The connections whose query timed out were destroyed, not returned for reuse.
    expect(pool.totalCount).toBeLessThanOrEqual(before);
    expect(pool.idleCount).toBe(0);

    // The first statement reached the server and committed; only its answer
    // was lost. (The two behind it went on a new connection, whose start-up
    // answer was swallowed too: nothing of them was sent.)
    const held = await schema.pool.query<{ key: string }>('SELECT key FROM idempotency_records WHERE key = ANY($1) AND state = $2', [
      lost.map((c) => c.key),
      'in_progress',
    ]);
    expect(held.rows.map((r) => r.key)).toContain(lost[0]!.key);

    proxy.blackhole(false, 'down');
    // The background release (DESIGN §8.2) frees what the timed-out admissions committed.
    await store.unsent.idle();
    expect(store.unsent.stats.released).toBe(held.rows.length);
    expect(store.unsent.stats.released + store.unsent.stats.nothing).toBe(3);
    await until(
      async () => (await schema.pool.query('SELECT 1 FROM idempotency_records WHERE key = ANY($1)', [lost.map((c) => c.key)])).rowCount === 0,
      'the lost admissions released',
    );
    expect(store.healthy).toBe(true);
    // Down once, up at the end; a connection the pool opened while the
    // answers were swallowed can still time out after the link is back, so
    // on a slow box the flag may go down and up once more in between.
    expect(changes[0]).toBe(false);
    expect(changes.at(-1)).toBe(true);
    expect(changes.every((h, i) => h === (i % 2 === 1))).toBe(true);
    // The retry of a lost admission is forwarded, not idempotency-in-progress.
    expect((await store.admit({ ...lost[0]!, ownerToken: `o-${randomUUID()}` })).outcome).toBe('forward');
  });

  it('a finish whose answer never comes fails past the bound (the one queued behind it too), is retried, and the record holds the answer', {
    timeout: 60_000,
  }, async () => {
    const a = fresh();
    const b = fresh();
    expect((await store.admit(a)).outcome).toBe('forward');
    expect((await store.admit(b)).outcome).toBe('forward');
    const finishOf = (c: AdmitInput) => ({
      scope: c.scope,
      key: c.key,
      entity: c.entity,
      ownerToken: c.ownerToken,
      audit: c.audit,
      outcome: 'completed' as const,
      response: { status: 201, headers: [] as [string, string][], body: new TextEncoder().encode(c.key!) },
      retentionMs: 60_000,
    });

    proxy.blackhole(true, 'down');
    const first = store.finish(finishOf(a));
    // Its rejection may come while the wait below still polls (a slow box): handled from the start, judged by allSettled.
    first.catch(() => {});
    await until(() => (store.pool as pg.Pool).idleCount === 0, 'the first finish on its way');
    const results = await Promise.allSettled([first, store.finish(finishOf(b))]);
    for (const r of results) expect(r.status).toBe('rejected');
    expect(store.healthy).toBe(false);

    proxy.blackhole(false, 'down');
    // The gateway retries a failed finish (src/http/settle.ts); it is never assumed written.
    for (const c of [a, b]) {
      const retry = await store.finish(finishOf(c));
      // The first attempt may have committed (its answer was lost): then the retry is discarded as late, the answer stays.
      expect(typeof retry.recorded).toBe('boolean');
      const replay = await store.admit({ ...c, ownerToken: `o-${randomUUID()}` });
      expect(replay.outcome).toBe('replay');
      expect(new TextDecoder().decode((replay as { response: { body: Uint8Array } }).response.body)).toBe(c.key);
    }
    expect(store.healthy).toBe(true);
  });
});
