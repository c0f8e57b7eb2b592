import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CLI, killAll as killChildren, startGatewayChild, writeJson, type Proc as Child } from '../helpers/child.js';
import { command, paymentsRoute, tempDir, until } from '../helpers/gateway.js';
import { findPostgresBin, startPrivatePostgres, type PrivatePostgres } from '../helpers/private-postgres.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { answerOf, sleep, transportFailure, type Answer } from './support.js';

// The claim (DESIGN §8.2): "restart PostgreSQL under load: the gateways recover without
// restart and nothing is left in_progress". A PRIVATE server (initdb into a
// temporary directory, its own port), so the restart never touches the
// shared server of the other test files. Two gateway processes (the real
// CLI) on it, six clients sending a steady stream round-robin, each
// retrying its own key on 503 as an SDK would; in the middle the server is
// stopped (fast: every session terminated), kept down until both gateways
// have answered 503, and started again.

const BIN = findPostgresBin();
if (BIN === null) {
  console.warn('[fencegate] initdb/pg_ctl not found (Debian: apt-get install postgresql; or set FENCEGATE_PG_BIN): the PostgreSQL restart test is SKIPPED.');
}

type Gateway = Child & { url: string };
/** Answers a client retries with the same key: nothing happened, or not yet. */
const RETRY = new Set(['store-unavailable', 'idempotency-in-progress', 'entity-busy']);

describe.skipIf(BIN === null)('a real PostgreSQL restart under load, two gateway processes', () => {
  const tmp = tempDir('fencegate-restart-');
  let db: PrivatePostgres | null = null;
  let up: FakeUpstream;
  let gateways: Gateway[] = [];
  let client: pg.Client | null = null;
  const sql = async <R = any>(text: string, values: unknown[] = []): Promise<R[]> => {
    if (client === null) {
      client = new pg.Client({ connectionString: db!.url, application_name: 'fg-restart-test' });
      client.on('error', () => {});
      await client.connect();
    }
    return (await client.query(text, values)).rows as R[];
  };

  beforeAll(async () => {
    db = await startPrivatePostgres(BIN!);
    up = await startUpstream();
    const config = writeJson(join(tmp.dir, 'config.json'), {
      listen: { host: '127.0.0.1', port: 0 },
      store: { postgres: db.url, poolSize: 4 },
      // A short lock and a frequent sweep: a record whose finish could not
      // be written while the server was down settles within the test.
      sweepInterval: '1s',
      routes: [paymentsRoute(up.url, { timeoutMs: 2_000, lockMarginMs: 500 })],
    });
    gateways = await Promise.all([0, 1].map(() => startGatewayChild([CLI, 'serve', '--config', config, '--database-url', db!.url])));
  }, 120_000);

  afterAll(async () => {
    await killChildren();
    await client?.end().catch(() => {});
    await up?.close();
    await db?.destroy();
    tmp.cleanup();
  }, 60_000);

  it('requests in the window get 503 store-unavailable or succeed; both gateways recover by themselves; every admitted request ends recorded; no duplicate effect', async () => {
    const pids = gateways.map((g) => g.pid);
    interface Attempt {
      gw: number;
      sent: number;
      at: number;
      status: number;
      code: string | null;
    }
    const attempts: Attempt[] = [];
    const finals = new Map<string, Answer>();
    let stopping = false;
    let rr = 0;
    let atUpstreamCount = 0;

    /** One logical request: the same key until an answer that is final (201, outcome-unknown, or anything unexpected). */
    async function logical(key: string, entity: string, fence: number): Promise<Answer> {
      for (let i = 0; i < 1_000; i++) {
        const gw = rr++ % 2;
        const sent = Date.now();
        const a = await command(gateways[gw]!.url, '/payments/charges', { fence, entity, key }).then(answerOf, transportFailure);
        attempts.push({ gw, sent, at: Date.now(), status: a.status, code: a.code });
        if (a.code === null || !RETRY.has(a.code)) return a;
        await sleep(a.code === 'store-unavailable' ? 20 : 100);
      }
      throw new Error(`key ${key}: no final answer after 1000 attempts`);
    }
    // Clients 0–2 meet a slow upstream (their requests are the ones caught
    // between admission and finish by the stop); 3–5 a fast one, so they keep
    // probing the gateways while the server is down.
    const clients = [0, 1, 2, 3, 4, 5].map(async (id) => {
      for (let n = 0; !stopping && n < 5_000; n++) {
        const key = `load-${id}-${n}`;
        finals.set(key, await logical(key, `tool-job:load-${id}`, n + 1));
      }
    });
    const successes = () => [...finals.values()].filter((a) => a.status === 201).length;
    // Slow answers keep a few requests at the upstream at any moment, so the
    // stop also catches admitted requests whose finish must reach the database.
    up.behave((c) => (/^tool-job:load-[012]$/.test(c.entity ?? '') ? { kind: 'delay', ms: 100 } : undefined));

    try {
      await until(() => successes() >= 40, 'the load to warm up');
      const tStop = Date.now();
      const atUpstream = up.calls.filter((c) => !c.finished);
      atUpstreamCount = atUpstream.length;
      await db!.stop('fast');
      const tDown = Date.now();
      // Down until both gateways have answered 503 for it, and every request
      // that was at the upstream has its answer (its finish now meets a
      // stopped server): conditions, not a sleep.
      await until(
        () => [0, 1].every((g) => attempts.some((a) => a.gw === g && a.sent >= tDown && a.status === 503)) && atUpstream.every((c) => c.finished),
        'both gateways to answer 503 while the server is down',
      );
      const tStart = Date.now();
      await db!.start();
      const tUp = Date.now();
      // Recovery without a gateway restart: a request SENT after the server is back succeeds on each.
      await until(() => [0, 1].every((g) => attempts.some((a) => a.gw === g && a.sent >= tUp && a.status === 201)), 'both gateways to serve again', {
        timeoutMs: 30_000,
      });
      const base = successes();
      await until(() => successes() >= base + 40, 'steady load after the restart');
      stopping = true;
      await Promise.all(clients);

      const firstOk = [0, 1].map((g) => Math.min(...attempts.filter((a) => a.gw === g && a.sent >= tUp && a.status === 201).map((a) => a.at)) - tUp);
      const window = attempts.filter((a) => a.sent >= tStop && a.sent < tUp);
      const counts = (xs: Attempt[]) =>
        xs.reduce<Record<string, number>>((m, a) => ((m[`${a.status} ${a.code ?? ''}`.trim()] = (m[`${a.status} ${a.code ?? ''}`.trim()] ?? 0) + 1), m), {});

      // The gateways were never restarted, and answered only what the contract allows.
      expect(gateways.map((g) => [g.pid, g.proc.exitCode, g.proc.signalCode])).toEqual(pids.map((p) => [p, null, null]));
      for (const a of attempts) {
        const ok =
          a.status === 201 ||
          (a.status === 503 && a.code === 'store-unavailable') ||
          (a.status === 409 && ['idempotency-in-progress', 'outcome-unknown', 'entity-busy'].includes(a.code!));
        expect(ok, `unexpected answer ${a.status} ${a.code}`).toBe(true);
      }
      expect(window.filter((a) => a.status === 503).length).toBeGreaterThan(0);

      // G4: nothing stays in_progress (the sweepers settle locks of finishes lost in the window).
      await until(async () => (await sql(`SELECT 1 FROM idempotency_records WHERE state = 'in_progress' LIMIT 1`)).length === 0, 'no in_progress record', {
        everyMs: 200,
        timeoutMs: 30_000,
      });
      const records = new Map((await sql<{ key: string; state: string }>('SELECT key, state FROM idempotency_records')).map((r) => [r.key, r.state]));
      let finishLost = 0;
      for (const [key, final] of finals) {
        const calls = up.callsFor(key).length;
        // G2: never a duplicate effect per key.
        expect(calls, key).toBeLessThanOrEqual(1);
        if (final.status === 201) {
          expect(calls, key).toBe(1);
          // Admitted and forwarded: recorded, completed, or outcome_unknown when the
          // finish could not reach the database before the lock ran out.
          expect(['completed', 'outcome_unknown'], key).toContain(records.get(key));
          if (records.get(key) === 'outcome_unknown') finishLost++;
        } else {
          // An admission whose commit was acknowledged to nobody: the retry learns outcome-unknown.
          expect(final.code, key).toBe('outcome-unknown');
          expect(records.get(key), key).toBe('outcome_unknown');
        }
      }
      // Every upstream effect belongs to a recorded request.
      for (const c of up.calls) expect(['completed', 'outcome_unknown'], String(c.key)).toContain(records.get(c.key!));

      // Cross-replica wake-ups are back too: each gateway LISTENs again.
      await until(
        async () => (await sql<{ n: number }>(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE query LIKE 'LISTEN fencegate_%'`))[0]!.n === 2,
        'both listeners to reconnect',
      );

      const finishErrors = gateways.flatMap((g) => g.lines.filter((l) => l.msg === 'store-error' && l.phase === 'finish')).length;
      console.info(
        `[fencegate] PostgreSQL restart under load: ${finals.size} logical requests, ${attempts.length} attempts; ` +
          `server stop ${tDown - tStop} ms, kept down ${tStart - tDown} ms, start ${tUp - tStart} ms; ` +
          `attempts sent in the window: ${JSON.stringify(counts(window))}; all attempts: ${JSON.stringify(counts(attempts))}; ` +
          `first 201 after the server was back: ${firstOk.map((ms) => `${ms} ms`).join(' / ')}; ` +
          `at the upstream when the stop began: ${atUpstreamCount}; finishes given up after their retries: ${finishErrors}; ` +
          `forwarded but finish lost (outcome_unknown): ${finishLost}; outcome-unknown finals: ${[...finals.values()].filter((a) => a.status !== 201).length}`,
      );
    } finally {
      stopping = true;
      await Promise.allSettled(clients);
      up.behave(null);
    }
  }, 120_000);
});
