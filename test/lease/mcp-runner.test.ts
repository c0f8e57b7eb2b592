/**
 * `ctx.mcp(client)` in real workers (runWorker, heartbeat thread, a SQLite
 * job store on a temp file) against the real MCP server of
 * helpers/mcp-server.ts. W1's call leaves while its lease is fine, hangs on
 * the wire, and lands after W2 took the job over: the fencing check refuses
 * it, W1 loses the lease, and W1's result is never stored.
 */
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { LeaseLostError } from '../../src/lease/errors.js';
import type { McpClientLike } from '../../src/lease/mcp.js';
import { runWorker } from '../../src/lease/runner/run-worker.js';
import type { RunWorkerOptions } from '../../src/lease/runner/options.js';
import type { LeaseWorker } from '../../src/lease/runner/types.js';
import type { JobStore } from '../../src/lease/types.js';
import { connectClient, startTicketServer, type TicketServer } from './helpers/mcp-server.js';
import { TS_EXEC_ARGV } from './helpers/node.js';
import { sqliteDatabase, type TestDatabase } from './helpers/stores.js';

function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, opened };
}

describe('ctx.mcp in real workers', () => {
  let db: TestDatabase;
  let store: JobStore;
  let server: TicketServer;
  let client: Client;
  const workers: LeaseWorker[] = [];

  beforeAll(async () => {
    db = await sqliteDatabase();
    store = await db.open();
    server = await startTicketServer();
    client = await connectClient(server.url);
  });
  afterEach(async () => {
    server.fencing = true;
    await Promise.all(workers.splice(0).map((w) => w.stop({ release: true })));
  });
  afterAll(async () => {
    await client?.close();
    await server?.close();
    await db?.dispose();
  });

  async function start(options: Pick<RunWorkerOptions, 'handlers' | 'workerId'>) {
    const worker = await runWorker({
      store,
      // Long enough that a stalled disk or a stolen CPU does not end a lease
      // mid-test (a re-claim would raise the fence the tests check); no test
      // here waits for a lease to run out, they expire it (expireLease).
      leaseMs: 5_000,
      heartbeatMs: 300,
      maxMissedHeartbeats: 3,
      jitterMs: 50,
      pollIntervalMs: 25,
      threadExecArgv: TS_EXEC_ARGV,
      ...options,
    });
    workers.push(worker);
    return worker;
  }

  /** W1's client: the call leaves (onTheWire), then waits on the wire until `land`, and cannot be recalled. */
  function slowWire(onTheWire: () => void, land: Promise<void>): McpClientLike {
    return {
      async callTool(params, schema, options) {
        onTheWire();
        await land;
        return client.callTool(params, schema, { ...options, signal: undefined });
      },
    };
  }

  async function scenario(kind: string) {
    const { job } = await store.enqueue({ kind, idempotencyKey: `${kind}-1`, payload: { title: 'Printer on fire' } });
    const onTheWire = gate();
    const land = gate();
    let w1Error: unknown;
    const w1 = await start({
      workerId: 'W1',
      handlers: {
        [kind]: async (ctx) => {
          try {
            return await ctx.mcp(slowWire(onTheWire.open, land.opened)).callTool({ name: 'create_ticket', arguments: ctx.job.payload as { title: string } });
          } catch (err) {
            w1Error = err;
            throw err;
          }
        },
      },
    });
    await onTheWire.opened;
    await db.expireLease(job.id);
    const w2 = await start({
      workerId: 'W2',
      handlers: { [kind]: async (ctx) => ctx.mcp(client).callTool({ name: 'create_ticket', arguments: ctx.job.payload as { title: string } }) },
    });
    await w2.events.waitFor('result_committed', (e) => e.jobId === job.id);
    const rejected = w1.events.waitFor('result_rejected', (e) => e.jobId === job.id && e.fencingToken === 1);
    land.open();
    await rejected;
    return { job, w1Error, tickets: server.tickets.filter((t) => t.key === `${job.jobKey}:mcp:create_ticket`) };
  }

  test("W1's late call is refused stale-fence: lease lost, one ticket (W2's), the job holds W2's result", async () => {
    const { job, w1Error, tickets } = await scenario('ticket');
    expect(w1Error).toBeInstanceOf(LeaseLostError);
    expect(tickets).toEqual([expect.objectContaining({ fence: '2' })]);
    expect(server.refusals).toContainEqual(expect.objectContaining({ entity: job.jobKey, presented: 1, current: 2, key: `${job.jobKey}:mcp:create_ticket` }));
    expect(await store.get(job.id)).toMatchObject({ state: 'succeeded', fencingToken: 2, result: { structuredContent: { id: expect.any(String) } } });
  });

  test('negative control: with the fencing check off, the late call lands and the tool runs twice', async () => {
    server.fencing = false;
    const { job, tickets } = await scenario('ticket-unfenced');
    expect(tickets.map((t) => t.fence).sort()).toEqual(['1', '2']);
    // The job store still refuses W1's commit (the database's own check), but the duplicate ticket exists.
    expect(await store.get(job.id)).toMatchObject({ state: 'succeeded', fencingToken: 2 });
  });
});
