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
    expect(run.paused.body).toMatchObject({ type: expect.stringMatching(/\/admission-expired$/), entity: 'tool-job:paused-1', presented_fence: '6', idempotency_key: 'paused-6' });
    // Released, not outcome_unknown: nothing was sent, the retry is safe.
    expect(run.pausedRecord).toBeNull();
  });
});
