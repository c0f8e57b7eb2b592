// worker.ts: a worker that pays through the gateway (docs/lease.md, "Example:
// a worker that pays through the gateway"). test/examples/worker.test.ts type-checks this
// file and runs it against a real gateway, the demo upstream and SQLite.
//   FENCEGATE_URL  the gateway (default http://127.0.0.1:8080)
//   DATABASE_URL   a PostgreSQL job database, or JOBS_DB a SQLite file (default ./jobs.db)
import { hostname } from 'node:os';
import { z } from 'zod';
import { JobError, openJobStore, runWorker, type JobHandler } from 'fencegate/lease';

const GATEWAY = process.env.FENCEGATE_URL ?? 'http://127.0.0.1:8080';
const store = await openJobStore(process.env.DATABASE_URL ? { postgres: process.env.DATABASE_URL } : { sqlite: process.env.JOBS_DB ?? './jobs.db' });

// The payload's schema, and its type from the schema: one definition.
const Payment = z.object({ orderId: z.string(), amount: z.number().int().positive(), currency: z.string(), customer: z.string() });
type Payment = z.infer<typeof Payment>;

// Somewhere else (an API handler), once per order: a second enqueue of the same key is a no-op.
await store.enqueue({
  kind: 'payment',
  idempotencyKey: 'order-8812',
  payload: { orderId: 'order-8812', amount: 1200, currency: 'eur', customer: 'cus_91' } satisfies Payment,
  maxAttempts: 5,
  deadlineMs: 15 * 60_000,
});

// 4xx answers that a retry cannot change (a declined card, a bad request):
// the job fails at once. 408, 409 and 429 may pass; 5xx and timeouts are retried.
const RETRYABLE_4XX = new Set([408, 409, 425, 429]);
async function refuseFor(res: Response, what: string): Promise<void> {
  if (res.ok) return;
  const text = (await res.text()).slice(0, 200);
  if (res.status >= 400 && res.status < 500 && !RETRYABLE_4XX.has(res.status)) {
    throw new JobError(res.status === 402 ? 'card_declined' : `${what}_refused`, `${what}: ${res.status} ${text}`, { retryable: false });
  }
  throw new Error(`${what}: the provider answered ${res.status}`); // retried after a backoff
}

const pay: JobHandler<Payment, { charge: string; receipt: string; replayed: boolean }> = {
  schema: Payment, // a payload that does not parse fails the job at once, never retried
  async run({ job, fencedFetch, signal }) {
    const charged = await fencedFetch(`${GATEWAY}/payments/charges`, {
      step: 'charge', // Idempotency-Key: tool-job:<storeId>:<id>:charge, the same on every attempt
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ amount: job.payload.amount, currency: job.payload.currency, customer: job.payload.customer }),
      timeoutMs: 10_000, // past it: OutcomeUnknownError, retried with the same key
    });
    await refuseFor(charged, 'charge');
    const charge = (await charged.json()) as { id: string };
    // `Idempotent-Replayed: true` means an earlier attempt already paid: same answer, no second charge.
    const replayed = charged.headers.get('idempotent-replayed') === 'true';

    signal.throwIfAborted(); // lost the lease meanwhile? then do not start the next step
    const receipted = await fencedFetch(`${GATEWAY}/payments/receipts`, {
      step: 'receipt',
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ charge: charge.id, orderId: job.payload.orderId }),
      timeoutMs: 10_000,
    });
    await refuseFor(receipted, 'receipt');
    const receipt = (await receipted.json()) as { id: string };
    return { charge: charge.id, receipt: receipt.id, replayed };
  },
};

const worker = await runWorker({
  store,
  workerId: `billing-${hostname()}-${process.pid}`,
  leaseMs: 30_000,
  heartbeatMs: 5_000,
  maxMissedHeartbeats: 3,
  jitterMs: 1_000,
  kinds: { payment: { maxRunMs: 120_000 } },
  handlers: { payment: pay },
});

worker.events.onAny((e) => console.log(JSON.stringify(e))); // ids, tokens, hashes; never payloads
worker.events.on('heartbeat_lost', (e) => console.warn(`lost job ${e.jobId} (fence ${e.fencingToken}): ${e.cause}`));

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    void worker.stop({ timeoutMs: 20_000 }).then(() => store.close());
  });
}
