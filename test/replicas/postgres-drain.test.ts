import { randomUUID } from 'node:crypto';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FaultProxy } from '../faults/toolkit/tcp-proxy.js';
import { faultRoutes, startGatewayProc, type GatewayProc } from '../faults/toolkit/gateway-proc.js';
import type { Exit } from '../helpers/child.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { tempDir } from '../helpers/temp.js';
import { startUpstream, type FakeUpstream, type Gate } from '../helpers/upstream.js';

/**
 * SIGTERM while the database is away and requests are finishing (a deploy
 * during a failover): the callers are given the upstream's answers while
 * their finishes cannot be written. The drain (src/entry/drain-finishes.ts,
 * docs/deploy-postgres.md §6) goes on retrying those finishes, past the
 * records' locks, until they land or `drainTimeout` is up; what it could not
 * write is logged with route, key and request id, never a body. A real
 * gateway process on PostgreSQL behind the fault suite's TCP proxy, which
 * resets every connection and refuses new ones while cut.
 */

/** A short lock (timeoutMs + lockMarginMs = 2.5 s), so that it runs out while the database is away. */
const ROUTES = (upstream: string) => faultRoutes(upstream, { timeoutMs: 2_000, lockMarginMs: 500 });
const DRAIN_TIMEOUT_MS = 12_000;

interface Paid {
  status: number;
  replayed: boolean;
  code: string | null;
  requestId: string | null;
  body: string;
}

describe.skipIf(!POSTGRES_URL)('SIGTERM drains the finishes still pending while PostgreSQL is away', () => {
  const tmp = tempDir('fencegate-drain-');
  let schema: TestSchema;
  let proxy: FaultProxy;
  let up: FakeUpstream;
  let gw: GatewayProc | null = null;

  const pay = async (url: string, key: string, entity: string): Promise<Paid> => {
    const res = await fetch(`${url}/payments/${entity}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-fence-entity': entity, 'x-execution-fence': '1', 'idempotency-key': key },
      body: JSON.stringify({ amount: 1 }),
      signal: AbortSignal.timeout(30_000),
    });
    const body = await res.text();
    const code = res.headers.get('content-type') === 'application/problem+json' ? String(JSON.parse(body).type).split('/').pop()! : null;
    return { status: res.status, replayed: res.headers.get('idempotent-replayed') === 'true', code, requestId: res.headers.get('x-request-id'), body };
  };

  /**
   * Four requests held at the upstream, the database cut, SIGTERM, then the
   * upstream answers: the callers get their 201 once the gateway's own
   * retries gave up at the lock's end, while the drain keeps retrying.
   */
  async function answersDuringOutage(name: string): Promise<{ keys: { key: string; entity: string }[]; paid: Paid[]; exited: Promise<Exit>; termAt: number }> {
    gw = await startGatewayProc({
      store: { postgres: proxy.wrapUrl(schema.url) },
      routes: ROUTES(up.url),
      dir: tmp.dir,
      name,
      config: { store: { postgres: 'postgres://set-by-the-child', poolSize: 6, queryTimeout: '2s' }, drainTimeout: `${DRAIN_TIMEOUT_MS}ms` },
    });
    const keys = Array.from({ length: 4 }, () => ({ key: `k-${randomUUID()}`, entity: `e-${randomUUID()}` }));
    const gate: Gate = up.gate();
    const held = new Set(keys.map((k) => k.key));
    up.behave((call) => (call.key !== null && held.has(call.key) ? { kind: 'hold', gate: gate.promise } : undefined));
    const before = up.calls.length;
    const paying = keys.map((k) => pay(gw!.url, k.key, k.entity));
    await up.waitForCalls(before + keys.length);
    proxy.cut();
    const proc = gw.proc;
    const termAt = performance.now();
    proc.proc.kill('SIGTERM');
    gate.open();
    const paid = await Promise.all(paying);
    return { keys, paid, exited: proc.exited, termAt };
  }

  beforeAll(async () => {
    schema = await createTestSchema('fg_drain', 2);
    const target = new URL(POSTGRES_URL!);
    proxy = await FaultProxy.start({ target: { host: target.hostname, port: Number(target.port || 5432) }, name: 'postgres' });
    up = await startUpstream();
  });
  afterEach(async () => {
    proxy.restore();
    up.behave(null);
    await gw?.close();
    gw = null;
  });
  afterAll(async () => {
    await up?.close();
    await proxy?.close();
    await schema?.drop();
    tmp.cleanup();
  });

  it("the database back within the bound: the finishes land, and each key's retry is the replay", { timeout: 120_000 }, async () => {
    const { keys, paid, exited, termAt } = await answersDuringOutage('back');
    // The callers were given the upstream's answers (the lock has run out by now).
    for (const p of paid) expect(p.status).toBe(201);
    proxy.restore();
    const exit = await Promise.race([exited, new Promise<null>((r) => setTimeout(() => r(null), DRAIN_TIMEOUT_MS + 10_000))]);
    console.log(`back: ${exit === null ? 'still running' : `exited ${JSON.stringify(exit)}`} ${Math.round(performance.now() - termAt)} ms after SIGTERM`);
    expect(exit).toEqual({ code: 0, signal: null });

    await gw!.restart();
    for (const [i, k] of keys.entries()) {
      const again = await pay(gw!.url, k.key, k.entity);
      expect({ status: again.status, code: again.code, replayed: again.replayed }).toEqual({ status: 201, code: null, replayed: true });
      expect(again.body).toBe(paid[i]!.body);
      expect(up.callsFor(k.key)).toHaveLength(1);
    }
  });

  it('the database not back: the process exits within its bound and logs each unwritten finish (route, key, request id, no body)', {
    timeout: 120_000,
  }, async () => {
    const { keys, paid, exited, termAt } = await answersDuringOutage('gone');
    for (const p of paid) expect(p.status).toBe(201);
    const proc = gw!.proc;
    const exit = await Promise.race([exited, new Promise<null>((r) => setTimeout(() => r(null), DRAIN_TIMEOUT_MS + 10_000))]);
    console.log(`gone: ${exit === null ? 'still running' : `exited ${JSON.stringify(exit)}`} ${Math.round(performance.now() - termAt)} ms after SIGTERM`);
    expect(exit).not.toBeNull();

    const unwritten = proc.lines.filter((m) => m.msg === 'finish-unwritten');
    expect(unwritten.map((m) => m.idempotency_key).sort()).toEqual(keys.map((k) => k.key).sort());
    for (const m of unwritten) {
      const i = keys.findIndex((k) => k.key === m.idempotency_key);
      expect(m).toMatchObject({ level: 'error', route: 'payments', entity: keys[i]!.entity, outcome: 'completed', request_id: paid[i]!.requestId });
      // The stored answer is never logged.
      const line = JSON.stringify(m);
      expect(line).not.toContain('"effect"');
      expect(line).not.toContain(paid[i]!.body);
    }
    expect(proc.lines.some((m) => m.msg === 'drain-timeout')).toBe(true);

    // Nothing of them was written: once back, each key is outcome-unknown (to settle by hand), never forwarded again.
    proxy.restore();
    await gw!.restart();
    for (const k of keys) {
      const again = await pay(gw!.url, k.key, k.entity);
      expect([again.status, again.code]).toEqual([409, 'outcome-unknown']);
      expect(up.callsFor(k.key)).toHaveLength(1);
    }
  });
});
