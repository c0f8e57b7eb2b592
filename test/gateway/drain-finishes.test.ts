import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { drainingFinishes } from '../../src/entry/drain-finishes.js';
import type { Logger } from '../../src/http/logger.js';
import { overrideStore } from '../../src/store/override.js';
import { createSqliteStore } from '../../src/store/sqlite/index.js';
import type { AdmitInput, FinishInput, GatewayStore } from '../../src/store/types.js';
import { admitInput } from '../store/helpers/inputs.js';
import { tempDir } from '../helpers/temp.js';

/**
 * The drain's finishes (src/entry/drain-finishes.ts) on a real SQLite store
 * whose finish is made to fail while "away" (a wrapper: the database is
 * there, the finish call throws as during an outage). What the PostgreSQL
 * process tests (test/replicas/postgres-drain.test.ts) cannot see from
 * outside: one finish never has two attempts at the store at once, though
 * the gateway's own loop keeps calling while the background retries.
 */

const lines: { level: string; msg: string; fields: Record<string, unknown> }[] = [];
const logger: Logger = {
  info: (msg, fields = {}) => lines.push({ level: 'info', msg, fields }),
  warn: (msg, fields = {}) => lines.push({ level: 'warn', msg, fields }),
  error: (msg, fields = {}) => lines.push({ level: 'error', msg, fields }),
};

/** The store, with finish() failing while `away`, and the most attempts of one finish it saw at once. */
function flaky(store: GatewayStore) {
  const state = { away: true, calls: 0, inFlight: new Map<FinishInput, number>(), maxAtOnce: 0 };
  const wrapped = overrideStore(store, {
    async finish(input) {
      state.calls++;
      const n = (state.inFlight.get(input) ?? 0) + 1;
      state.inFlight.set(input, n);
      state.maxAtOnce = Math.max(state.maxAtOnce, n);
      try {
        await new Promise((r) => setTimeout(r, 5)); // a round trip
        if (state.away) throw Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' });
        return await store.finish(input);
      } finally {
        state.inFlight.set(input, state.inFlight.get(input)! - 1);
      }
    },
  });
  return { state, store: wrapped };
}

/** The finish of admission `a`: its upstream's answer, with a body that must never be logged. */
const completedFinish = (a: AdmitInput, headers: [string, string][] = []): FinishInput => ({
  scope: a.scope,
  key: a.key,
  entity: a.entity,
  ownerToken: a.ownerToken,
  audit: a.audit,
  outcome: 'completed',
  response: { status: 201, headers, body: new TextEncoder().encode('secret-body') },
  retentionMs: 60_000,
});

/** The gateway's loop (src/http/settle.ts) in small: attempts every 20 ms until one lands or `attempts` failed. */
async function gatewayAttempts(store: GatewayStore, input: FinishInput, attempts: number): Promise<boolean | null> {
  for (let i = 0; i < attempts; i++) {
    try {
      return (await store.finish(input)).recorded;
    } catch {
      await new Promise((r) => setTimeout(r, 20));
    }
  }
  return null;
}

describe('a shutdown drain keeps the finishes it must not lose', () => {
  const tmp = tempDir('fencegate-drain-unit-');
  afterAll(() => tmp.cleanup());
  /** A SQLite store in `file` whose finish fails while away, the drain around it, and admission `a` forwarded on it. */
  const admitted = async (file: string, a: AdmitInput) => {
    const real = createSqliteStore({ path: join(tmp.dir, file) });
    const { state, store } = flaky(real);
    expect((await real.admit(a)).outcome).toBe('forward');
    return { state, drain: drainingFinishes(store, logger), a };
  };
  afterEach(() => {
    lines.length = 0;
  });

  it('a finish failing during the drain lands in the background once the store is back, never two attempts at once', async () => {
    const { state, drain, a } = await admitted('a.db', admitInput());
    const input = completedFinish(a);

    drain.drain(performance.now() + 60_000);
    // The gateway gives up after a few attempts (its lock ran out); the caller has its answer.
    expect(await gatewayAttempts(drain.store, input, 5)).toBeNull();
    state.away = false;
    // store.close() waits for the background retry, which lands now.
    await drain.store.close();
    expect(state.maxAtOnce).toBe(1);
    expect(lines.filter((l) => l.msg === 'finish-drained')).toHaveLength(1);
    expect(lines.filter((l) => l.msg === 'finish-unwritten')).toEqual([]);
    const check = createSqliteStore({ path: join(tmp.dir, 'a.db') });
    expect((await check.getRecords(a.key!))[0]?.state).toBe('completed');
    await check.close();
  });

  it('abandoned at the deadline: one finish-unwritten line per finish, with route, key and request id, never the body', async () => {
    const { drain, a } = await admitted('b.db', admitInput({ scope: 'payments\u0000caller-1' }));
    const input = completedFinish(a, [['x-secret', 'h']]);

    drain.drain(performance.now() + 60_000);
    expect(await gatewayAttempts(drain.store, input, 3)).toBeNull();
    expect(drain.abandon('drain-timeout')).toBe(1);
    await drain.store.close();
    const unwritten = lines.filter((l) => l.msg === 'finish-unwritten');
    expect(unwritten).toEqual([
      {
        level: 'error',
        msg: 'finish-unwritten',
        fields: { route: 'payments', idempotency_key: a.key, entity: a.entity, outcome: 'completed', request_id: a.audit.requestId, reason: 'drain-timeout' },
      },
    ]);
    expect(JSON.stringify(lines)).not.toContain('secret');
  });

  it('control: not draining, a failed finish is left to the gateway, nothing retries it', async () => {
    const { state, drain, a } = await admitted('c.db', admitInput());
    const input: FinishInput = { scope: a.scope, key: a.key, entity: a.entity, ownerToken: a.ownerToken, audit: a.audit, outcome: 'released' };
    expect(await gatewayAttempts(drain.store, input, 3)).toBeNull();
    const calls = state.calls;
    state.away = false;
    await drain.store.close();
    expect(state.calls).toBe(calls);
    expect(lines).toEqual([]);
  });
});
