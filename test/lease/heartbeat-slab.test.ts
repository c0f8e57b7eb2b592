/**
 * How the runner hands leases to its heartbeat thread (DESIGN §6): through
 * a slab of shared memory the thread reads on its deadline check, not a
 * message per lease, and an ended cell is dropped by the thread without an
 * unwatch message. A real thread on a real SQLite store.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { LeaseStatus, Pulse } from '../../src/lease/heartbeat/cell.js';
import { HeartbeatThread } from '../../src/lease/heartbeat/client.js';
import { leaseKey, type FromThread } from '../../src/lease/heartbeat/protocol.js';
import { LeaseSlab, SLAB_SLOTS } from '../../src/lease/heartbeat/slab.js';
import { createSqliteJobStore } from '../../src/lease/sqlite/store.js';
import { monotonicMs } from '../../src/lease/timing.js';
import type { JobStore, Lease } from '../../src/lease/types.js';
import { TS_EXEC_ARGV } from './helpers/node.js';

describe('lease slab', () => {
  test('a published slot reads back what was written; slots are handed out once, in order, until the slab is full', () => {
    const writer = new LeaseSlab();
    const reader = new LeaseSlab(writer.buffer);
    expect(reader.published()).toBe(0);
    const a = writer.publish({ id: 41, fencingToken: 7, leaseMs: 30_000 }, 1_000, 123_456);
    const b = writer.publish({ id: 2 ** 40, fencingToken: 1, leaseMs: 5_000 }, 2_000, 99);
    expect(reader.published()).toBe(2);
    const ra = reader.read(0);
    expect(ra).toMatchObject({ id: 41, fencingToken: 7, leaseMs: 30_000, maxStallMs: 1_000 });
    expect(ra.cell.confirmedUntil).toBe(123_456);
    expect(reader.read(1)).toMatchObject({ id: 2 ** 40, fencingToken: 1, leaseMs: 5_000, maxStallMs: 2_000 });

    // Each slot its own cell: ending one leaves the other alone, on both sides.
    ra.cell.end(LeaseStatus.Lost, 'zero_rows');
    expect(a.status).toBe(LeaseStatus.Lost);
    expect(a.cause).toBe('zero_rows');
    expect(b.status).toBe(LeaseStatus.Ok);
    expect(reader.read(1).cell.status).toBe(LeaseStatus.Ok);

    for (let i = 2; i < SLAB_SLOTS; i++) writer.publish({ id: i, fencingToken: 1, leaseMs: 1 }, 1, 0);
    expect(writer.full).toBe(true);
    expect(reader.published()).toBe(SLAB_SLOTS);
  });
});

describe('heartbeat thread fed through the slab', () => {
  let dir: string;
  let store: JobStore;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'fg-slab-'));
    store = await createSqliteJobStore({ path: join(dir, 'jobs.db') });
  });
  afterAll(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  async function claimOne(kind: string): Promise<Lease> {
    await store.enqueue({ kind, idempotencyKey: `${kind}-1`, payload: {} });
    const { lease } = await store.claim({ workerId: 'slab-test', kinds: [kind], leaseMs: 3_000 });
    if (!lease) throw new Error('nothing claimed');
    return lease;
  }

  test('a live lease is picked up and extended without a message; an ended one is never extended and needs no unwatch', async () => {
    const pulse = new Pulse();
    const ticker = setInterval(() => pulse.tick(), 20);
    const messages: FromThread[] = [];
    const thread = await HeartbeatThread.start(
      { store: store.descriptor!, pulse: pulse.buffer, heartbeatMs: 200, jitterMs: 0, maxMissedHeartbeats: 3, timeoutMs: 1_000 },
      { execArgv: TS_EXEC_ARGV, onMessage: (m) => void messages.push(m), onCrash: () => {} },
    );
    try {
      const live = await claimOne('slab-live');
      const ended = await claimOne('slab-ended');
      const now = monotonicMs();
      const liveCell = thread.watch(live, 60_000, now + live.leaseMs);
      const endedCell = thread.watch(ended, 60_000, now + ended.leaseMs);
      // What the runner does when a job finishes: end the cell, then unwatch (no message for an ended cell).
      endedCell.end(LeaseStatus.Released);
      thread.unwatch(leaseKey(ended), endedCell);

      await new Promise((r) => setTimeout(r, 900));
      // The control: the live lease was picked up from the slab and extended (several beats).
      const oks = messages.filter((m) => m.type === 'ok' && m.key === leaseKey(live));
      expect(oks.length).toBeGreaterThanOrEqual(2);
      expect(liveCell.status).toBe(LeaseStatus.Ok);
      expect((await store.get(live.id))!.leaseUntil!.getTime()).toBeGreaterThan(live.leaseUntil.getTime());
      // The ended one: no report, and its row still has the claim's lease end.
      expect(messages.some((m) => 'key' in m && m.key === leaseKey(ended))).toBe(false);
      expect((await store.get(ended.id))!.leaseUntil!.getTime()).toBe(ended.leaseUntil.getTime());
      expect(endedCell.status).toBe(LeaseStatus.Released);
    } finally {
      clearInterval(ticker);
      await thread.stop();
    }
  });
});
