/**
 * `fencedMcpTasks`: a leased job's tool call run as an MCP task (spec
 * 2025-11-25), through an mcp route (docs/mcp.md "Tasks"). Create, poll
 * within the lease, fetch the result:
 *
 * - the `tools/call` carries `params.task` and the step's fence, entity and
 *   key in `_meta`, as `fencedMcp` sends them (the key is `<jobKey>:<step>`,
 *   the step `mcp-task:<tool name>` by default);
 * - a CreateTaskResult is followed: `tasks/get` every `pollInterval` (the
 *   server's, else the option's), each one after the lease check (the
 *   runner's heartbeats keep the lease meanwhile; a lost lease stops the
 *   polling with `LeaseLostError`), then `tasks/result` once the task is over;
 * - a result without `task` is the call's final answer (the gateway's replay
 *   of a task it followed to its end, or a server that ran the call plainly);
 * - `idempotency-in-progress` (the gateway still follows this key's task, from
 *   an earlier attempt): the same call again after the hinted wait, while
 *   the lease allows; the gateway then replays the task's result;
 * - a stale fence is lease loss; a poll that fails is `OutcomeUnknownError`
 *   (retry under the same step: the gateway answers with the task's result
 *   or in-progress, never a second task); other JSON-RPC errors are
 *   `McpRefusalError`.
 *
 * The SDK is not imported: the client is anything with the SDK `Client`'s
 * `request(request, resultSchema, options)`.
 */
import { z } from 'zod';
import { caseVariantOf, MCP_CALL_MEMBERS, MCP_META, MCP_META_MEMBERS } from '../protocol/mcp.js';
import { neverConnected } from '../protocol/connect-errors.js';
import { LeaseError, LeaseLostError, OutcomeUnknownError } from './errors.js';
import { createStep, fenceRefusalText, type FenceContext, type FenceRefusal } from './fenced-fetch.js';
import { McpRefusalError, type FencedMcpCallParams, type FencedMcpOptions } from './mcp.js';

/** Anything with the SDK `Client`'s `request` (the SDK is never imported here). */
export interface McpRequestClientLike {
  request(request: { method: string; params?: Record<string, unknown> }, resultSchema: any, options?: any): Promise<unknown>;
}

export interface FencedMcpTaskParams extends FencedMcpCallParams {
  /** The task request (`ttl`, ms); default `{}`: the server's own retention. */
  task?: { ttl?: number };
}

export interface FencedMcpTaskOptions {
  /** The wait between two `tasks/get` when the server names none (default 1000 ms; kept within 50 ms..30 s). */
  pollIntervalMs?: number;
  /** Per request, the SDK's own timeout. */
  timeout?: number;
}

export interface FencedMcpTasks {
  /** The tool's final result (`CallToolResult`): the task's `tasks/result`, or a replay of it. */
  callToolTask(params: FencedMcpTaskParams, options?: FencedMcpTaskOptions): Promise<Record<string, unknown>>;
}

const Loose = z.looseObject({});
const TERMINAL = new Set(['completed', 'failed', 'cancelled']);
const FENCE_LOST = new Set(['stale-fence', 'fence-expired']);

interface RpcError {
  code: number;
  message?: string;
  data?: { type?: unknown; retry_after?: unknown } | null;
}
const rpcOf = (err: unknown): RpcError | undefined => {
  const e = err as { code?: unknown; name?: unknown } | null;
  if (typeof e?.code !== 'number') return undefined;
  return e.name === 'McpError' || (e.code <= -32000 && e.code >= -32768) ? (err as RpcError) : undefined;
};
const typeOf = (e: RpcError) => (typeof e.data?.type === 'string' ? e.data.type : undefined);

export function fencedMcpTasks(client: McpRequestClientLike, ctx: FenceContext, options: FencedMcpOptions = {}): FencedMcpTasks {
  const step = createStep(ctx, options.fenceSigner ? { fenceSigner: options.fenceSigner } : {});
  return {
    async callToolTask(params, taskOptions = {}) {
      const { step: stepName, task, ...given } = params;
      const kept: [string, unknown][] = [];
      for (const [member, value] of Object.entries(given)) {
        const variant = caseVariantOf(member, [...MCP_CALL_MEMBERS, 'task']);
        if (member === 'idempotencyKey' || variant === 'idempotencyKey') continue;
        if (variant !== undefined)
          throw new LeaseError('invalid_input', `callToolTask: params.${member} differs only in case from "${variant}", which an mcp route refuses`);
        kept.push([member, value]);
      }
      const wire = Object.fromEntries(kept) as FencedMcpCallParams;
      if (typeof wire.name !== 'string' || wire.name.length === 0)
        throw new LeaseError('invalid_input', 'callToolTask: params.name must be a non-empty string');
      const name = stepName ?? `mcp-task:${wire.name}`;
      const requestOptions = (signal: AbortSignal) => ({ signal, ...(taskOptions.timeout !== undefined ? { timeout: taskOptions.timeout } : {}) });

      return step(name, async ({ idempotencyKey, fence, fenceKey, signal }) => {
        const meta = Object.entries(wire._meta ?? {}).filter(([m]) => caseVariantOf(m, MCP_META_MEMBERS) === undefined);
        const call = {
          method: 'tools/call',
          params: {
            ...wire,
            task: task ?? {},
            _meta: { ...Object.fromEntries(meta), [MCP_META.fence]: fence, [MCP_META.entity]: fenceKey, [MCP_META.idempotencyKey]: idempotencyKey },
          },
        };
        const fail = (err: unknown, what: string): never => {
          if (signal.aborted) throw signal.reason instanceof Error ? signal.reason : new LeaseLostError('the lease ended', { cause: err });
          const rpc = rpcOf(err);
          if (rpc !== undefined && FENCE_LOST.has(typeOf(rpc) ?? '')) {
            const refusal = typeOf(rpc) as FenceRefusal;
            ctx.markLost('stale_fence', refusal);
            throw new LeaseLostError(fenceRefusalText(ctx.fencingToken, ctx.fenceKey, refusal), { cause: err });
          }
          if (rpc !== undefined && typeOf(rpc) !== undefined && rpc.code !== -32001)
            throw new McpRefusalError(`step ${name}: ${what} refused: ${rpc.message ?? `JSON-RPC error ${rpc.code}`}`, rpc.code, rpc.data, { cause: err });
          if (what === 'tools/call' && rpc === undefined && neverConnected(err)) throw err;
          throw new OutcomeUnknownError(`step ${name}: ${what} of ${wire.name} got no usable answer; the task may run, retry only with the same step`, {
            cause: err,
          });
        };

        // Create (or find the key's answer): in progress means an earlier attempt's task is still followed by the gateway.
        let created: Record<string, unknown>;
        for (;;) {
          ctx.assertCanStart();
          try {
            created = (await client.request(call, Loose, requestOptions(signal))) as Record<string, unknown>;
            break;
          } catch (err) {
            const rpc = rpcOf(err);
            if (rpc === undefined || typeOf(rpc) !== 'idempotency-in-progress' || signal.aborted) fail(err, 'tools/call');
            const hinted = typeof rpc!.data?.retry_after === 'number' ? rpc!.data.retry_after * 1000 : 1000;
            const waitMs = Math.min(hinted, 5_000);
            if (ctx.waitableMs !== undefined && waitMs > ctx.waitableMs()) fail(err, 'tools/call');
            await sleep(waitMs, signal);
          }
        }
        const handle = created.task as { taskId?: unknown; status?: unknown; pollInterval?: unknown } | undefined;
        // A final result: the replay of a task the gateway followed to its end, or a server that ran the call plainly.
        if (handle === undefined || handle === null || typeof handle.taskId !== 'string') return created;
        const taskId = handle.taskId;
        const pollMs = Math.min(30_000, Math.max(50, typeof handle.pollInterval === 'number' ? handle.pollInterval : (taskOptions.pollIntervalMs ?? 1000)));
        let status = typeof handle.status === 'string' ? handle.status : 'working';
        while (!TERMINAL.has(status)) {
          await sleep(pollMs, signal);
          // The lease is checked before each poll; the runner's heartbeats keep it meanwhile.
          ctx.assertCanStart();
          let got: Record<string, unknown>;
          try {
            got = (await client.request({ method: 'tasks/get', params: { taskId } }, Loose, requestOptions(signal))) as Record<string, unknown>;
          } catch (err) {
            return fail(err, 'tasks/get');
          }
          status = typeof got.status === 'string' ? got.status : status;
        }
        ctx.assertCanStart();
        try {
          return (await client.request({ method: 'tasks/result', params: { taskId } }, Loose, requestOptions(signal))) as Record<string, unknown>;
        } catch (err) {
          return fail(err, 'tasks/result');
        }
      });
    },
  };
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}
