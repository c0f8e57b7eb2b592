/**
 * `ctx.mcp` end to end through the real gateway's `mcp` route (started as
 * `fencegate serve` starts it, on loopback) in front of the real MCP server
 * of helpers/mcp-server.ts, whose own test-only fencing check is OFF: here
 * the gateway alone reads `_meta` and refuses the stale owner.
 */
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { z } from 'zod';
import { dispatchToolCalls, toolKinds, type ToolsInput } from '../../src/lease/dispatch.js';
import { LeaseLostError } from '../../src/lease/errors.js';
import type { McpClientLike } from '../../src/lease/mcp.js';
import { runWorker } from '../../src/lease/runner/run-worker.js';
import type { RunWorkerOptions } from '../../src/lease/runner/options.js';
import type { JobContext, LeaseWorker } from '../../src/lease/runner/types.js';
import type { JobStore } from '../../src/lease/types.js';
import { rejectionRows, startTestGateway, until, type TestGateway } from '../helpers/gateway.js';
import { connectClient, startTicketServer, type TicketServer } from './helpers/mcp-server.js';
import { TS_EXEC_ARGV } from './helpers/node.js';
import { sqliteDatabase, type TestDatabase } from './helpers/stores.js';

function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, opened };
}

describe('fencedMcp through the gateway mcp route', () => {
  let db: TestDatabase;
  let store: JobStore;
  let server: TicketServer;
  let gateway: TestGateway;
  let client: Client;
  /** Negative control: the same route with the checks switched off for create_ticket. */
  let unchecked: TestGateway;
  let uncheckedClient: Client;
  /** docs/mcp.md's route, as written there: `refund_payment` reads its entity from `/arguments/invoice_id`. */
  let docs: TestGateway;
  let docsClient: Client;
  const workers: LeaseWorker[] = [];
  const HEARTBEAT = { heartbeatMs: 300, maxMissedHeartbeats: 3, jitterMs: 50 };
  const refund = { schema: z.object({ invoice_id: z.string(), amount: z.number() }), leaseMs: 5_000, maxRunMs: 30_000, maxAttempts: 1 };

  beforeAll(async () => {
    db = await sqliteDatabase();
    store = await db.open();
    server = await startTicketServer();
    server.fencing = false;
    const route = (tools: Record<string, unknown>) => ({
      name: 'tickets',
      protocol: 'mcp',
      match: { path: '/mcp' },
      upstream: new URL(server.url).origin,
      tools,
    });
    gateway = await startTestGateway({ routes: [route({ search_tickets: { readOnly: true } })] });
    client = await connectClient(`${gateway.url}/mcp`);
    unchecked = await startTestGateway({ routes: [route({ search_tickets: { readOnly: true }, create_ticket: { fence: 'off', idempotency: 'off' } })] });
    uncheckedClient = await connectClient(`${unchecked.url}/mcp`);
    docs = await startTestGateway({
      routes: [
        {
          name: 'tickets',
          protocol: 'mcp',
          match: { path: '/mcp' },
          upstream: new URL(server.url).origin,
          fence: 'required',
          idempotency: 'required',
          mode: 'serial',
          tools: {
            refund_payment: { entity: { json: '/arguments/invoice_id' }, timeoutMs: 30000 },
            search_tickets: { readOnly: true },
            '*': { retention: '7d' },
          },
        },
      ],
    });
    docsClient = await connectClient(`${docs.url}/mcp`);
  });
  afterEach(async () => {
    await Promise.all(workers.splice(0).map((w) => w.stop({ release: true })));
  });
  afterAll(async () => {
    await client?.close();
    await uncheckedClient?.close();
    await docsClient?.close();
    await docs?.close();
    await gateway?.close();
    await unchecked?.close();
    await server?.close();
    await db?.dispose();
  });

  async function start(options: Pick<RunWorkerOptions, 'handlers' | 'workerId' | 'kinds' | 'concurrency'>) {
    // Long enough that a stalled disk or a stolen CPU does not end a lease
    // mid-test (a re-claim would raise the fence the tests check); no test
    // here waits for a lease to run out, they expire it (expireLease).
    const worker = await runWorker({ store, leaseMs: 5_000, ...HEARTBEAT, pollIntervalMs: 25, threadExecArgv: TS_EXEC_ARGV, ...options });
    workers.push(worker);
    return worker;
  }

  /** W1's call leaves, hangs on the wire until W2 has committed, then lands late. */
  async function scenario(kind: string, via: Client) {
    const { job } = await store.enqueue({ kind, idempotencyKey: `${kind}-1`, payload: { title: `ticket for ${kind}` } });
    const onTheWire = gate();
    const land = gate();
    let w1Error: unknown;
    const slow: McpClientLike = {
      async callTool(params, schema, options) {
        onTheWire.open();
        await land.opened;
        return via.callTool(params, schema, { ...options, signal: undefined });
      },
    };
    const create = (c: McpClientLike) => async (ctx: JobContext) =>
      ctx.mcp(c).callTool({ name: 'create_ticket', arguments: ctx.job.payload as { title: string } });
    const w1 = await start({
      workerId: 'W1',
      handlers: {
        [kind]: async (ctx) => {
          try {
            return await create(slow)(ctx);
          } catch (err) {
            w1Error = err;
            throw err;
          }
        },
      },
    });
    await onTheWire.opened;
    await db.expireLease(job.id);
    const w2 = await start({ workerId: 'W2', handlers: { [kind]: create(via) } });
    await w2.events.waitFor('result_committed', (e) => e.jobId === job.id);
    const rejected = w1.events.waitFor('result_rejected', (e) => e.jobId === job.id && e.fencingToken === 1);
    land.open();
    await rejected;
    return { job, w1Error, tickets: server.tickets.filter((t) => t.key === `${job.jobKey}:mcp:create_ticket`) };
  }

  test("the gateway refuses W1's late tools/call (stale-fence, in the audit log); one ticket, W2's result stored", async () => {
    const { job, w1Error, tickets } = await scenario('ticket', client);
    expect(w1Error).toBeInstanceOf(LeaseLostError);
    expect(tickets).toEqual([expect.objectContaining({ fence: '2' })]);
    expect(rejectionRows(gateway.sqlite, 'stale-fence')).toEqual([
      expect.objectContaining({ entity: job.jobKey, presented_fence: 1, current_fence: 2, idempotency_key: `${job.jobKey}:mcp:create_ticket` }),
    ]);
    expect(await store.get(job.id)).toMatchObject({ state: 'succeeded', fencingToken: 2 });

    // A read-only tool passes undecided, with no fence at all.
    const found = await client.callTool({ name: 'search_tickets', arguments: { q: 'ticket for ticket' } });
    expect(found.content).toEqual([{ type: 'text', text: JSON.stringify([tickets[0]!.id]) }]);
  });

  test('negative control: with fence and idempotency off for create_ticket, the late call reaches the tool: two tickets', async () => {
    const { tickets } = await scenario('ticket-unchecked', uncheckedClient);
    expect(tickets.map((t) => t.fence).sort()).toEqual(['1', '2']);
    expect(rejectionRows(unchecked.sqlite, 'stale-fence')).toEqual([]);
  });

  /**
   * Through docs/mcp.md's route: dispatches one refund with these tools, runs
   * it through ctx.mcp, and reports how it ended. With the tool's `entity`
   * pointed where the route reads it, the job is fenced on that invoice.
   */
  async function refundThrough(tools: ToolsInput, runId: string) {
    const [answer] = await dispatchToolCalls(
      store,
      [{ type: 'tool_use', id: 'toolu_1', name: 'refund_payment', input: { invoice_id: `inv-${runId}`, amount: 1200 } }],
      { tools, runId, heartbeat: HEARTBEAT },
    );
    const jobId = (answer as { jobId: number }).jobId;
    let error: unknown;
    await start({
      workerId: `W-${runId}`,
      kinds: toolKinds(tools),
      handlers: {
        refund_payment: async (ctx) => {
          try {
            const res = await ctx.mcp(docsClient).callTool({ name: 'refund_payment', arguments: ctx.job.payload as Record<string, unknown> });
            return (res as { structuredContent?: unknown }).structuredContent;
          } catch (err) {
            error = err;
            throw err;
          }
        },
      },
    });
    const job = await until(async () => {
      const j = await store.get(jobId);
      return j && (j.state === 'succeeded' || j.state === 'failed') ? j : null;
    }, `job ${jobId} to finish`);
    return { job, error, arrivals: server.arrivals.filter((a) => a.tool === 'refund_payment' && a.arguments.invoice_id === `inv-${runId}`) };
  }

  test("with the tool's entity from the same pointer, the call is fenced on the invoice and reaches the tool once", async () => {
    const { job, error, arrivals } = await refundThrough({ refund_payment: { ...refund, entity: { json: '/arguments/invoice_id' } } }, 'from-args');
    expect(error).toBeUndefined();
    expect(job).toMatchObject({ state: 'succeeded', fenceKey: 'inv-from-args', result: { refunded: 'inv-from-args' } });
    expect(arrivals).toEqual([
      expect.objectContaining({
        meta: expect.objectContaining({ 'io.fencegate/entity': 'inv-from-args', 'io.fencegate/idempotency-key': `${job.jobKey}:mcp:refund_payment` }),
      }),
    ]);
  });

  test("control: with the job's own entity (no entity in the dispatch entry) the route refuses the call invalid-entity and the tool is not called", async () => {
    const { job, error, arrivals } = await refundThrough({ refund_payment: refund }, 'own-entity');
    expect(error).toMatchObject({ name: 'McpRefusalError', code: 'invalid-entity' });
    expect(job.fenceKey).toBe(job.jobKey);
    expect(arrivals).toEqual([]);
  });

  /**
   * Two refunds of one invoice, dispatched by two runs and running at once
   * (one worker, concurrency 2): the jobs share the invoice's fence (docs/mcp.md,
   * "The entity"). On this store claims are serialised, so the second claim
   * draws a token above the first one's; the job claimed first then calls
   * last, with the lower token.
   */
  async function twoRefundsOfOneInvoice(maxAttempts: number) {
    const invoice = `inv-shared-${maxAttempts}`;
    const tools: ToolsInput = { refund_payment: { ...refund, maxAttempts, entity: { json: '/arguments/invoice_id' } } };
    const jobIds: number[] = [];
    for (const [runId, amount] of [
      [`shared-${maxAttempts}-a`, 100],
      [`shared-${maxAttempts}-b`, 200],
    ] as const) {
      const [answer] = await dispatchToolCalls(store, [{ name: 'refund_payment', arguments: { invoice_id: invoice, amount } }], {
        tools,
        runId,
        heartbeat: HEARTBEAT,
      });
      jobIds.push((answer as { jobId: number }).jobId);
    }
    const gates = new Map([
      [100, gate()],
      [200, gate()],
    ]);
    const started: { amount: number; token: number }[] = [];
    const errors: unknown[] = [];
    await start({
      workerId: `W-shared-${maxAttempts}`,
      kinds: toolKinds(tools),
      concurrency: 2,
      handlers: {
        refund_payment: async (ctx) => {
          const args = ctx.job.payload as { invoice_id: string; amount: number };
          started.push({ amount: args.amount, token: ctx.job.fencingToken });
          await gates.get(args.amount)!.opened;
          try {
            return await ctx.mcp(docsClient).callTool({ name: 'refund_payment', arguments: args });
          } catch (err) {
            errors.push(err);
            throw err;
          }
        },
      },
    });
    const settled = (id: number) =>
      until(async () => {
        const j = await store.get(id);
        return j && (j.state === 'succeeded' || j.state === 'failed') ? j : null;
      }, `job ${id} to finish`);
    await until(() => started.length === 2, 'both refunds to be running');
    const firstStarted = [...started];
    // The job claimed second (the higher token) calls first, then the other one.
    const [low, high] = [...firstStarted].sort((x, y) => x.token - y.token);
    const byAmount = (amount: number) => jobIds[amount === 100 ? 0 : 1]!;
    gates.get(high!.amount)!.open();
    const highJob = await settled(byAmount(high!.amount));
    gates.get(low!.amount)!.open();
    const lowJob = await settled(byAmount(low!.amount));
    const arrivals = server.arrivals.filter((a) => a.tool === 'refund_payment' && a.arguments.invoice_id === invoice);
    return { invoice, firstStarted, low: low!, high: high!, highJob, lowJob, errors, arrivals, started };
  }

  test('two refunds of one invoice at once, maxAttempts 1: the one claimed first calls after the other with the lower token, is refused stale-fence and fails without refunding', async () => {
    const r = await twoRefundsOfOneInvoice(1);
    // Never the same token on this store: the later claim is above the earlier one.
    expect(r.firstStarted.map((s) => s.token).sort()).toEqual([1, 2]);
    expect(r.highJob).toMatchObject({ state: 'succeeded', fenceKey: r.invoice });
    expect(r.lowJob).toMatchObject({ state: 'failed', fenceKey: r.invoice });
    expect(r.errors).toEqual([expect.any(LeaseLostError)]);
    expect(rejectionRows(docs.sqlite, 'stale-fence')).toContainEqual(expect.objectContaining({ entity: r.invoice, presented_fence: 1, current_fence: 2 }));
    expect(r.arrivals.map((a) => a.arguments.amount)).toEqual([r.high.amount]);
  });

  test('the same with maxAttempts 2: the refused job runs again with a token above both and refunds; both refunds reach the tool, once each', async () => {
    const r = await twoRefundsOfOneInvoice(2);
    expect(r.highJob).toMatchObject({ state: 'succeeded' });
    expect(r.lowJob).toMatchObject({ state: 'succeeded', fencingToken: 3 });
    expect(r.started.map((s) => [s.amount, s.token])).toContainEqual([r.low.amount, 3]);
    expect(r.arrivals.map((a) => a.arguments.amount)).toEqual([r.high.amount, r.low.amount]);
  });
});
