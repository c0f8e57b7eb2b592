/**
 * The allow-list of tool kinds a model may dispatch, parsed once with zod
 * (STYLE habit 4): each kind's argument schema and the limits its jobs run
 * under. The limits live here, never in a plan.
 */
import { z } from 'zod';
import { LeaseConfigError } from '../errors.js';
import type { KindOptions, PayloadSchema } from '../runner/options.js';

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
    kind: z.string().regex(/^[A-Za-z0-9_.:-]{1,150}$/).optional(),
    stages: z
      .array(z.union([stageName, z.object({ name: stageName, ...limits }).partial({ leaseMs: true, maxRunMs: true, maxAttempts: true }).strict()]))
      .min(1)
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
    if (new Set(stages.map((s) => s.name)).size !== stages.length) throw new LeaseConfigError(`dispatchToolCalls: tools.${name}.stages: stage names must be unique`);
    for (const s of stages) {
      if (kinds.has(s.kind)) throw new LeaseConfigError(`dispatchToolCalls: tools.${name}: job kind ${s.kind} is used twice`);
      kinds.add(s.kind);
    }
    out.set(name, { name, schema: t.schema, stages, staged: t.stages !== undefined });
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
