import { expect } from 'vitest';
import { command, paymentsRoute, startTestGateway, until } from '../helpers/gateway.js';
import { startPgTestGateway } from '../helpers/pg-gateway.js';
import { holdAdmission } from '../helpers/store-wrappers.js';
import { startUpstream } from '../helpers/upstream.js';
import type { GatewayStore } from '../../src/store/types.js';

/**
 * A gateway paused between its admission and its forward (DESIGN §3.5, §3.6):
 * the admission of fence 6 commits, its answer is held (a slow database
 * reply; a SIGSTOP, a GC or VM pause have the same effect) until the
 * record's lock and the entity's slot have expired in the database. Fence 7
 * is then admitted and forwarded for the same entity. When the held answer
 * arrives, the gateway must not send fence 6: the upstream would see 7, then 6.
 *
 * The paused request's route has a short lock (timeoutMs 300 + lockMarginMs
 * 300) so the expiry comes quickly; the test waits for it by reading the
 * database, not by a fixed sleep, and asserts order and counts, never
 * timings. Fence 7 goes through a second route to the same upstream, for
 * the same entity (fences and the serial slot are the entity's, not the
 * route's), with the default multi-second deadline: 300 ms to an upstream
 * in this process is not enough on a loaded box, and a 504 there would say
 * nothing about fence 6.
 */
export interface PausedReplicaRun {
  /** The paused request's answer. */
  paused: { status: number; body: any };
  /** Fences in the order the upstream received them. */
  upstreamFences: (string | null)[];
  /** The paused request's record after it ended (null: released). */
  pausedRecord: string | null;
}

type Backend = 'sqlite' | 'postgres';

const ENTITY = 'tool-job:paused-1';

export async function runPausedReplica(backend: Backend): Promise<PausedReplicaRun> {
  const upstream = await startUpstream();
  const route = paymentsRoute(upstream.url, { timeoutMs: 300, lockMarginMs: 300 });
  const newerRoute = paymentsRoute(upstream.url, { name: 'payments-newer', match: { path: '/newer/payments/*', methods: ['POST'] } });
  // Assigned in wrapStore (a callback): the cast keeps TypeScript from narrowing it to null.
  let held = null as ReturnType<typeof holdAdmission> | null;
  const wrapStore = (store: GatewayStore) => {
    held = holdAdmission(store, (i) => i.fence === 6n);
    return held.store;
  };
  const gw =
    backend === 'sqlite'
      ? await startTestGateway({ routes: [route, newerRoute], wrapStore })
      : await startPgTestGateway({ routes: [route, newerRoute], wrapStore });
  const real: GatewayStore = 'sqlite' in gw ? gw.sqlite : gw.store;
  const slotLive = async (): Promise<boolean> => (await real.getEntity(ENTITY))?.inflight != null;
  try {
    const pausedReq = command(gw.url, '/payments/charges', { fence: 6, entity: ENTITY, key: 'paused-6' });
    const admission = await held!.committed;
    expect(admission.outcome).toBe('forward');
    // The database's own clock says when the slot (and the record lock) expired.
    await until(async () => !(await slotLive()), 'the paused request slot to expire in the database');
    const newer = await command(gw.url, '/newer/payments/charges', { fence: 7, entity: ENTITY, key: 'newer-7' });
    expect(newer.status).toBe(201);
    held!.release();
    const res = await pausedReq;
    const text = await res.text();
    const body = text.startsWith('{') ? JSON.parse(text) : text;
    const records = await real.getRecords('paused-6');
    return { paused: { status: res.status, body }, upstreamFences: upstream.calls.map((c) => c.fence), pausedRecord: records[0]?.state ?? null };
  } finally {
    held?.release();
    await gw.close();
    await upstream.close();
  }
}
