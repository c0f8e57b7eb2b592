import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FaultProxy } from '../faults/toolkit/tcp-proxy.js';
import { faultRoutes, startGatewayProc, type GatewayProc } from '../faults/toolkit/gateway-proc.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { tempDir } from '../helpers/temp.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { answerOf, transportFailure, type Answer } from './support.js';

/**
 * A database that stops answering without closing anything (a host that
 * vanished, a silent network): the fault suite's TCP proxy in front of the
 * real server swallows every byte and keeps the connections open. One
 * gateway PROCESS (test/helpers/pg-gateway-child.mjs, built as `fencegate
 * serve` builds it) with a short client-side bound (`store.queryTimeout`)
 * and drain bound (`drainTimeout`), docs/deploy-postgres.md §6.
 *
 * Without the bound every request waited forever, `/health` said nothing of
 * it, nothing was logged and SIGTERM never exited: the figures this test
 * prints are the ones to compare (the report quotes both).
 */

const QUERY_TIMEOUT_MS = 1_500;
const DRAIN_TIMEOUT_MS = 8_000;
/** How long a caller waits here for an answer: far past the bound, short of the test's timeout. */
const CALLER_WAIT_MS = 20_000;

describe.skipIf(!POSTGRES_URL)('a PostgreSQL that stops answering, through a real gateway process', () => {
  const tmp = tempDir('fencegate-stall-');
  let schema: TestSchema;
  let proxy: FaultProxy;
  let up: FakeUpstream;
  let gw: GatewayProc;

  const pay = (key: string, entity: string): Promise<Answer> =>
    fetch(`${gw.url}/payments/${entity}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-fence-entity': entity, 'x-execution-fence': '1', 'idempotency-key': key },
      body: JSON.stringify({ amount: 1 }),
      signal: AbortSignal.timeout(CALLER_WAIT_MS),
    }).then(answerOf, transportFailure);
  const health = async (path = 'health'): Promise<{ status: number; body: { status?: string; store?: string } | null }> => {
    try {
      const res = await fetch(`${gw.url}/_fencegate/${path}`, { signal: AbortSignal.timeout(5_000) });
      return { status: res.status, body: (await res.json()) as { status?: string; store?: string } };
    } catch {
      return { status: 0, body: null };
    }
  };

  beforeAll(async () => {
    schema = await createTestSchema('fg_stall', 2);
    const target = new URL(POSTGRES_URL!);
    proxy = await FaultProxy.start({ target: { host: target.hostname, port: Number(target.port || 5432) }, name: 'postgres' });
    up = await startUpstream();
    gw = await startGatewayProc({
      store: { postgres: proxy.wrapUrl(schema.url) },
      routes: faultRoutes(up.url),
      dir: tmp.dir,
      name: 'stall',
      config: { store: { postgres: 'postgres://set-by-the-child', poolSize: 6, queryTimeout: `${QUERY_TIMEOUT_MS}ms` }, drainTimeout: `${DRAIN_TIMEOUT_MS}ms` },
    });
  });
  afterAll(async () => {
    await gw?.close();
    await up?.close();
    await proxy?.close();
    await schema?.drop();
    tmp.cleanup();
  });

  it('503 within the bound, health says so, a log line, recovery, SIGTERM exits within its drain bound, no duplicate effect', {
    timeout: 120_000,
  }, async () => {
    const warm = await pay(`warm-${randomUUID()}`, `e-${randomUUID()}`);
    expect(warm.status).toBe(201);
    expect((await health()).body).toEqual({ status: 'ok', store: 'up' });
    expect(await health('ready')).toEqual({ status: 200, body: { status: 'ready' } });
    const effectsBefore = up.effects;

    // The database goes silent; the connections stay open.
    proxy.blackhole(true);
    const keys = Array.from({ length: 8 }, () => ({ key: `k-${randomUUID()}`, entity: `e-${randomUUID()}` }));
    const answers = await Promise.all(keys.map((k) => pay(k.key, k.entity)));
    const stalledHealth = await health();
    const answered = answers.filter((a) => a.status !== 0).length;
    console.log(
      `stall: ${answered}/8 answered within ${CALLER_WAIT_MS} ms (${answers.map((a) => a.status).join(',')}); health ${stalledHealth.status} ${JSON.stringify(stalledHealth.body)}`,
    );
    for (const a of answers) {
      expect(a.status).toBe(503);
      expect(a.code).toBe('store-unavailable');
    }
    expect(stalledHealth).toEqual({ status: 200, body: { status: 'ok', store: 'unavailable' } });
    // Liveness stays 200 (a silent database must not get every replica restarted); readiness is 503.
    expect(await health('ready')).toEqual({ status: 503, body: { status: 'unavailable', store: 'unavailable' } });
    const logged = await gw.proc.waitFor((m) => m.msg === 'store-unavailable', 'the store-unavailable log line', 5_000);
    expect(logged.error).toMatch(/timeout/i);
    // Nothing was sent upstream.
    expect(up.effects).toBe(effectsBefore);

    // The database answers again: the same process recovers by itself.
    proxy.blackhole(false);
    const after = await pay(`after-${randomUUID()}`, `e-${randomUUID()}`);
    expect(after.status).toBe(201);
    // The flag follows the round trips (src/store/postgres/health.ts): one sent in the
    // silence may still time out (within QUERY_TIMEOUT_MS) after the first that was
    // answered, and flip it down once more; the next answered one brings it back. A read
    // of the audit API is such a round trip, with no effect upstream.
    const upBy = performance.now() + QUERY_TIMEOUT_MS * 3;
    let healthBody = (await health()).body;
    let ready = await health('ready');
    while ((healthBody?.store !== 'up' || ready.status !== 200) && performance.now() < upBy) {
      await fetch(`${gw.url}/_fencegate/v1/rejections?limit=1`, { signal: AbortSignal.timeout(5_000) }).then(
        (r) => r.arrayBuffer(),
        () => null,
      );
      await new Promise((r) => setTimeout(r, 100));
      healthBody = (await health()).body;
      ready = await health('ready');
    }
    expect(healthBody).toEqual({ status: 'ok', store: 'up' });
    expect(ready).toEqual({ status: 200, body: { status: 'ready' } });
    // Each stalled key's retry is forwarded once (an admission that may have committed was released).
    for (const k of keys) expect((await pay(k.key, k.entity)).status).toBe(201);
    expect(up.effects).toBe(effectsBefore + 1 + keys.length);

    // Silent again, with requests waiting on the store: SIGTERM must still exit, within its bound.
    proxy.blackhole(true);
    const inflight = [pay(`late-${randomUUID()}`, `e-${randomUUID()}`), pay(`late-${randomUUID()}`, `e-${randomUUID()}`)];
    await new Promise((r) => setTimeout(r, 200)); // the requests are on their way (they wait on the store)
    const proc = gw.proc;
    const termAt = performance.now();
    proc.proc.kill('SIGTERM');
    const exit = await Promise.race([proc.exited, new Promise<null>((r) => setTimeout(() => r(null), DRAIN_TIMEOUT_MS + 10_000))]);
    const exitMs = Math.round(performance.now() - termAt);
    console.log(`SIGTERM while silent: ${exit === null ? `still running after ${exitMs} ms` : `exited ${JSON.stringify(exit)} after ${exitMs} ms`}`);
    expect(exit).not.toBeNull();
    expect(exit!.code).toBe(0);
    for (const a of await Promise.all(inflight)) expect([0, 503]).toContain(a.status);

    // Back, and a new process on the same store: every key answered once, replays for the rest.
    proxy.blackhole(false);
    await gw.restart();
    for (const k of keys) {
      const again = await pay(k.key, k.entity);
      expect(again.status).toBe(201);
      expect(again.replayed).toBe(true);
    }
    for (const k of keys) expect(up.callsFor(k.key)).toHaveLength(1);
  });
});
