/**
 * dispatchToolCalls against a real SQLite job store on a temp file: the
 * allow-list, schema refusals, limits from config only, idempotent
 * re-dispatch, the three plan shapes, and stage chains.
 */
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { z } from 'zod';
import { advanceStage, dispatchToolCalls, followStages, MAX_PLAN_CALLS, toolJobKey, type StagePayload, type ToolsInput } from '../../src/lease/dispatch.js';
import { toolKinds } from '../../src/lease/dispatch/tools.js';
import { LeaseConfigError } from '../../src/lease/errors.js';
import { LeaseEvents } from '../../src/lease/events.js';
import type { Job, JobStore } from '../../src/lease/types.js';
import { sqliteDatabase, type TestDatabase } from './helpers/stores.js';

const tools = {
  create_ticket: { schema: z.object({ title: z.string().min(1) }), leaseMs: 20_000, maxRunMs: 45_000, maxAttempts: 2 },
  search_tickets: { schema: z.object({ q: z.string() }).strict(), leaseMs: 20_000, maxRunMs: 10_000, maxAttempts: 5, deadlineMs: 60_000 },
  write_report: {
    schema: z.object({ topic: z.string() }),
    leaseMs: 30_000,
    maxRunMs: 120_000,
    maxAttempts: 3,
    stages: ['outline', { name: 'draft', maxRunMs: 600_000 }, 'publish'],
  },
} satisfies ToolsInput;

let db: TestDatabase;
let store: JobStore;
beforeAll(async () => {
  db = await sqliteDatabase();
  store = await db.open();
});
afterAll(async () => {
  await db?.dispose();
});

const count = async () => Number((await db.sql<{ n: number }>('SELECT count(*) AS n FROM tool_jobs'))[0]!.n);

describe('dispatchToolCalls', () => {
  test('the three plan shapes give the same job; one answer per call, in order', async () => {
    const shapes = [
      { name: 'create_ticket', arguments: { title: 'Printer on fire' } },
      { id: 'call_1', type: 'function', function: { name: 'create_ticket', arguments: '{"title":"Printer on fire"}' } },
      { type: 'tool_use', id: 'toolu_1', name: 'create_ticket', input: { title: 'Printer on fire' } },
    ];
    for (const [i, call] of shapes.entries()) {
      const [answer] = await dispatchToolCalls(store, [call], { tools, runId: `shapes-${i}` });
      expect(answer).toMatchObject({ status: 'enqueued', kind: 'create_ticket', key: `shapes-${i}:0:create_ticket` });
      const job = await store.get((answer as { jobId: number }).jobId);
      expect(job).toMatchObject({
        kind: 'create_ticket',
        idempotencyKey: `shapes-${i}:0:create_ticket`,
        payload: { title: 'Printer on fire' },
        maxAttempts: 2,
      });
    }
  });

  test('only allow-listed tools are enqueued; a refusal enqueues nothing', async () => {
    const before = await count();
    const answers = await dispatchToolCalls(
      store,
      [
        { name: 'delete_everything', arguments: {} },
        { name: 'constructor', arguments: {} },
        { name: '__proto__', arguments: {} },
        { name: 'toString' },
        { function: { name: 'create_ticket', arguments: '{not json' } },
        { name: 'create_ticket', arguments: 'a string' },
        { arguments: {} },
        'create_ticket',
      ],
      { tools, runId: 'allow' },
    );
    expect(answers.map((a) => a.status === 'refused' && a.code)).toEqual([
      'unknown_tool',
      'unknown_tool',
      'unknown_tool',
      'unknown_tool',
      'invalid_call',
      'invalid_call',
      'invalid_call',
      'invalid_call',
    ]);
    expect(await count()).toBe(before);

    // Negative control: with the tool in the allow-list, the same call is enqueued.
    const [ok] = await dispatchToolCalls(store, [{ name: 'delete_everything', arguments: {} }], {
      tools: { ...tools, delete_everything: { schema: z.object({}), leaseMs: 20_000, maxRunMs: 5_000, maxAttempts: 1 } },
      runId: 'allow',
    });
    expect(ok).toMatchObject({ status: 'enqueued', kind: 'delete_everything' });
  });

  test("arguments that fail the kind's schema are refused with the issue, never the values; valid ones pass", async () => {
    const before = await count();
    const answers = await dispatchToolCalls(
      store,
      [
        { name: 'create_ticket', arguments: { title: '' } },
        { name: 'create_ticket', arguments: { title: 42 } },
        { name: 'search_tickets', arguments: { q: 'x', secret: 'hunter2' } }, // .strict(): unknown keys refused
      ],
      { tools, runId: 'schema' },
    );
    expect(answers).toEqual([
      { status: 'refused', code: 'invalid_arguments', reason: expect.stringContaining('title') },
      { status: 'refused', code: 'invalid_arguments', reason: expect.stringContaining('title') },
      { status: 'refused', code: 'invalid_arguments', reason: expect.stringMatching(/secret|unrecognized/i) },
    ]);
    expect(JSON.stringify(answers)).not.toContain('hunter2');
    expect(await count()).toBe(before);
    // Negative control: the valid form of each is enqueued.
    const good = await dispatchToolCalls(
      store,
      [
        { name: 'create_ticket', arguments: { title: 'ok' } },
        { name: 'search_tickets', arguments: { q: 'x' } },
      ],
      {
        tools,
        runId: 'schema',
      },
    );
    expect(good.map((a) => a.status)).toEqual(['enqueued', 'enqueued']);
  });

  test('lease, stage time limit and attempts come from the config; what the model writes about them is ignored', async () => {
    const plan = [
      {
        name: 'create_ticket',
        arguments: { title: 'x', leaseMs: 99_999_999, maxAttempts: 1000 },
        leaseMs: 99_999_999,
        ttl: 99_999_999,
        maxAttempts: 1000,
        retries: 1000,
        deadlineMs: 1,
      },
    ];
    // Its own job kind, so the claim below can only pick this job.
    const limited = { ...tools, create_ticket: { ...tools.create_ticket, kind: 'ticket-limits' } } satisfies ToolsInput;
    const [answer] = await dispatchToolCalls(store, plan, { tools: limited, runId: 'limits' });
    const job = (await store.get((answer as { jobId: number }).jobId))!;
    // The check: stored limits are the config's, and the stored payload is the schema's output (extras stripped).
    const fromConfigOnly = (j: Job) => j.maxAttempts === 2 && j.deadlineAt === null && JSON.stringify(j.payload) === '{"title":"x"}';
    expect(fromConfigOnly(job)).toBe(true);

    // The lease a worker claims it with is the config's too (toolKinds feeds runWorker/claim).
    const kinds = toolKinds(limited);
    expect(kinds).toMatchObject({ 'ticket-limits': { leaseMs: 20_000, maxRunMs: 45_000 }, 'write_report.draft': { leaseMs: 30_000, maxRunMs: 600_000 } });
    expect(Object.keys(toolKinds(limited, ['ticket-limits']))).toEqual(['ticket-limits']);
    const leaseMsByKind = Object.fromEntries(Object.entries(kinds).map(([k, v]) => [k, v.leaseMs]));
    const t0 = Date.now();
    const { lease } = await store.claim({ workerId: 'w', kinds: ['ticket-limits'], leaseMsByKind });
    const t1 = Date.now();
    expect(lease).toMatchObject({ id: job.id, leaseMs: 20_000 });
    // Bounded by the clock read around the claim, not by how fast the box
    // answers it: a stalled claim widens [t0, t1], it does not fail the test.
    // The second of slack is only for the database clock's rounding.
    expect(lease!.leaseUntil.getTime()).toBeGreaterThanOrEqual(t0 + 20_000 - 1_000);
    expect(lease!.leaseUntil.getTime()).toBeLessThanOrEqual(t1 + 20_000 + 1_000);
    // Exactly the config's 20 s after the claim's own time (its heartbeat).
    const claimed = (await store.get(job.id))!;
    expect(claimed.leaseUntil!.getTime() - claimed.heartbeatAt!.getTime()).toBe(20_000);

    // Negative control: a dispatcher that passed the plan's fields on would store them, and the check catches it.
    const leaky = await store.enqueue({
      kind: 'create_ticket',
      idempotencyKey: 'leaky',
      payload: plan[0]!.arguments,
      maxAttempts: plan[0]!.maxAttempts,
      deadlineMs: plan[0]!.deadlineMs,
    });
    expect(fromConfigOnly(leaky.job)).toBe(false);
  });

  test('dispatching the same plan twice is idempotent: the second answers duplicate with the same jobs', async () => {
    const plan = [
      { name: 'create_ticket', arguments: { title: 'a' } },
      { name: 'create_ticket', arguments: { title: 'b' } },
      { name: 'search_tickets', arguments: { q: 'a' } },
    ];
    const first = await dispatchToolCalls(store, plan, { tools, runId: 'twice' });
    const before = await count();
    const second = await dispatchToolCalls(store, plan, { tools, runId: 'twice' });
    expect(first.map((a) => a.status)).toEqual(['enqueued', 'enqueued', 'enqueued']);
    expect(second.map((a) => a.status)).toEqual(['duplicate', 'duplicate', 'duplicate']);
    expect(second.map((a) => 'jobId' in a && a.jobId)).toEqual(first.map((a) => 'jobId' in a && a.jobId));
    expect(first.map((a) => 'key' in a && a.key)).toEqual(['twice:0:create_ticket', 'twice:1:create_ticket', 'twice:2:search_tickets']);
    expect(await count()).toBe(before);

    // The same position under the same run with other arguments is a conflict, not a silent duplicate.
    const [conflict] = await dispatchToolCalls(store, [{ name: 'create_ticket', arguments: { title: 'changed' } }], { tools, runId: 'twice' });
    expect(conflict).toMatchObject({ status: 'refused', code: 'key_conflict' });

    // Negative control: another run id is another set of jobs (the key is what makes it idempotent).
    const other = await dispatchToolCalls(store, plan, { tools, runId: 'twice-b' });
    expect(other.map((a) => a.status)).toEqual(['enqueued', 'enqueued', 'enqueued']);
  });

  test('an invalid allow-list fails naming the field; a bad runId or plan is a programming error', async () => {
    await expect(dispatchToolCalls(store, [], { tools: { t: { schema: z.object({}), leaseMs: 0, maxRunMs: 1, maxAttempts: 1 } }, runId: 'r' })).rejects.toThrow(
      /tools\.t\.leaseMs/,
    );
    await expect(
      dispatchToolCalls(store, [], { tools: { t: { schema: {} as never, leaseMs: 1, maxRunMs: 1, maxAttempts: 1 } }, runId: 'r' }),
    ).rejects.toBeInstanceOf(LeaseConfigError);
    await expect(dispatchToolCalls(store, [], { tools, runId: 'has space' })).rejects.toThrow(/runId/);
    await expect(dispatchToolCalls(store, {} as never, { tools, runId: 'r' })).rejects.toThrow(/array/);
  });
});

describe('plan bounds and keys', () => {
  test('a plan past MAX_PLAN_CALLS enqueues the first 256 and refuses the rest, naming the limit', async () => {
    const before = await count();
    const plan = Array.from({ length: 300 }, (_, i) => ({ name: 'create_ticket', arguments: { title: `t${i}` } }));
    const answers = await dispatchToolCalls(store, plan, { tools, runId: 'long-plan' });
    expect(answers).toHaveLength(300);
    expect(answers.slice(0, MAX_PLAN_CALLS).every((a) => a.status === 'enqueued')).toBe(true);
    expect(answers.slice(MAX_PLAN_CALLS).every((a) => a.status === 'refused' && a.code === 'too_many_calls' && /at most 256/.test(a.reason))).toBe(true);
    expect((await count()) - before).toBe(MAX_PLAN_CALLS);
  });

  test('the job key is unambiguous: a ":" in the runId is percent-encoded, so no two (runId, index, tool, stage) share a key', () => {
    // The parts that collide when joined with ":" as they are (`x:3:4:u` both times).
    const a = toolJobKey('x:3', 4, 'u');
    const b = toolJobKey('x', 3, '4', 'u');
    expect(a).toBe('x%3A3:4:u');
    expect(a).not.toBe(b);
    expect(toolJobKey('a%3Ab', 0, 't')).not.toBe(toolJobKey('a:b', 0, 't'));
    // Negative control: the plain join the key used to be.
    const plain = (r: string, i: number, t: string, st = '') => (st === '' ? `${r}:${i}:${t}` : `${r}:${i}:${t}:${st}`);
    expect(plain('x:3', 4, 'u')).toBe(plain('x', 3, '4', 'u'));
  });
});

describe('stages', () => {
  /** Claims and completes the one queued job of `kind` with `result`. */
  async function finish(kind: string, result: unknown): Promise<Job> {
    const { lease } = await store.claim({ workerId: 'stage-worker', kinds: [kind] });
    expect(lease).not.toBeNull();
    expect((await store.complete(lease!, result)).ok).toBe(true);
    return (await store.get(lease!.id))!;
  }

  test('each stage is its own job with its own key, limits and result; the next is enqueued only after the previous commits', async () => {
    const [answer] = await dispatchToolCalls(store, [{ name: 'write_report', arguments: { topic: 'fences' } }], { tools, runId: 'report' });
    expect(answer).toMatchObject({ status: 'enqueued', kind: 'write_report.outline', key: 'report:0:write_report:outline' });
    const outlineId = (answer as { jobId: number }).jobId;

    // Not committed yet: nothing to advance.
    expect(await advanceStage(store, tools, outlineId)).toEqual({ status: 'not_ready', state: 'queued' });
    const { lease } = await store.claim({ workerId: 'lost-owner', kinds: ['write_report.outline'] });
    await db.expireLease(lease!.id);
    expect((await store.complete(lease!, { outline: 'from a lost owner' })).ok).toBe(false);
    expect(await advanceStage(store, tools, outlineId)).toMatchObject({ status: 'not_ready' });

    await finish('write_report.outline', { outline: ['a', 'b'] });
    const next = await advanceStage(store, tools, outlineId);
    expect(next).toMatchObject({ status: 'enqueued', stage: 'draft', kind: 'write_report.draft', key: 'report:0:write_report:draft' });
    expect(await advanceStage(store, tools, outlineId)).toMatchObject({ status: 'duplicate', stage: 'draft' }); // idempotent
    const draft = (await store.get((next as { jobId: number }).jobId))!;
    expect(draft.maxAttempts).toBe(3);
    expect(draft.payload).toEqual({
      arguments: { topic: 'fences' },
      chain: { runId: 'report', index: 0, tool: 'write_report', stage: 'draft', stageIndex: 1, stages: ['outline', 'draft', 'publish'] },
      previous: { stage: 'outline', jobId: outlineId, result: { outline: ['a', 'b'] } },
    } satisfies StagePayload);

    const draftDone = await finish('write_report.draft', { text: 'draft' });
    const publish = await advanceStage(store, tools, draftDone.id);
    expect(publish).toMatchObject({ status: 'enqueued', stage: 'publish' });
    const published = await finish('write_report.publish', { url: '/r/1' });
    expect(await advanceStage(store, tools, published.id)).toEqual({ status: 'none', reason: 'last_stage' });
    const plain = await dispatchToolCalls(store, [{ name: 'create_ticket', arguments: { title: 'p' } }], { tools, runId: 'report-plain' });
    expect(await advanceStage(store, tools, (plain[0] as { jobId: number }).jobId)).toEqual({ status: 'none', reason: 'not_a_stage' });
  });

  test('re-dispatching the plan repairs a chain stalled between a commit and the next enqueue; followStages advances on result_committed', async () => {
    const plan = [{ name: 'write_report', arguments: { topic: 'crash' } }];
    await dispatchToolCalls(store, plan, { tools, runId: 'stalled' });
    await finish('write_report.outline', { outline: 'x' }); // the worker "crashed" before advancing
    const before = await count();
    const [again] = await dispatchToolCalls(store, plan, { tools, runId: 'stalled' });
    expect(again).toMatchObject({ status: 'duplicate', kind: 'write_report.outline' });
    expect(await count()).toBe(before + 1);
    const draftKey = toolJobKey('stalled', 0, 'write_report', 'draft');
    expect(await db.sql('SELECT kind FROM tool_jobs WHERE idempotency_key = ?', [draftKey])).toEqual([{ kind: 'write_report.draft' }]);

    const events = new LeaseEvents();
    const errors: unknown[] = [];
    const off = followStages(events, store, tools, (e) => errors.push(e));
    const draft = await finish('write_report.draft', { text: 'y' });
    events.emit({
      type: 'result_committed',
      at: new Date(),
      workerId: 'w',
      jobId: draft.id,
      kind: draft.kind,
      fencingToken: draft.fencingToken,
      resultSha256: '',
    });
    off();
    const publishKey = toolJobKey('stalled', 0, 'write_report', 'publish');
    // followStages enqueues in the background: wait for its row however slow
    // the disk is, rather than for a fixed window.
    await expect
      .poll(() => db.sql('SELECT kind FROM tool_jobs WHERE idempotency_key = ?', [publishKey]), { timeout: 10_000, interval: 10 })
      .toEqual([{ kind: 'write_report.publish' }]);
    expect(errors).toEqual([]);
  });
});

describe('Anthropic content blocks that are not calls', () => {
  const text = (t: string) => ({ type: 'text', text: t });
  const use = (id: string, title: string) => ({ type: 'tool_use', id, name: 'create_ticket', input: { title } });

  test('text and thinking blocks between the calls are skipped, not refused, and the calls get the keys they get without them', async () => {
    const calls = [use('toolu_1', 'first'), use('toolu_2', 'second'), { name: 'search_tickets', arguments: { q: 'x' } }];
    const withText = [
      text('Let me open two tickets.'),
      calls[0],
      { type: 'thinking', thinking: '…', signature: 's' },
      text('and then'),
      calls[1],
      { type: 'redacted_thinking', data: 'x' },
      calls[2],
      text('Done.'),
    ];
    const bare = await dispatchToolCalls(store, calls, { tools, runId: 'blocks-bare' });
    const mixed = await dispatchToolCalls(store, withText, { tools, runId: 'blocks-mixed' });
    const keysOf = (answers: typeof bare) => answers.flatMap((a) => ('key' in a ? [a.key.replace(/^blocks-[a-z]+:/, '')] : []));
    expect(keysOf(bare)).toEqual(['0:create_ticket', '1:create_ticket', '2:search_tickets']);
    expect(keysOf(mixed)).toEqual(keysOf(bare));
    // One answer per entry, in order: the blocks answer `skipped`.
    expect(mixed.map((a) => a.status)).toEqual(['skipped', 'enqueued', 'skipped', 'skipped', 'enqueued', 'skipped', 'enqueued', 'skipped']);
    expect(mixed[0]).toEqual({ status: 'skipped', reason: 'entry 0: a text block, not a tool call' });
    // Dispatching the text-laden plan again finds the same jobs.
    const again = await dispatchToolCalls(store, withText, { tools, runId: 'blocks-mixed' });
    expect(again.filter((a) => a.status !== 'skipped').map((a) => a.status)).toEqual(['duplicate', 'duplicate', 'duplicate']);
  });

  test('server_tool_use and mcp_tool_use blocks (calls the API ran itself) and their results are skipped, never dispatched, even for an allowed tool whose arguments may be empty', async () => {
    const optional = { list_tickets: { schema: z.object({ q: z.string().optional() }), leaseMs: 20_000, maxRunMs: 10_000, maxAttempts: 1 } };
    const plan = [
      { type: 'server_tool_use', id: 'srvtoolu_1', name: 'list_tickets', input: { q: 'a' } },
      { type: 'web_search_tool_result', tool_use_id: 'srvtoolu_1', content: [] },
      { type: 'mcp_tool_use', id: 'mcptoolu_1', name: 'list_tickets', server_name: 'tickets', input: { q: 'b' } },
      { type: 'mcp_tool_result', tool_use_id: 'mcptoolu_1', is_error: false, content: [] },
      { type: 'future_tool_use', id: 'x_1', name: 'list_tickets', input: {} },
      { type: 'tool_use', id: 'toolu_1', name: 'list_tickets', input: { q: 'c' } },
    ];
    const answers = await dispatchToolCalls(store, plan, { tools: optional, runId: 'blocks-server' });
    expect(answers.map((a) => a.status)).toEqual(['skipped', 'skipped', 'skipped', 'skipped', 'refused', 'enqueued']);
    expect(answers[2]).toEqual({ status: 'skipped', reason: 'entry 2: a mcp_tool_use block, not a tool call' });
    // An unknown typed block is refused (it keeps its position), never read as { name } with empty arguments.
    expect(answers[4]).toMatchObject({ status: 'refused', code: 'invalid_call' });
    expect(answers[5]).toMatchObject({ status: 'enqueued', key: 'blocks-server:1:list_tickets' });
    // One job: the client's own tool_use, with its own arguments.
    expect(await db.sql("SELECT payload FROM tool_jobs WHERE idempotency_key LIKE 'blocks-server:%'")).toEqual([{ payload: JSON.stringify({ q: 'c' }) }]);
  });

  test('control: an entry of another unknown shape is still refused, and it keeps its position', async () => {
    const answers = await dispatchToolCalls(store, [{ type: 'image', source: {} }, use('toolu_1', 'after')], { tools, runId: 'blocks-control' });
    expect(answers[0]).toMatchObject({ status: 'refused', code: 'invalid_call' });
    expect(answers[1]).toMatchObject({ status: 'enqueued', key: 'blocks-control:1:create_ticket' });
  });
});

describe('leases the workers cannot hold', () => {
  const short = { quick: { schema: z.object({}), leaseMs: 10_000, maxRunMs: 5_000, maxAttempts: 1 } } satisfies ToolsInput;

  test('a leaseMs at or below maxMissedHeartbeats × heartbeatMs + jitterMs is refused at dispatch, naming the numbers; nothing is enqueued', async () => {
    const before = await count();
    // runWorker's defaults: 3 × 5 000 + 1 000 = 16 000 > 10 000.
    await expect(dispatchToolCalls(store, [{ name: 'quick', arguments: {} }], { tools: short, runId: 'hb-default' })).rejects.toThrow(
      /tools\.quick.*leaseMs \(10000\) must be greater than maxMissedHeartbeats × heartbeatMs \+ jitterMs = 3 × 5000 \+ 1000 = 16000/,
    );
    await expect(
      dispatchToolCalls(store, [{ name: 'quick', arguments: {} }], {
        tools: short,
        heartbeat: { heartbeatMs: 3_000, maxMissedHeartbeats: 3, jitterMs: 1_000 },
        runId: 'hb-slow',
      }),
    ).rejects.toBeInstanceOf(LeaseConfigError);
    // A stage's own lease is checked too.
    const staged = {
      report: { schema: z.object({}), leaseMs: 30_000, maxRunMs: 5_000, maxAttempts: 1, stages: ['outline', { name: 'draft', leaseMs: 2_000 }] },
    } satisfies ToolsInput;
    await expect(dispatchToolCalls(store, [{ name: 'report', arguments: {} }], { tools: staged, runId: 'hb-stage' })).rejects.toThrow(
      /tools\.report stage draft.*leaseMs \(2000\)/,
    );
    await expect(dispatchToolCalls(store, [], { tools: short, heartbeat: { heartbeatMs: 0 }, runId: 'hb-bad' })).rejects.toThrow(/heartbeat\.heartbeatMs/);
    expect(await count()).toBe(before);
  });

  test('control: with heartbeat settings a worker can hold it under, the same tool is enqueued', async () => {
    const [answer] = await dispatchToolCalls(store, [{ name: 'quick', arguments: {} }], {
      tools: short,
      heartbeat: { heartbeatMs: 2_000, maxMissedHeartbeats: 3, jitterMs: 1_000 },
      runId: 'hb-fits',
    });
    expect(answer).toMatchObject({ status: 'enqueued', kind: 'quick' });
  });
});

describe("a tool's entity from its arguments", () => {
  const refunds = {
    refund_payment: {
      schema: z.object({ invoice_id: z.union([z.string(), z.number()]), amount: z.number() }),
      leaseMs: 30_000,
      maxRunMs: 60_000,
      maxAttempts: 3,
      entity: { json: '/arguments/invoice_id' },
    },
    create_ticket: tools.create_ticket,
  } satisfies ToolsInput;

  test("the value at the pointer becomes the job's fence key; a tool without one keeps the job's own entity", async () => {
    const answers = await dispatchToolCalls(
      store,
      [
        { name: 'refund_payment', arguments: { invoice_id: 'inv_42', amount: 5 } },
        { name: 'refund_payment', arguments: { invoice_id: 7, amount: 5 } },
        { name: 'create_ticket', arguments: { title: 't' } },
      ],
      { tools: refunds, runId: 'entity' },
    );
    expect(answers.map((a) => a.status)).toEqual(['enqueued', 'enqueued', 'enqueued']);
    const jobs = await Promise.all(answers.map(async (a) => (await store.get((a as { jobId: number }).jobId))!));
    expect(jobs.map((j) => j.fenceKey)).toEqual(['inv_42', '7', jobs[2]!.jobKey]);
  });

  test('a call without a usable entity there is refused invalid_arguments and enqueues nothing', async () => {
    const before = await count();
    const answers = await dispatchToolCalls(
      store,
      [
        { name: 'refund_payment', arguments: { invoice_id: 'has space', amount: 5 } },
        { name: 'refund_payment', arguments: { invoice_id: 1.5, amount: 5 } },
      ],
      { tools: refunds, runId: 'entity-bad' },
    );
    expect(answers).toEqual([
      { status: 'refused', code: 'invalid_arguments', reason: expect.stringContaining('/arguments/invoice_id') },
      { status: 'refused', code: 'invalid_arguments', reason: expect.stringContaining('/arguments/invoice_id') },
    ]);
    expect(await count()).toBe(before);
    await expect(dispatchToolCalls(store, [], { tools: { t: { ...refunds.refund_payment, entity: { json: '/_meta/x' } } }, runId: 'r' })).rejects.toThrow(
      /tools\.t\.entity\.json/,
    );
  });

  test("arguments kept by a passthrough schema with a member whose name differs from the entity's only in case are refused: the route would refuse every attempt invalid-entity", async () => {
    const loose = {
      refund_payment: { ...refunds.refund_payment, schema: z.object({ invoice_id: z.string(), amount: z.number() }).passthrough() },
    } satisfies ToolsInput;
    const before = await count();
    const answers = await dispatchToolCalls(
      store,
      [
        { name: 'refund_payment', arguments: { invoice_id: 'inv_1', Invoice_ID: 'inv_2', amount: 5 } },
        // Control: the same loose schema with no such twin is enqueued, its extra member kept.
        { name: 'refund_payment', arguments: { invoice_id: 'inv_1', note: 'x', amount: 5 } },
      ],
      { tools: loose, runId: 'entity-fold' },
    );
    expect(answers[0]).toEqual({ status: 'refused', code: 'invalid_arguments', reason: expect.stringMatching(/\/arguments\/invoice_id.*differ only in case/) });
    expect(answers[1]).toMatchObject({ status: 'enqueued' });
    expect(await count()).toBe(before + 1);
  });
});
