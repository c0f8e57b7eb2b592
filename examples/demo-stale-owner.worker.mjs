#!/usr/bin/env node
// One worker of the stale-owner demo (examples/demo-stale-owner.mjs starts
// two of these). It is an ordinary fencegate/lease worker: it claims
// `payment` jobs, heartbeats, and pays through the gateway with fencedFetch.
//
//   node examples/demo-stale-owner.worker.mjs '{"workerId":"w1","store":{"sqlite":"jobs.db"},"gateway":"http://…"}'
//
// stdout: one JSON line per lease event and per gateway answer. stdin:
// "extend <job> <token>" / "complete <job> <token>" make this worker's own
// code try again on its own connection, as a worker that just woke up would.
import { createInterface } from 'node:readline';
import { Agent, fetch } from 'undici';
import { openJobStore, runWorker } from '../dist/lease/index.js';

const { workerId, store: descriptor, gateway } = JSON.parse(process.argv[2]);
const say = (m) => process.stdout.write(`${JSON.stringify(m)}\n`);
const LEASE = { leaseMs: 1_500, heartbeatMs: 250, maxMissedHeartbeats: 2, jitterMs: 100 };

// One connection per request, so the demo's "network" can hold each request on its own.
const agent = new Agent({ pipelining: 0 });
const store = await openJobStore(descriptor, { migrate: false, statementTimeoutMs: 2_000 });

const pay = async ({ job, fencedFetch }, step, path) => {
  const res = await fencedFetch(`${gateway}${path}`, {
    step,
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ amount: job.payload.amount }),
  });
  say({ type: 'answer', step, status: res.status });
  return res.json();
};

const worker = await runWorker({
  store,
  workerId,
  ...LEASE,
  pollIntervalMs: 100,
  fetch: (url, init) => fetch(url, { ...init, dispatcher: agent }),
  handlers: {
    // A card charge (the payment API takes idempotency keys) and a payout (that API takes none).
    payment: async (ctx) => {
      const [charge, payout] = await Promise.all([pay(ctx, 'charge', '/payments/charges'), pay(ctx, 'payout', '/payouts/send')]);
      return { worker: workerId, fence: ctx.job.fencingToken, charge: charge.id, payout: payout.id };
    },
  },
});
worker.events.onAny((e) =>
  say({ type: 'event', ev: e.type, job: e.jobId, token: e.fencingToken, cause: e.cause, reason: e.reason, previousOwner: e.previousOwnerId }),
);
say({ type: 'ready' });

for await (const line of createInterface({ input: process.stdin })) {
  const [command, id, token] = line.split(' ');
  const lease = { id: Number(id), ownerId: workerId, fencingToken: Number(token), leaseMs: LEASE.leaseMs };
  if (command === 'extend') say({ type: 'extend', ...(await store.extend(lease)) });
  if (command === 'complete') say({ type: 'complete', ...(await store.complete(lease, { worker: workerId, late: true })) });
}
await worker.stop({ release: true });
await store.close();
await agent.close();
