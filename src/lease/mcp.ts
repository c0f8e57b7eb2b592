/**
 * `fencedMcp`: an MCP client whose every `tools/call` carries the lease's
 * fence, entity and a stable idempotency key in `params._meta`, as
 * `fencedFetch` carries them in headers (DESIGN §6.4; the `_meta` names and
 * JSON-RPC codes are the MCP route's contract, docs/mcp.md).
 *
 * The SDK is not imported: the client is structural (`{ callTool }`), so an
 * `@modelcontextprotocol/sdk` `Client`, or anything shaped like it, fits.
 */
import { LeaseError, LeaseLostError, OutcomeUnknownError } from './errors.js';
import {
  createStep,
  fenceRefusalText,
  fenceValue,
  MAX_RECONCILE_WAIT_MS,
  MAX_RECONCILE_WAITS,
  sleep,
  type FenceContext,
  type FenceOptions,
  type FenceRefusal,
} from './fenced-fetch.js';
// One table for both sides of the wire: the gateway's MCP route reads these names and sends these codes.
import { caseVariantOf, MCP_CALL_MEMBERS, MCP_META, MCP_META_MEMBERS } from '../protocol/mcp.js';
import { neverConnected } from '../protocol/connect-errors.js';

/** The route's `data.type`s that mean "a newer owner holds the fence" (sent with -32001 / -32002, src/protocol/mcp.ts). */
const FENCE_LOST_TYPES = new Set(['stale-fence', 'fence-expired']);

/** The parameters of `tools/call`, as far as `fencedMcp` needs them. */
export interface McpToolCallParams {
  name: string;
  arguments?: Record<string, unknown>;
  _meta?: Record<string, unknown>;
  [extra: string]: unknown;
}

/** The request options of the SDK's `callTool`, as far as `fencedMcp` needs them. */
export interface McpRequestOptionsLike {
  signal?: AbortSignal;
  timeout?: number;
  maxTotalTimeout?: number;
  resetTimeoutOnProgress?: boolean;
  [extra: string]: unknown;
}

/** Anything with the SDK `Client`'s `callTool` (the SDK is never imported here). */
export interface McpClientLike {
  callTool(params: McpToolCallParams, resultSchema?: any, options?: any): Promise<unknown>;
}

export interface FencedMcpCallParams extends McpToolCallParams {
  /**
   * The step's name; default `mcp:<tool name>`. The idempotency key is
   * `<jobKey>:<step>`, the same rule as `fencedFetch`, so a retry of the step
   * (in this attempt or a later one) sends the same key and the gateway
   * replays. Two different calls of one tool in one job need two step names:
   * without them they share a key, and the second is a replay of the first
   * (or refused as `idempotency-key-reused` if its arguments differ).
   * Never sent to the server.
   */
  step?: string;
}

export interface FencedMcp<C extends McpClientLike = McpClientLike> {
  callTool(
    params: FencedMcpCallParams,
    resultSchema?: Parameters<C['callTool']>[1],
    options?: Parameters<C['callTool']>[2],
  ): Promise<Awaited<ReturnType<C['callTool']>>>;
}

export interface FencedMcpOptions extends Pick<FenceOptions, 'fenceSigner'> {
  /**
   * The route's `timeoutMs` for the tool (docs/mcp.md): the SDK's request
   * timeout becomes this plus `ROUTE_ANSWER_MARGIN_MS`, so the gateway's own
   * answer at its deadline (-32009, recorded) reaches the client before the
   * client gives up by itself (an SDK timeout tells the handler nothing the
   * gateway knows). Without it: the lease's remaining time. Never past the
   * lease either way; a `timeout` in the call's options wins.
   */
  routeTimeoutMs?: number;
}

/**
 * The marker on a tool result the gateway settled by reconciliation: the
 * route's `_meta` member (src/http/mcp/reconcile.ts RECONCILED_META; the
 * lease side does not import the gateway's code).
 */
export const MCP_RECONCILED_META = 'io.fencegate/reconciled';

function reconciled(result: unknown): boolean {
  const meta = (result as { _meta?: unknown } | null | undefined)?._meta;
  return meta !== null && typeof meta === 'object' && (meta as Record<string, unknown>)[MCP_RECONCILED_META] === true;
}

/** What the SDK's timeout waits past the route's deadline for the gateway's answer to arrive. */
export const ROUTE_ANSWER_MARGIN_MS = 2_000;
/** The least SDK timeout fencedMcp sets (the SDK refuses none, but a zero one never sends). */
const MIN_SDK_TIMEOUT_MS = 1_000;
const MAX_TIMER_MS = 2_147_483_647;

/**
 * The gateway's hint on an MCP `outcome-unknown` (-32005) of a route that
 * reconciles (DESIGN §3.12): `data.reconciling: true` and `data.retry_after`
 * in seconds, the members a plain route's 409 carries. Undefined for any
 * other error, a -32005 without the hint included (a route without
 * reconcile: the handler gets the McpRefusalError as before).
 */
export function mcpReconcilingHint(e: { code: number; data?: unknown }): { retryAfterMs: number } | undefined {
  if (e.code !== -32005) return undefined;
  const d = e.data as { type?: unknown; reconciling?: unknown; retry_after?: unknown } | null | undefined;
  if (d == null || d.type !== 'outcome-unknown' || d.reconciling !== true) return undefined;
  const after = d.retry_after;
  if (typeof after !== 'number' || !Number.isInteger(after) || after < 0 || after > 999_999_999) return undefined;
  return { retryAfterMs: after * 1000 };
}

/**
 * The server (the gateway's MCP route, or the tool server behind it) refused
 * the call with a JSON-RPC error that is not lease loss: `code` is the
 * route's `data.type` (e.g. `idempotency-key-reused`, `entity-busy`) or
 * `jsonrpc_error`; `data` is the error's data as sent.
 */
export class McpRefusalError extends Error {
  override name = 'McpRefusalError';
  readonly code: string;
  readonly rpcCode: number;
  readonly data: unknown;
  constructor(message: string, rpcCode: number, data: unknown, options?: { cause?: unknown }) {
    super(message, options);
    this.rpcCode = rpcCode;
    this.data = data;
    const type = (data as { type?: unknown } | null | undefined)?.type;
    this.code = typeof type === 'string' ? type : 'jsonrpc_error';
  }
}

interface RpcErrorLike {
  code: number;
  message?: string;
  data?: unknown;
}

/**
 * A JSON-RPC error the server answered with: the SDK's McpError (any code,
 * an application's own included), or a structural client's error with a
 * code in JSON-RPC's reserved range. Not the SDK's StreamableHTTPError, whose
 * numeric code is an HTTP status (or -1): that is the transport failing.
 */
function asRpcError(err: unknown): RpcErrorLike | undefined {
  const e = err as { code?: unknown; name?: unknown } | null;
  if (typeof e?.code !== 'number') return undefined;
  return e.name === 'McpError' || (e.code <= -32000 && e.code >= -32768) ? (err as RpcErrorLike) : undefined;
}

const dataType = (data: unknown) => {
  const type = (data as { type?: unknown } | null | undefined)?.type;
  return typeof type === 'string' ? type : undefined;
};

/**
 * The SDK reuses -32001 (its RequestTimeout) for its own client-side timeout,
 * with `data: { timeout }` or `{ maxTotalTimeout }` and no `type`: that is
 * "no answer", never "stale fence".
 */
function isLocalTimeout(e: RpcErrorLike): boolean {
  const d = e.data as Record<string, unknown> | null | undefined;
  return e.code === -32001 && dataType(d) === undefined && d != null && (typeof d.timeout === 'number' || typeof d.maxTotalTimeout === 'number');
}

/**
 * Lease loss is the route's `data.type`, never a code alone: MCP servers
 * use -32002 for "resource not found", and the SDK -32001 for its own
 * timeout, so a code alone could mark a healthy lease lost.
 */
function isFenceLost(e: RpcErrorLike): boolean {
  const type = dataType(e.data);
  return type !== undefined && FENCE_LOST_TYPES.has(type);
}

/**
 * The McpErrors the SDK's Client raises itself once the server's result has
 * arrived (@modelcontextprotocol/sdk 1.32 `Client.callTool`: structured
 * content missing, or not matching the tool's output schema). They carry a
 * server-error code, but the server ran the call. Matched by the SDK's own
 * messages; test/lease/connect-errors.test.ts pins them against the SDK.
 */
const AFTER_RESULT = [
  /has an output schema but did not return structured content/,
  /Structured content does not match the tool's output schema/,
  /Failed to validate structured content/,
];
function afterResult(err: unknown): boolean {
  const e = err as { name?: unknown; message?: unknown } | null;
  return e?.name === 'McpError' && typeof e.message === 'string' && AFTER_RESULT.some((r) => r.test(e.message as string));
}

/**
 * Builds a fenced MCP client for one attempt (in a handler: `ctx.mcp(client)`).
 * Each `callTool` checks the lease (throws `OwnershipUnknownError` or
 * `LeaseLostError` and sends nothing), adds the three `_meta` fields
 * (overwriting any the caller set, in any case; other `_meta` such as a
 * progress token stay; a `params.idempotencyKey`, in any case, is dropped;
 * a `params` member that differs only in case from `name`, `arguments` or
 * `_meta` is a `LeaseError` before anything starts), aborts with the lease,
 * and maps the answer:
 *
 * - a JSON-RPC error (the route sends -32001 / -32002) with `data.type` `stale-fence` /
 *   `fence-expired`: the lease is lost (`markLost`, then `LeaseLostError`,
 *   as `fencedFetch` does for a 409 stale-fence);
 * - the SDK's own timeout, or a connection broken after sending:
 *   `OutcomeUnknownError` (retry only under the same step); that timeout is
 *   the route's plus a margin (`routeTimeoutMs`) or the lease's remaining
 *   time, so the gateway's recorded answer at its deadline comes first;
 * - an outcome-unknown (-32005) with the route's reconciling hint: waited
 *   out within the lease and the same call sent again (as fencedFetch does
 *   for the 409), `outcome_reconciled` on a result the route marks reconciled;
 * - any other JSON-RPC error: `McpRefusalError` with its `data`;
 * - a failure that proves nothing was sent (a refused connect, DNS: one list
 *   with the gateway, src/protocol/connect-errors.ts): the error as it is;
 * - any other failure (an HTTP error status, a cut answer, a reset, a
 *   result the SDK's output-schema check refuses): `OutcomeUnknownError`;
 * - an SDK Client that is not connected: a `LeaseError` before anything starts.
 *
 * @example
 * const tickets = fencedMcp(client, fenceCtx);
 * await tickets.callTool({ name: 'create_ticket', arguments: { title: 'Printer on fire' } });
 * await tickets.callTool({ name: 'create_ticket', step: 'ticket-2', arguments: { title: 'Second one' } });
 */
export function fencedMcp<C extends McpClientLike>(client: C, ctx: FenceContext, options: FencedMcpOptions = {}): FencedMcp<C> {
  // The step gives the same lease gate, key, signed fence, event and in-flight
  // record as fencedFetch: one rule for both.
  const step = createStep(ctx, options.fenceSigner ? { fenceSigner: options.fenceSigner } : {});
  /** How long the attempt may still wait (FenceContext.waitableMs), as fencedFetch reads it. */
  const waitable = () => ctx.waitableMs?.() ?? ctx.leaseUntil().getTime() - Date.now();
  /**
   * The SDK's request options: its timeout aligned with the route's (or the
   * lease's remaining time), reset by progress, never past the lease; the
   * caller's own values win.
   */
  const sdkTimeouts = (): Pick<McpRequestOptionsLike, 'timeout' | 'maxTotalTimeout' | 'resetTimeoutOnProgress'> => {
    // A timer longer than 2^31 - 1 ms fires at once (the SDK's is a setTimeout).
    const lease = Math.min(MAX_TIMER_MS, Math.max(MIN_SDK_TIMEOUT_MS, Math.floor(waitable())));
    const timeout = options.routeTimeoutMs !== undefined ? Math.min(options.routeTimeoutMs + ROUTE_ANSWER_MARGIN_MS, lease) : lease;
    return { timeout: Math.max(MIN_SDK_TIMEOUT_MS, timeout), maxTotalTimeout: lease, resetTimeoutOnProgress: true };
  };

  return {
    async callTool(params, resultSchema, requestOptions): Promise<Awaited<ReturnType<C['callTool']>>> {
      // A caller's (or a model's) params.idempotencyKey is dropped: the key is `<jobKey>:<step>`, sent in
      // _meta, and the route refuses a call whose two keys differ (docs/mcp.md "_meta fields"). A
      // member that differs from a name the route reads only in case (`_Meta`, `IO.fencegate/Fence`)
      // is that member to a case-insensitive upstream, so the route refuses the call: `idempotencyKey`
      // in any case is dropped, our `_meta` fields in any case are replaced, and a variant of `name`,
      // `arguments` or `_meta` is the caller's mistake, said before anything starts.
      const { step: stepName, ...given } = params;
      const kept: [string, unknown][] = [];
      for (const [member, value] of Object.entries(given)) {
        const variant = caseVariantOf(member, MCP_CALL_MEMBERS);
        if (member === 'idempotencyKey' || variant === 'idempotencyKey') continue;
        if (variant !== undefined) {
          throw new LeaseError(
            'invalid_input',
            `callTool: params.${member} differs only in case from "${variant}", which an mcp route refuses; pass it as "${variant}"`,
          );
        }
        kept.push([member, value]);
      }
      // fromEntries defines each member as it is (a "__proto__" member stays one, never a prototype).
      const wire = Object.fromEntries(kept) as McpToolCallParams;
      if (typeof wire.name !== 'string' || wire.name.length === 0) {
        throw new LeaseError('invalid_input', 'callTool: params.name must be a non-empty string');
      }
      // The SDK's Client, never connected or closed, would throw "Not
      // connected" without sending: said here, before the step starts, so
      // that it never reads as a call that may have been sent.
      if ('transport' in client && (client as { transport?: unknown }).transport === undefined) {
        throw new LeaseError('invalid_input', 'callTool: the MCP client is not connected (connect it before the attempt, or after close(), again)');
      }
      const name = stepName ?? `mcp:${wire.name}`;
      type Result = Awaited<ReturnType<C['callTool']>>;
      return step<Result>(name, async ({ idempotencyKey, fence, fenceKey, signal, requestId }): Promise<Result> => {
        const callerOptions = (requestOptions ?? {}) as McpRequestOptionsLike;
        const callerSignal = callerOptions.signal;
        const signals = [signal, callerSignal].filter((s): s is AbortSignal => s != null);
        const callerMeta = Object.entries(Object.hasOwn(wire, '_meta') ? (wire._meta ?? {}) : {});
        const sent: McpToolCallParams = {
          ...wire,
          _meta: {
            ...Object.fromEntries(callerMeta.filter(([member]) => caseVariantOf(member, MCP_META_MEMBERS) === undefined)),
            [MCP_META.fence]: fence,
            [MCP_META.entity]: fenceKey,
            [MCP_META.idempotencyKey]: idempotencyKey,
          },
        };
        // An outcome-unknown with the gateway's hint is waited out and the same call (key, fence,
        // entity, arguments) sent again, as fencedFetch does (DESIGN §3.12, §6.4).
        for (let waits = 0; ; waits++) {
          const answer = await send(waits);
          if ('result' in answer) {
            // An answer the gateway learned from the server's status tool (DESIGN §3.12), as fencedFetch reports `fencegate-reconciled`.
            if (reconciled(answer.result)) {
              ctx.emit({
                type: 'outcome_reconciled',
                at: new Date(),
                workerId: ctx.workerId,
                jobId: ctx.jobId,
                kind: ctx.kind,
                fencingToken: ctx.fencingToken,
                step: name,
                idempotencyKey,
                requestId,
                waits,
              });
            }
            return answer.result;
          }
          try {
            await sleep(answer.retryAfterMs, signals);
          } catch (err) {
            if (signal.aborted) throw signal.reason instanceof Error ? signal.reason : new LeaseLostError('the lease ended', { cause: err });
            throw err;
          }
          // The resend is a new external action: the same gate as the first; a signed fence is minted again.
          ctx.assertCanStart();
          if (options.fenceSigner) {
            const again = await fenceValue(ctx, options.fenceSigner);
            ctx.assertCanStart();
            sent._meta = { ...sent._meta, [MCP_META.fence]: again };
          }
        }

        /** One send: the result, or the hint to wait (an outcome-unknown the gateway is reconciling); anything else thrown, mapped. */
        async function send(waits: number): Promise<{ result: Result } | { retryAfterMs: number }> {
          try {
            return { result: (await client.callTool(sent, resultSchema, { ...sdkTimeouts(), ...callerOptions, signal: AbortSignal.any(signals) })) as Result };
          } catch (err) {
            if (signal.aborted) throw signal.reason instanceof Error ? signal.reason : new LeaseLostError('the lease ended', { cause: err });
            if (callerSignal?.aborted) throw err;
            // The SDK's own check of the result against the tool's output
            // schema fails after the call ran: not a refusal.
            if (afterResult(err)) {
              throw new OutcomeUnknownError(
                `step ${name}: tools/call ${wire.name} ran, but its result did not pass the client's output-schema check; retry only with the same step`,
                {
                  cause: err,
                },
              );
            }
            const rpc = asRpcError(err);
            if (rpc && isFenceLost(rpc)) {
              const refusal = dataType(rpc.data) as FenceRefusal;
              ctx.markLost('stale_fence', refusal);
              throw new LeaseLostError(fenceRefusalText(ctx.fencingToken, ctx.fenceKey, refusal), { cause: err });
            }
            // -32000 is the SDK's ConnectionClosed: the request may have landed.
            if (rpc && (isLocalTimeout(rpc) || rpc.code === -32000)) {
              throw new OutcomeUnknownError(`step ${name}: tools/call ${wire.name} got no answer; it may have taken effect, retry only with the same step`, {
                cause: err,
              });
            }
            // Reconciliation (DESIGN §3.12): a -32005 whose data carries the route's hint is waited
            // out within the lease, with fencedFetch's bounds; without the hint (a route that does
            // not reconcile) it is the handler's, as an McpRefusalError.
            const hint = rpc && waits < MAX_RECONCILE_WAITS ? mcpReconcilingHint(rpc) : undefined;
            if (hint !== undefined && hint.retryAfterMs <= MAX_RECONCILE_WAIT_MS && hint.retryAfterMs < waitable()) return hint;
            if (rpc) {
              throw new McpRefusalError(`step ${name}: tools/call ${wire.name} refused: ${rpc.message ?? `JSON-RPC error ${rpc.code}`}`, rpc.code, rpc.data, {
                cause: err,
              });
            }
            // Passed on as it is only when it proves the call never left this
            // machine (a retry under a new step is then safe). Anything else
            // may have reached the server: a reset, an HTTP error status from
            // something in between, a cut or unreadable answer.
            if (neverConnected(err)) throw err;
            throw new OutcomeUnknownError(`step ${name}: tools/call ${wire.name} failed after it may have been sent`, { cause: err });
          }
        }
      });
    },
  };
}
