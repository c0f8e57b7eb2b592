/**
 * `dispatchToolCalls`: turns a model's proposed tool calls into leased jobs,
 * one per call, and only for allow-listed kinds with valid arguments. The
 * model proposes names and arguments; the allow-list decides everything
 * else (lease, stage time limit, attempts), and the job key is derived from
 * the run, the call's position and the tool, so dispatching the same plan
 * again finds the same jobs (DESIGN §6.2: one key per job, enqueue is
 * idempotent on it).
 *
 * Stages: the job store has enqueue, claim and complete, and no
 * dependencies between jobs, so a chain is built from those alone: a stage
 * is enqueued only after the previous stage's result is committed, with that
 * result in its payload (`advanceStage`, wired by `followStages`). A stage
 * never sees the output of an owner that lost its lease, because only a
 * committed result (state `succeeded`) is ever read.
 */
import { LeaseError } from './errors.js';
import type { LeaseEvents } from './events.js';
import { duplicateOnPointerPath } from '../core/json-duplicates.js';
import { valueAtPointer } from '../core/json-pointer.js';
import { isNonCallBlock, normalizeCall } from './dispatch/plan.js';
import { checkToolTiming, parseTools, type HeartbeatSettings, type ParsedStage, type ParsedTool, type ToolsInput } from './dispatch/tools.js';
import { checkFenceKey } from './store-common.js';
import type { Job, JobStore } from './types.js';

export type RefusalCode = 'invalid_call' | 'unknown_tool' | 'invalid_arguments' | 'key_conflict' | 'too_many_calls';

/** Most calls of one plan enqueued; the rest are refused `too_many_calls` (a model's plan sizes the queue otherwise). */
export const MAX_PLAN_CALLS = 256;

export type DispatchAnswer =
  | { status: 'enqueued'; jobId: number; kind: string; key: string }
  /** The key was known (the same plan dispatched again): the existing job. */
  | { status: 'duplicate'; jobId: number; kind: string; key: string }
  | { status: 'refused'; code: RefusalCode; reason: string }
  /** An Anthropic content block that is not a call (`text`, `thinking`): nothing to enqueue, and no position taken. */
  | { status: 'skipped'; reason: string };

export interface DispatchOptions {
  /** The allow-list: tool name → schema and limits (see `ToolConfig`). */
  tools: ToolsInput;
  /** Names the plan: the same run id and plan give the same job keys. Letters, digits and `._~:-`, up to 100. */
  runId: string;
  /**
   * The heartbeat settings of the workers that run these kinds (the
   * `runWorker` options of the same names; default its defaults, 5 000 ms,
   * 3, 1 000 ms). A tool whose `leaseMs` no such worker can hold is refused
   * before anything is enqueued, naming the numbers.
   */
  heartbeat?: HeartbeatSettings;
}

/** The payload of a stage job (a tool with `stages`); a tool without stages gets its parsed arguments as payload. */
export interface StagePayload<A = unknown> {
  arguments: A;
  chain: { runId: string; index: number; tool: string; stage: string; stageIndex: number; stages: string[] };
  /** The previous stage's committed result; null for the first stage. */
  previous: { stage: string; jobId: number; result: unknown } | null;
}

const RUN_ID = /^[A-Za-z0-9._~:-]{1,100}$/;

/**
 * `<runId>:<index>:<tool>` and, for a stage, `:<stage>`, each part with `%`
 * and `:` percent-encoded, so that `:` only separates parts and no two
 * (runId, index, tool, stage) share a key: `x:3` + `4` + `u` and `x` + `3` +
 * tool `4` + stage `u` would both be `x:3:4:u` otherwise.
 */
export function toolJobKey(runId: string, index: number, tool: string, stage = ''): string {
  const parts = [encodePart(runId), String(index), encodePart(tool)];
  if (stage !== '') parts.push(encodePart(stage));
  return parts.join(':');
}

function encodePart(part: string): string {
  return part.replace(/%/g, '%25').replace(/:/g, '%3A');
}

async function enqueueStage(
  store: JobStore,
  key: string,
  stage: ParsedStage,
  payload: unknown,
  fenceKey: string | null,
): Promise<Exclude<DispatchAnswer, { status: 'skipped' }> & { job?: Job }> {
  const res = await store.enqueue({
    kind: stage.kind,
    idempotencyKey: key,
    payload,
    maxAttempts: stage.maxAttempts,
    ...(stage.deadlineMs !== undefined ? { deadlineMs: stage.deadlineMs } : {}),
    ...(fenceKey !== null ? { fenceKey } : {}),
  });
  if (res.created) return { status: 'enqueued', jobId: res.job.id, kind: stage.kind, key, job: res.job };
  if (!res.samePayload) {
    return {
      status: 'refused',
      code: 'key_conflict',
      reason: `job ${res.job.id} already holds key ${key} with other arguments (a different plan under the same runId?)`,
    };
  }
  return { status: 'duplicate', jobId: res.job.id, kind: stage.kind, key, job: res.job };
}

/**
 * The jobs' fence key from the tool's `entity` pointer into `{ arguments }`
 * (null: the job's own entity), read as an mcp route reads `params` (a
 * string, or a safe integer as decimal text), and checked as a fence key.
 */
function entityOf(tool: ParsedTool, args: unknown): { ok: true; fenceKey: string | null } | { ok: false; reason: string } {
  if (tool.entity === null) return { ok: true, fenceKey: null };
  // Two members on the way whose names differ only in case (a payload kept
  // by a passthrough schema): the route refuses such a call (invalid-request,
  // DESIGN §3.4: a case-insensitive upstream may act on the other one), so
  // every attempt of the job would be refused. Checked on the text the
  // handler sends.
  const repeated = duplicateOnPointerPath(JSON.stringify(args), tool.entity.tokens);
  if (repeated !== null) {
    return {
      ok: false,
      reason: `the tool's entity ${tool.entity.pointer}: the object at "${repeated.object}" has members whose names differ only in case, so parsers disagree on the entity`,
    };
  }
  let node = valueAtPointer(args, tool.entity.tokens);
  if (typeof node === 'number' && Number.isSafeInteger(node)) node = String(node);
  if (typeof node !== 'string') return { ok: false, reason: `the tool's entity ${tool.entity.pointer} is not a string or an integer in the arguments` };
  try {
    return { ok: true, fenceKey: checkFenceKey(node) };
  } catch (err) {
    return { ok: false, reason: `the tool's entity ${tool.entity.pointer}: ${(err as Error).message}` };
  }
}

/**
 * Enqueues one job per proposed call. Accepts `{ name, arguments }`, the
 * OpenAI `{ function: { name, arguments: "<json>" } }` and the Anthropic
 * `{ type: "tool_use", name, input }` shapes; answers per call, in order.
 * A call is refused (nothing enqueued) when it is malformed, its tool is not
 * in `tools`, or its arguments fail the tool's schema. Fields beyond the
 * name and the arguments are ignored.
 *
 * For a tool with stages the answer is about its first stage; dispatching
 * the plan again also advances any chain whose next stage is missing
 * (a worker that committed a stage and crashed before enqueuing the next).
 *
 * @example
 * const answers = await dispatchToolCalls(store, message.tool_calls, {
 *   runId: `conv-${conversationId}:turn-${turn}`,
 *   tools: { create_ticket: { schema: z.object({ title: z.string() }), leaseMs: 30_000, maxRunMs: 60_000, maxAttempts: 3 } },
 * });
 */
export async function dispatchToolCalls(store: JobStore, plan: readonly unknown[], options: DispatchOptions): Promise<DispatchAnswer[]> {
  if (!Array.isArray(plan)) throw new LeaseError('invalid_input', 'dispatchToolCalls: plan must be an array of tool calls');
  if (typeof options.runId !== 'string' || !RUN_ID.test(options.runId)) {
    throw new LeaseError('invalid_input', `dispatchToolCalls: runId must match ${RUN_ID}`);
  }
  const tools = parseTools(options.tools);
  checkToolTiming(tools, options.heartbeat);
  const answers: DispatchAnswer[] = [];
  // The position in a key counts calls only: a text block between two calls
  // never moves the second one's key.
  let index = -1;
  for (const [at, raw] of plan.entries()) {
    if (isNonCallBlock(raw)) {
      answers.push({ status: 'skipped', reason: `entry ${at}: a ${(raw as { type: string }).type} block, not a tool call` });
      continue;
    }
    index++;
    if (index >= MAX_PLAN_CALLS) {
      answers.push({
        status: 'refused',
        code: 'too_many_calls',
        reason: `call ${index}: a plan holds at most ${MAX_PLAN_CALLS} calls; split it into several runs`,
      });
      continue;
    }
    const call = normalizeCall(raw);
    if (!call.ok) {
      answers.push({ status: 'refused', code: 'invalid_call', reason: `call ${index}: ${call.reason}` });
      continue;
    }
    // A Map lookup: `constructor` or `__proto__` is an unknown tool, never an inherited property.
    const tool = tools.get(call.name);
    if (!tool) {
      answers.push({ status: 'refused', code: 'unknown_tool', reason: `call ${index}: tool ${call.name} is not allowed` });
      continue;
    }
    const parsed = tool.schema.safeParse(call.arguments);
    if (!parsed.success) {
      answers.push({
        status: 'refused',
        code: 'invalid_arguments',
        reason: `call ${index}: arguments do not match the ${call.name} schema: ${issueText(parsed.error)}`,
      });
      continue;
    }
    const entity = entityOf(tool, { arguments: parsed.data });
    if (!entity.ok) {
      answers.push({ status: 'refused', code: 'invalid_arguments', reason: `call ${index}: ${entity.reason}` });
      continue;
    }
    const first = tool.stages[0]!;
    const payload: unknown = tool.staged
      ? ({ arguments: parsed.data, chain: chainOf(options.runId, index, tool, 0), previous: null } satisfies StagePayload)
      : parsed.data;
    const { job, ...answer } = await enqueueStage(store, toolJobKey(options.runId, index, tool.name, first.name), first, payload, entity.fenceKey);
    answers.push(answer);
    if (tool.staged && job) {
      let current: Job | undefined = job;
      while (current) current = (await nextStage(store, tools, current))?.job;
    }
  }
  return answers;
}

function chainOf(runId: string, index: number, tool: ParsedTool, stageIndex: number): StagePayload['chain'] {
  return { runId, index, tool: tool.name, stage: tool.stages[stageIndex]!.name, stageIndex, stages: tool.stages.map((s) => s.name) };
}

/** zod's issues, short; never the arguments themselves. */
function issueText(error: unknown): string {
  const issues = (error as { issues?: { path?: PropertyKey[]; message?: string }[] } | null)?.issues;
  if (!Array.isArray(issues)) return 'invalid';
  return issues
    .slice(0, 5)
    .map((i) => `${(i.path ?? []).map(String).join('.') || '(arguments)'}: ${i.message ?? 'invalid'}`)
    .join('; ');
}

export type AdvanceAnswer =
  | (Extract<DispatchAnswer, { status: 'enqueued' | 'duplicate' }> & { stage: string })
  /** The job is the chain's last stage, or not a stage job. */
  | { status: 'none'; reason: 'last_stage' | 'not_a_stage' }
  /** The job has no committed result (yet): nothing is enqueued. */
  | { status: 'not_ready'; state: Job['state'] }
  | Extract<DispatchAnswer, { status: 'refused' }>;

async function nextStage(store: JobStore, tools: ReturnType<typeof parseTools>, job: Job): Promise<{ answer: AdvanceAnswer; job?: Job } | undefined> {
  const p = job.payload as Partial<StagePayload> | null;
  const chain = p?.chain;
  const tool = chain ? tools.get(chain.tool) : undefined;
  if (!chain || !tool || !tool.staged || tool.stages[chain.stageIndex]?.kind !== job.kind) {
    return { answer: { status: 'none', reason: 'not_a_stage' } };
  }
  // Only a committed result moves the chain: never the output of an attempt that lost its lease.
  if (job.state !== 'succeeded') return { answer: { status: 'not_ready', state: job.state } };
  const i = chain.stageIndex + 1;
  const stage = tool.stages[i];
  if (!stage) return { answer: { status: 'none', reason: 'last_stage' } };
  const payload: StagePayload = {
    arguments: p.arguments,
    chain: chainOf(chain.runId, chain.index, tool, i),
    previous: { stage: chain.stage, jobId: job.id, result: job.result },
  };
  // Every stage of the chain is fenced on the entity the first one was (the same arguments).
  const entity = entityOf(tool, { arguments: p.arguments });
  if (!entity.ok) return { answer: { status: 'refused', code: 'invalid_arguments', reason: entity.reason } };
  const { job: next, ...answer } = await enqueueStage(store, toolJobKey(chain.runId, chain.index, tool.name, stage.name), stage, payload, entity.fenceKey);
  if (answer.status === 'refused') return { answer };
  return { answer: { ...answer, stage: stage.name }, ...(next ? { job: next } : {}) };
}

/**
 * Enqueues the stage after job `jobId`, if that job is a stage whose result
 * is committed. Idempotent (the next stage's key is fixed), so calling it
 * twice, or from two workers, enqueues one job.
 */
export async function advanceStage(store: JobStore, tools: ToolsInput, jobId: number): Promise<AdvanceAnswer> {
  const job = await store.get(jobId);
  if (!job) throw new LeaseError('invalid_input', `advanceStage: no job ${jobId}`);
  return (await nextStage(store, parseTools(tools), job))!.answer;
}

/**
 * Advances chains as their stages commit: on every `result_committed` of a
 * worker's events, `advanceStage`. Returns the unsubscribe function. A crash
 * between the commit and the enqueue leaves the chain waiting; dispatching
 * the plan again (or calling `advanceStage`) picks it up.
 *
 * @example
 * const worker = await runWorker({ store, workerId, handlers, kinds: toolKinds(tools) });
 * followStages(worker.events, store, tools, (err) => log.error({ err }, 'next stage not enqueued'));
 */
export function followStages(events: LeaseEvents, store: JobStore, tools: ToolsInput, onError: (err: unknown) => void = () => {}): () => void {
  parseTools(tools);
  return events.on('result_committed', (e) => {
    advanceStage(store, tools, e.jobId).catch(onError);
  });
}

export { parseTools, toolKinds, type HeartbeatSettings, type ToolConfig, type ToolLimits, type ToolsInput, type ToolStageConfig } from './dispatch/tools.js';
export type { AnthropicToolUse, OpenAiToolCall, PlainToolCall, ProposedToolCall } from './dispatch/plan.js';
