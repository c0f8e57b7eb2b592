/**
 * The attempt lifecycle (src/lease/runner/attempt.ts) driven through its
 * context with plain objects: no database, no heartbeat thread. The store
 * answers what each test says; the "heartbeat thread" is a test writing the
 * lease cell, as the real one does through shared memory (DESIGN §6).
 */
import { afterEach, describe, expect, test, vi } from 'vitest';
import { JobError, LeaseLostError } from '../../src/lease/errors.js';
import type { LeaseEvent } from '../../src/lease/events.js';
import { LeaseCell, LeaseStatus } from '../../src/lease/heartbeat/cell.js';
import { leaseKey } from '../../src/lease/heartbeat/protocol.js';
import { monotonicMs } from '../../src/lease/timing.js';
import type { ClaimResult, CompleteAndClaimResult, CompleteResult, FailResult, Lease } from '../../src/lease/types.js';
import type { Attempt, AttemptContext } from '../../src/lease/runner/attempt-types.js';
import { onHeartbeatReport, releaseAttempt, startAttempt } from '../../src/lease/runner/attempt.js';
import { classify } from '../../src/lease/runner/classify.js';
import type { JobContext } from '../../src/lease/runner/types.js';
import type { NextClaim } from '../../src/lease/runner/claim-lanes.js';

const HOUR = 3_600_000;

function lease(overrides: Partial<Lease> = {}): Lease {
  return {
    id: 7,
    kind: 'pay',
    ownerId: 'w1',
    fencingToken: 3,
    leaseUntil: new Date(Date.now() + HOUR),
    leaseMs: HOUR,
    attempt: 1,
    maxAttempts: 3,
    idempotencyKey: 'k',
    jobKey: 'tool-job:00000000000000000000000000000000:7',
    fenceKey: 'tool-job:00000000000000000000000000000000:7',
    payload: { amount: 1 },
    payloadSha256: 'sha',
    deadlineAt: null,
    previousOwnerId: null,
    ...overrides,
  };
}

type Run = (ctx: JobContext<unknown>) => unknown;

/** A context of plain objects that records what the lifecycle did. */
function harness(run: Run, options: { maxRunMs?: number; complete?: () => Promise<CompleteResult>; fail?: () => Promise<FailResult>; next?: NextClaim } = {}) {
  const events: LeaseEvent[] = [];
  const calls: string[] = [];
  let onFreed: () => void = () => {};
  const freed = new Promise<void>((resolve) => (onFreed = resolve));
  const ctx: AttemptContext = {
    workerId: 'w1',
    config: {
      kinds: { pay: { leaseMs: HOUR, maxRunMs: options.maxRunMs ?? HOUR, maxStallMs: HOUR } },
      handlers: { pay: { run } },
      heartbeatMs: 1_000,
      retry: { baseMs: 100, maxMs: 1_000 },
      fetch: undefined,
      fenceHeaders: undefined,
      fenceSigner: undefined,
    },
    store: {
      complete: async (_lease, result) => {
        calls.push(`complete ${JSON.stringify(result)}`);
        return options.complete ? options.complete() : { ok: true };
      },
      fail: async (_lease, error, o) => {
        calls.push(`fail ${error.code} retryable=${o.retryable}`);
        return options.fail ? options.fail() : { ok: true, state: 'queued', runAfter: new Date() };
      },
      release: async () => {
        calls.push('release');
        return { ok: true };
      },
    },
    heartbeats: {
      watch: (l, _maxStallMs, confirmedUntil) => {
        calls.push(`watch ${leaseKey(l)}`);
        const cell = new LeaseCell();
        cell.confirmedUntil = confirmedUntil;
        return cell;
      },
      unwatch: (key) => void calls.push(`unwatch ${key}`),
    },
    active: new Map<string, Attempt>(),
    emit: (event) => void events.push(event),
    freed: () => onFreed(),
    nextClaim: () => options.next,
  };
  const types = () => events.map((e) => e.type);
  return { ctx, events, calls, freed, types };
}

/** A handler that waits until the test lets it return. */
function gate<T>(value: T) {
  let open: () => void = () => {};
  const opened = new Promise<void>((resolve) => (open = resolve));
  let entered: () => void = () => {};
  const started = new Promise<void>((resolve) => (entered = resolve));
  let signal: AbortSignal | undefined;
  const run: Run = async (jc) => {
    signal = jc.signal;
    entered();
    await opened;
    return value;
  };
  return { run, open, started, signal: () => signal! };
}

afterEach(() => {
  vi.useRealTimers();
});

describe('attempt lifecycle with plain objects', () => {
  test('a returned value is committed through the store; the slot is freed once, the lease unwatched', async () => {
    const h = harness(async ({ job }) => ({ paid: job.payload }));
    const a = startAttempt(h.ctx, lease(), monotonicMs());
    expect(h.ctx.active.get(a.key)).toBe(a);
    await h.freed;
    expect(h.calls).toEqual([`watch ${a.key}`, `unwatch ${a.key}`, 'complete {"paid":{"amount":1}}']);
    expect(h.types()).toEqual(['job_claimed', 'result_committed']);
    expect(h.ctx.active.size).toBe(0);
    expect(a.cell.status).toBe(LeaseStatus.Released);
  });

  /** A next claim that answers `answer` and records what the attempt did with it; `taken` resolves on take. */
  function nextClaim(calls: string[], answer: () => Promise<CompleteAndClaimResult>, refills: boolean) {
    let onTaken: (claim: ClaimResult | undefined) => void = () => {};
    const taken = new Promise<ClaimResult | undefined>((resolve) => (onTaken = resolve));
    const next: NextClaim = {
      send: async (_lease, result) => {
        calls.push(`completeAndClaim ${JSON.stringify(result)}`);
        return answer();
      },
      take: (claim) => {
        calls.push(`take ${claim?.lease?.id ?? 'nothing'}`);
        onTaken(claim);
        return refills && claim?.lease != null;
      },
    };
    return { next, taken };
  }

  test('while the queue has work, the commit and the next claim go in one call; the next job takes the slot, no lane is woken', async () => {
    const calls: string[] = [];
    const n = nextClaim(calls, async () => ({ complete: { ok: true }, claim: { lease: lease({ id: 8 }), failed: [] } }), true);
    const h = harness(async () => 'done', { next: n.next });
    let freed = false;
    void h.freed.then(() => (freed = true));
    const a = startAttempt(h.ctx, lease(), monotonicMs());
    await n.taken;
    await Promise.resolve();
    expect(calls).toEqual(['completeAndClaim "done"', 'take 8']);
    expect(h.calls.some((c) => c.startsWith('complete '))).toBe(false);
    // The commit is reported before the next job's claim is handed over.
    expect(h.types()).toEqual(['job_claimed', 'result_committed']);
    expect(h.ctx.active.has(a.key)).toBe(false);
    expect(freed).toBe(false);
  });

  test('the combined call refuses the commit: result_rejected, nothing to take, the slot goes back to the lanes', async () => {
    const calls: string[] = [];
    const n = nextClaim(calls, async () => ({ complete: { ok: false, reason: 'lease_lost' }, claim: { lease: null, failed: [] } }), true);
    const h = harness(async () => 1, { next: n.next });
    startAttempt(h.ctx, lease(), monotonicMs());
    await h.freed;
    expect(calls).toEqual(['completeAndClaim 1', 'take nothing']);
    expect(h.calls.some((c) => c.startsWith('complete '))).toBe(false);
    expect(h.events.at(-1)).toMatchObject({ type: 'result_rejected', reason: 'lease_lost' });
  });

  test('the combined call fails: store_error, the claim is taken as nothing, and the slot is freed', async () => {
    const calls: string[] = [];
    const n = nextClaim(calls, async () => Promise.reject(new Error('connection reset')), true);
    const h = harness(async () => 1, { next: n.next });
    startAttempt(h.ctx, lease(), monotonicMs());
    await h.freed;
    expect(await n.taken).toBeUndefined();
    expect(h.events.at(-1)).toMatchObject({ type: 'result_rejected', reason: 'store_error', error: 'connection reset' });
    expect(h.ctx.active.size).toBe(0);
  });

  test('the lease was lost while the handler ran: the value is never offered to the store', async () => {
    const g = gate({ late: true });
    const h = harness(g.run);
    const a = startAttempt(h.ctx, lease(), monotonicMs());
    await g.started;
    // What the heartbeat thread does on zero rows: the cell, then its report.
    a.cell.end(LeaseStatus.Lost, 'zero_rows');
    onHeartbeatReport(h.ctx, { type: 'lost', key: a.key, cause: 'zero_rows' });
    expect(g.signal().aborted).toBe(true);
    expect(g.signal().reason).toBeInstanceOf(LeaseLostError);
    g.open();
    await h.freed;
    expect(h.calls.some((c) => c.startsWith('complete'))).toBe(false);
    expect(h.types()).toEqual(['job_claimed', 'heartbeat_lost', 'result_rejected']);
    expect(h.events.at(-1)).toMatchObject({ type: 'result_rejected', reason: 'lease_lost' });
  });

  test('a step after the lease was lost never runs, and nothing is committed', async () => {
    const action = vi.fn(async () => 'paid');
    const g = gate(null);
    const h = harness(async (jc) => {
      await g.run(jc);
      return jc.step('charge', action);
    });
    const a = startAttempt(h.ctx, lease(), monotonicMs());
    await g.started;
    // Lost before the step: no thread report yet, only the shared cell says so.
    a.cell.end(LeaseStatus.Lost, 'zero_rows');
    g.open();
    await h.freed;
    expect(action).not.toHaveBeenCalled();
    expect(h.calls.some((c) => c.startsWith('complete') || c.startsWith('fail'))).toBe(false);
    expect(h.events.at(-1)).toMatchObject({ type: 'result_rejected', reason: 'lease_lost' });
  });

  test('a thrown JobError fails the attempt with its code and retryability', async () => {
    const h = harness(
      () => {
        throw new JobError('card_declined', 'declined', { retryable: false });
      },
      { fail: async () => ({ ok: true, state: 'failed', reason: 'non_retryable' }) },
    );
    startAttempt(h.ctx, lease(), monotonicMs());
    await h.freed;
    expect(h.calls.at(-1)).toBe('fail card_declined retryable=false');
    expect(h.events.at(-1)).toMatchObject({ type: 'job_failed', errorCode: 'card_declined', terminal: true });
  });

  test('the store refuses the commit: result_rejected, never a retry', async () => {
    const h = harness(async () => 1, { complete: async () => ({ ok: false, reason: 'lease_lost' }) as CompleteResult });
    startAttempt(h.ctx, lease(), monotonicMs());
    await h.freed;
    expect(h.calls.filter((c) => c.startsWith('complete'))).toHaveLength(1);
    expect(h.events.at(-1)).toMatchObject({ type: 'result_rejected', reason: 'lease_lost' });
  });

  test('the store fails during the commit: store_error, and the slot is still freed', async () => {
    const h = harness(async () => 1, { complete: async () => Promise.reject(new Error('connection reset')) });
    startAttempt(h.ctx, lease(), monotonicMs());
    await h.freed;
    expect(h.events.at(-1)).toMatchObject({ type: 'result_rejected', reason: 'store_error', error: 'connection reset' });
    expect(h.ctx.active.size).toBe(0);
  });

  test('past maxRunMs the handler is aborted and the attempt failed; its later value is refused', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    const g = gate('too late');
    const h = harness(g.run, { maxRunMs: 50 });
    startAttempt(h.ctx, lease(), monotonicMs());
    await g.started;
    await vi.advanceTimersByTimeAsync(50);
    await h.freed;
    expect(g.signal().reason).toMatchObject({ code: 'stage_timeout' });
    expect(h.calls.at(-1)).toBe('fail stage_timeout retryable=true');
    g.open();
    await vi.waitFor(() => expect(h.events.at(-1)).toMatchObject({ type: 'result_rejected', reason: 'stage_timeout' }));
    expect(h.calls.some((c) => c.startsWith('complete'))).toBe(false);
  });

  test('a release aborts the handler and gives the job back; its later value is refused', async () => {
    const g = gate('after release');
    const h = harness(g.run);
    const a = startAttempt(h.ctx, lease(), monotonicMs());
    await g.started;
    await releaseAttempt(h.ctx, a);
    await h.freed;
    expect(h.calls.at(-1)).toBe('release');
    expect(g.signal().reason).toMatchObject({ code: 'worker_stopping' });
    g.open();
    await vi.waitFor(() => expect(h.events.at(-1)).toMatchObject({ type: 'result_rejected', reason: 'lease_lost' }));
    expect(h.calls.some((c) => c.startsWith('complete'))).toBe(false);
  });

  test('heartbeat reports move the confirmed lease end; a report for an ended attempt is ignored', async () => {
    const g = gate(null);
    const h = harness(g.run);
    const a = startAttempt(h.ctx, lease(), monotonicMs());
    const later = new Date(Date.now() + 2 * HOUR);
    onHeartbeatReport(h.ctx, { type: 'ok', key: a.key, leaseUntil: later, latencyMs: 1 });
    expect(a.leaseUntil).toBe(later);
    g.open();
    await h.freed;
    const count = h.events.length;
    onHeartbeatReport(h.ctx, { type: 'failed', key: a.key, error: 'x', consecutive: 1 });
    expect(h.events).toHaveLength(count);
  });
});

describe('classify', () => {
  test('maps errors to the stored code and retryability', () => {
    expect(classify(new JobError('x', 'm', { retryable: false }))).toMatchObject({ code: 'x', retryable: false });
    expect(classify(Object.assign(new Error('bad'), { name: 'ZodError' }))).toMatchObject({ code: 'invalid_payload', retryable: false });
    expect(classify('plain')).toEqual({ code: 'handler_error', retryable: true, message: 'plain' });
    expect(classify(new Error('y'.repeat(5_000))).message).toHaveLength(1_000);
  });
});
