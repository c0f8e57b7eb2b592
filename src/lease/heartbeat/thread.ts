/**
 * The heartbeat thread: extends the runner's leases on its own database
 * connection, so a blocked handler thread (a tight loop, a stuck native call,
 * a long GC) cannot silence it. It extends a lease only while the handler's
 * thread shows it is alive (its `Pulse` moves): heartbeats prove that the
 * worker is making progress, not merely that a timer still fires. The
 * runner publishes its leases in a shared slab (./slab.ts), which this thread
 * reads on every deadline check, so a lease reaches it even while the
 * handler's thread is blocked, and a job costs it no message.
 *
 * Outcomes, classified as DESIGN §6 asks:
 * - zero rows: the lease is lost (a newer owner, a cancel, or it expired);
 * - an error (database unreachable, timeout): ownership unknown once the
 *   lease cannot be confirmed for another interval or too many beats were
 *   missed; keep trying until the conservative deadline (the lease end as of
 *   the last success, measured from *before* that statement was sent), then lost.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { openJobStore } from '../open.js';
import { monotonicMs, nextHeartbeatDelay } from '../timing.js';
import type { JobStore, LeaseRef } from '../types.js';
import { LeaseStatus, Pulse, type LeaseCell } from './cell.js';
import { leaseKey, type FromThread, type ThreadInit, type ToThread } from './protocol.js';
import { LeaseSlab } from './slab.js';

const init = workerData as ThreadInit;
const port = parentPort!;
const post = (message: FromThread) => port.postMessage(message);

interface Watched {
  key: string;
  lease: LeaseRef;
  cell: LeaseCell;
  maxStallMs: number;
  failures: number;
  timer: NodeJS.Timeout | undefined;
}

const watched = new Map<string, Watched>();
const pulse = new Pulse(init.pulse);
let lastPulse = pulse.read();
let lastPulseMovedAt = monotonicMs();

/** How long the handler's thread has not ticked, as far as this thread can tell. */
function stalledForMs(): number {
  const now = monotonicMs();
  const count = pulse.read();
  if (count !== lastPulse) {
    lastPulse = count;
    lastPulseMovedAt = now;
  }
  return now - lastPulseMovedAt;
}

function drop(w: Watched): void {
  clearTimeout(w.timer);
  watched.delete(w.key);
}

function schedule(w: Watched, delayMs: number): void {
  clearTimeout(w.timer);
  w.timer = setTimeout(() => void beat(w, store), delayMs);
}

async function beat(w: Watched, store: JobStore): Promise<void> {
  if (watched.get(w.key) !== w) return;
  const status = w.cell.status;
  if (status !== LeaseStatus.Ok && status !== LeaseStatus.Unknown) return drop(w);

  const stalled = stalledForMs();
  if (stalled > w.maxStallMs) {
    // The handler's thread is not making progress: let the lease run out so
    // that another worker can take the job. Never extend on its behalf.
    if (w.cell.end(LeaseStatus.Stalled, 'stalled')) post({ type: 'stalled', key: w.key, stalledForMs: stalled });
    return drop(w);
  }

  const sentAt = monotonicMs();
  let result: Awaited<ReturnType<JobStore['extend']>> | undefined;
  let error: unknown;
  try {
    result = await store.extend(w.lease);
  } catch (err) {
    error = err;
  }
  if (watched.get(w.key) !== w) return; // unwatched (or declared lost) meanwhile

  if (result?.ok) {
    // Conservative: the database set lease_until = its now + leaseMs, and its
    // now was no earlier than our sentAt.
    w.cell.confirmedUntil = sentAt + w.lease.leaseMs;
    w.failures = 0;
    w.cell.transition(LeaseStatus.Unknown, LeaseStatus.Ok);
    post({ type: 'ok', key: w.key, leaseUntil: result.leaseUntil, latencyMs: monotonicMs() - sentAt });
    return schedule(w, nextHeartbeatDelay(init.heartbeatMs, init.jitterMs, Math.random()));
  }
  if (result && !result.ok) {
    if (w.cell.end(LeaseStatus.Lost, 'zero_rows')) post({ type: 'lost', key: w.key, cause: 'zero_rows' });
    return drop(w);
  }

  w.failures += 1;
  post({ type: 'failed', key: w.key, error: error instanceof Error ? error.message : String(error), consecutive: w.failures });
  if (w.failures >= init.maxMissedHeartbeats) markUnknown(w);
  // Retry sooner than the normal interval: the deadline is getting closer.
  schedule(w, init.heartbeatMs / 2);
}

/** No new external action may start: the lease cannot be confirmed for another interval. */
function markUnknown(w: Watched): void {
  if (w.cell.transition(LeaseStatus.Ok, LeaseStatus.Unknown)) {
    post({ type: 'unknown', key: w.key, confirmedForMs: w.cell.confirmedUntil - monotonicMs(), consecutive: w.failures });
  }
}

/** The slabs the runner publishes its leases in (./slab.ts), each with the next slot to read. */
const slabs: { slab: LeaseSlab; ownerId: string; next: number }[] = [];

/** Starts watching the leases published since the last look. */
function pickUp(): void {
  for (const s of slabs) {
    const published = s.slab.published();
    for (; s.next < published; s.next++) {
      const e = s.slab.read(s.next);
      const status = e.cell.status;
      // Ended before this thread saw it (a short job): nothing to extend.
      if (status !== LeaseStatus.Ok && status !== LeaseStatus.Unknown) continue;
      const w: Watched = {
        key: leaseKey(e),
        lease: { id: e.id, ownerId: s.ownerId, fencingToken: e.fencingToken, leaseMs: e.leaseMs },
        cell: e.cell,
        maxStallMs: e.maxStallMs,
        failures: 0,
        timer: undefined,
      };
      watched.set(w.key, w);
      // The first beat one interval after the claim (the cell's confirmed end
      // is the claim's send time plus the lease), as if told at the claim.
      const sinceClaim = monotonicMs() - (e.cell.confirmedUntil - e.leaseMs);
      schedule(w, Math.max(0, nextHeartbeatDelay(init.heartbeatMs, init.jitterMs, Math.random()) - sinceClaim));
    }
  }
}

/**
 * Runs every few ms, whatever the extends are doing (one may hang on a lock
 * or a dead connection): ownership becomes unknown when less than one
 * heartbeat interval is confirmed, and at the conservative deadline the
 * lease is given up, since it may belong to someone else from then on.
 */
function checkDeadlines(): void {
  pickUp();
  stalledForMs();
  const now = monotonicMs();
  for (const w of watched.values()) {
    // Ended by the runner (released, or lost/stalled as seen from either
    // side): nothing more to do for it. The runner unwatches an ended cell
    // without a message (client.ts), so this is where its entry goes.
    const status = w.cell.status;
    if (status !== LeaseStatus.Ok && status !== LeaseStatus.Unknown) {
      drop(w);
      continue;
    }
    const left = w.cell.confirmedUntil - now;
    if (left > init.heartbeatMs) continue;
    if (left > 0) {
      markUnknown(w);
      continue;
    }
    if (w.cell.end(LeaseStatus.Lost, 'unconfirmed')) post({ type: 'lost', key: w.key, cause: 'unconfirmed' });
    drop(w);
  }
}

let store: JobStore;
try {
  store = await openJobStore(init.store, { migrate: false, statementTimeoutMs: init.timeoutMs });
} catch (err) {
  post({ type: 'fatal', error: err instanceof Error ? err.message : String(err) });
  process.exit(1);
}

let stopping = false;
const watchdog = setInterval(checkDeadlines, Math.max(10, Math.min(50, init.heartbeatMs / 4)));

port.on('message', (message: ToThread) => {
  switch (message.type) {
    case 'slab': {
      if (stopping) break;
      // Every earlier slab is complete now: take what is left in it, then only the new one grows.
      pickUp();
      slabs.length = 0;
      slabs.push({ slab: new LeaseSlab(message.buffer), ownerId: message.ownerId, next: 0 });
      pickUp();
      break;
    }
    case 'unwatch': {
      pickUp();
      const w = watched.get(message.key);
      if (w) drop(w);
      break;
    }
    case 'stop': {
      stopping = true;
      clearInterval(watchdog);
      for (const w of [...watched.values()]) drop(w);
      void store.close().finally(() => {
        post({ type: 'stopped' });
        port.close();
      });
      break;
    }
  }
});

post({ type: 'ready' });
