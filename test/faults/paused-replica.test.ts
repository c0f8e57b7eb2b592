import { describe, expect, it } from 'vitest';
import { POSTGRES_URL } from '../helpers/postgres.js';
import { runPausedReplica } from './paused-replica.js';

// A gateway delayed between its admission and its forward for longer than
// the record's lock never forwards: fence 6 must not reach the upstream
// after fence 7 (G1, G3). The negative control, with the lock-budget check
// switched off, is paused-replica.negative.test.ts.

const backends = ['sqlite', ...(POSTGRES_URL ? (['postgres'] as const) : [])] as const;

describe.each(backends)('a paused gateway on %s', (backend) => {
  it('refuses to forward once its lock has expired: 503 admission-expired, the record released, the upstream saw only fence 7', async () => {
    const run = await runPausedReplica(backend);
    expect(run.upstreamFences).toEqual(['7']);
    expect(run.paused.status).toBe(503);
    expect(run.paused.body).toMatchObject({
      type: expect.stringMatching(/\/admission-expired$/),
      entity: 'tool-job:paused-1',
      presented_fence: '6',
      idempotency_key: 'paused-6',
    });
    // Released, not outcome_unknown: nothing was sent, the retry is safe.
    expect(run.pausedRecord).toBeNull();
  });
});

describe('a paused takeover', () => {
  it('an outcome_unknown record taken over (onUnknown: retry) and then abandoned past its lock goes back to outcome_unknown, not deleted', async () => {
    const { startTestGateway, command: send, paymentsRoute, until } = await import('../helpers/gateway.js');
    const { startUpstream } = await import('../helpers/upstream.js');
    const { holdAdmission } = await import('../helpers/store-wrappers.js');
    const upstream = await startUpstream();
    let calls = 0;
    upstream.behave(() => (++calls === 1 ? { kind: 'hang' } : undefined));
    let held = null as ReturnType<typeof holdAdmission> | null;
    const gw = await startTestGateway({
      routes: [paymentsRoute(upstream.url, { timeoutMs: 300, lockMarginMs: 300, onUnknown: 'retry' })],
      wrapStore: (store) => {
        held = holdAdmission(store, (i) => i.fence === 2n);
        return held.store;
      },
    });
    try {
      const first = await send(gw.url, '/payments/charges', { fence: 1, entity: 'tool-job:takeover-1', key: 'takeover-k' });
      expect(first.status).toBe(504);
      expect((await gw.sqlite.getRecords('takeover-k'))[0]?.state).toBe('outcome_unknown');
      const retry = send(gw.url, '/payments/charges', { fence: 2, entity: 'tool-job:takeover-1', key: 'takeover-k' });
      expect(await held!.committed).toEqual({ outcome: 'forward', takeover: true });
      await until(async () => (await gw.sqlite.getEntity('tool-job:takeover-1'))?.inflight == null, 'the takeover slot to expire');
      held!.release();
      const res = await retry;
      expect(res.status).toBe(503);
      expect(((await res.json()) as { type: string }).type).toMatch(/\/admission-expired$/);
      // The first attempt's outcome is still unknown; its record (and fingerprint) stay.
      expect((await gw.sqlite.getRecords('takeover-k'))[0]?.state).toBe('outcome_unknown');
      expect(upstream.calls.length).toBe(1);
    } finally {
      held?.release();
      await gw.close();
      await upstream.close();
    }
  });
});
