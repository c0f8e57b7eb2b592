/**
 * The allow-list of tool kinds a model may dispatch, parsed once with zod:
 * each kind's argument schema and the limits its jobs run under. The limits
 * live here, never in a plan.
 */
import { z } from 'zod';
import { tokensOf } from '../../core/json-pointer.js';
import { LeaseConfigError } from '../errors.js';
import type { KindOptions } from '../runner/options.js';
import type { PayloadSchema } from '../runner/types.js';
import { checkLeaseTiming, HEARTBEAT_DEFAULTS, type LeaseTiming } from '../timing.js';

/** The limits of one job (a tool's, or one of its stages'). */
export interface ToolLimits {
  /** The lease length, applied by the worker that claims the kind (`toolKinds` → `runWorker({ kinds })`). */
  leaseMs: number;
  /** The stage time limit: past it the attempt ends with `stage_timeout` (also through `toolKinds`). */
  maxRunMs: number;
  /** Attempts before the job fails; stored with the job at enqueue. */
  maxAttempts: number;
  /** Optional total deadline from the enqueue (database clock); stored at enqueue. */
  deadlineMs?: number;
}

export interface ToolStageConfig extends Partial<ToolLimits> {
  /** Letters, digits and `_-`, up to 32: part of the job kind (`<kind>.<stage>`) and the job key. */
  name: string;
}

export interface ToolConfig<A = unknown> extends ToolLimits {
  /** Validates the model's arguments; the parsed value is what is stored (zod strips unknown keys unless `.strict()`). */
  schema: PayloadSchema<A>;
  /** The job kind; default the tool name. */
  kind?: string;
  /**
   * Long work as a chain: one job per stage, kind `<kind>.<stage>`, each
   * with its own key, result and limits (a stage's limits default to the
   * tool's). The next stage is enqueued once the previous one's result is
   * committed (see `advanceStage`).
   */
  stages?: (string | ToolStageConfig)[];
  /**
   * Where the jobs' fence entity comes from. Default: the job's own
   * (`tool-job:<storeId>:<id>`). `{ json: "/arguments/<member>" }`: the
   * value at that pointer of the call's `{ arguments }` (a string, or a safe
   * integer as decimal text) becomes the job's `fenceKey`, so the worker's
   * `_meta` entity is the one an mcp route with the same `entity` pointer
   * reads from the call (docs/mcp.md). A call without a usable value there is
   * refused `invalid_arguments`.
   */
  entity?: { json: string };
}

export type ToolsInput = Record<string, ToolConfig<any>>;

export interface ParsedStage extends ToolLimits {
  name: string;
  kind: string;
}

export interface ParsedTool {
  name: string;
  schema: PayloadSchema;
  /** One entry per job of a call: a single unnamed stage for a tool without `stages`. */
  stages: ParsedStage[];
  staged: boolean;
  /** The entity pointer (into `{ arguments }`) and its tokens, or null: the job's own entity. */
  entity: { pointer: string; tokens: string[] } | null;
}

export type ParsedTools = ReadonlyMap<string, ParsedTool>;

const ms = z.number().int().positive();
const limits = { leaseMs: ms, maxRunMs: ms, maxAttempts: z.number().int().min(1).max(100), deadlineMs: ms.optional() };
const stageName = z.string().regex(/^[A-Za-z0-9_-]{1,32}$/, 'must be letters, digits, _ or -, up to 32');
const tool = z
  .object({
    ...limits,
    schema: z.custom<PayloadSchema>((v) => typeof (v as PayloadSchema | null)?.safeParse === 'function', {
      message: 'must have safeParse (e.g. a zod schema)',
    }),
    kind: z
      .string()
      .regex(/^[A-Za-z0-9_.:-]{1,150}$/)
      .optional(),
    stages: z
      .array(
        z.union([
          stageName,
          z
            .object({ name: stageName, ...limits })
            .partial({ leaseMs: true, maxRunMs: true, maxAttempts: true })
            .strict(),
        ]),
      )
      .min(1)
      .optional(),
    entity: z
      .object({ json: z.string().regex(/^\/arguments\/.+$/, 'must be a JSON pointer into the call\'s arguments, "/arguments/<member>…"') })
      .strict()
      .optional(),
  })
  .strict();
const toolsSchema = z.record(z.string().regex(/^[A-Za-z0-9_.-]{1,64}$/, 'tool names: letters, digits, _ . -, up to 64'), tool);

const cache = new WeakMap<object, ParsedTools>();

/** Parses the allow-list once (cached per object); throws `LeaseConfigError` naming the field. */
export function parseTools(tools: ToolsInput): ParsedTools {
  const hit = cache.get(tools);
  if (hit) return hit;
  const parsed = toolsSchema.safeParse(tools);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `tools.${i.path.join('.') || '(tools)'}: ${i.message}`);
    throw new LeaseConfigError(`dispatchToolCalls: invalid tools: ${issues.join('; ')}`);
  }
  const out = new Map<string, ParsedTool>();
  const kinds = new Set<string>();
  for (const [name, t] of Object.entries(parsed.data)) {
    const kind = t.kind ?? name;
    const base: ToolLimits = { leaseMs: t.leaseMs, maxRunMs: t.maxRunMs, maxAttempts: t.maxAttempts, ...(t.deadlineMs ? { deadlineMs: t.deadlineMs } : {}) };
    const stages: ParsedStage[] = t.stages
      ? t.stages.map((s) => {
          const st = typeof s === 'string' ? { name: s } : s;
          return { ...base, ...stripUndefined(st), name: st.name, kind: `${kind}.${st.name}` };
        })
      : [{ ...base, name: '', kind }];
    if (new Set(stages.map((s) => s.name)).size !== stages.length)
      throw new LeaseConfigError(`dispatchToolCalls: tools.${name}.stages: stage names must be unique`);
    for (const s of stages) {
      if (kinds.has(s.kind)) throw new LeaseConfigError(`dispatchToolCalls: tools.${name}: job kind ${s.kind} is used twice`);
      kinds.add(s.kind);
    }
    const entity = t.entity ? { pointer: t.entity.json, tokens: tokensOf(t.entity.json) } : null;
    out.set(name, { name, schema: t.schema, stages, staged: t.stages !== undefined, entity });
  }
  cache.set(tools, out);
  return out;
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

/**
 * Every job kind of the allow-list with its lease and stage time limit, in
 * the shape of `runWorker({ kinds })` (and of a job store's `kinds`), so the
 * worker applies the same limits the dispatcher was configured with. Pass
 * `only` (e.g. `Object.keys(handlers)`) for a worker that runs some kinds.
 *
 * @example
 * runWorker({ store, workerId, handlers, kinds: toolKinds(tools, Object.keys(handlers)) });
 */
export function toolKinds(tools: ToolsInput, only?: readonly string[]): Record<string, Required<Pick<KindOptions, 'leaseMs' | 'maxRunMs'>>> {
  const out: Record<string, { leaseMs: number; maxRunMs: number }> = {};
  for (const t of parseTools(tools).values()) {
    for (const s of t.stages) {
      if (only && !only.includes(s.kind)) continue;
      out[s.kind] = { leaseMs: s.leaseMs, maxRunMs: s.maxRunMs };
    }
  }
  return out;
}

/** The heartbeat settings of the workers that run the allow-list's kinds (`runWorker`'s options of the same names). */
export type HeartbeatSettings = Partial<Omit<LeaseTiming, 'leaseMs'>>;

/**
 * Throws a `LeaseConfigError` naming the tool, the stage and the numbers
 * when a job's `leaseMs` is one no worker with these heartbeat settings can
 * hold (DESIGN §6.3: `leaseMs > maxMissedHeartbeats × heartbeatMs +
 * jitterMs`, the check `runWorker` makes at start-up). Settings left out are
 * `runWorker`'s defaults.
 */
export function checkToolTiming(tools: ParsedTools, heartbeat: HeartbeatSettings = {}): void {
  const settings = { ...HEARTBEAT_DEFAULTS, ...stripUndefined(heartbeat) };
  const bad = Object.entries(settings).find(([field, v]) => !Number.isSafeInteger(v) || v < (field === 'jitterMs' ? 0 : 1));
  if (bad) throw new LeaseConfigError(`dispatchToolCalls: heartbeat.${bad[0]} must be an integer ≥ ${bad[0] === 'jitterMs' ? 0 : 1}, got ${String(bad[1])}`);
  for (const t of tools.values()) {
    for (const s of t.stages) {
      checkLeaseTiming(
        { ...settings, leaseMs: s.leaseMs },
        `dispatchToolCalls: tools.${t.name}${t.staged ? ` stage ${s.name}` : ''} (heartbeat settings ${JSON.stringify(settings)})`,
      );
    }
  }
}
