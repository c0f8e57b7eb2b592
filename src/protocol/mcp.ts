import { foldName } from '../core/json-duplicates.js';
import { ERROR_CODES, type ErrorCode } from './codes.js';
import { retryAfterHeader, type Refusal, type RenderedError } from './problem.js';

/**
 * The MCP wire of an `mcp` route (docs/mcp.md): the `_meta` names a caller
 * puts its fence, entity and key under, and the JSON-RPC error a refusal is
 * answered as. One table, shared with the worker side (`fencedMcp`).
 */

/** `params._meta` members of a `tools/call` (reverse-DNS prefix, as MCP asks of `_meta` names). */
export const MCP_META = {
  fence: 'io.fencegate/fence',
  entity: 'io.fencegate/entity',
  idempotencyKey: 'io.fencegate/idempotency-key',
} as const;

/** The members of `params` a `tools/call` is read by: MCP's `name`, `arguments` and `_meta`, and an mcp route's `idempotencyKey`. */
export const MCP_CALL_MEMBERS: readonly string[] = ['name', 'arguments', '_meta', 'idempotencyKey'];
/** The members of `params._meta` an mcp route reads. */
export const MCP_META_MEMBERS: readonly string[] = Object.values(MCP_META);

/**
 * The member of `expected` that `name` differs from only in case, or
 * undefined (an exact name is no variant). A case-insensitive decoder (Go,
 * .NET) reads the variant as that member, so the route refuses it and
 * `fencedMcp` never sends one (DESIGN §3.3; the fold of §3.4).
 */
export function caseVariantOf(name: string, expected: readonly string[]): string | undefined {
  if (expected.includes(name)) return undefined;
  const folded = foldName(name);
  return expected.find((e) => foldName(e) === folded);
}

/** Why a call with a case variant of `member` in `object` (`params`, `params._meta`) is refused: names the member expected, never the one sent. */
export function caseVariantReason(object: 'params' | 'params._meta', member: string): string {
  return `tools/call ${object} has a member whose name differs only in case from "${member}", which a case-insensitive decoder reads as it; send it exactly as "${member}"`;
}

/**
 * JSON-RPC error code per refusal, in the implementation-defined server
 * range (-32000 … -32099). The bad-request family shares -32007; its
 * `data.type` tells which. A client tells a refusal from a tool result by
 * the `error` member itself: a refusal is never a `result`.
 */
export const MCP_ERROR_CODES: Record<ErrorCode, number> = {
  'stale-fence': -32001,
  'fence-expired': -32002,
  'idempotency-key-reused': -32003,
  'idempotency-in-progress': -32004,
  'outcome-unknown': -32005,
  'entity-busy': -32006,
  'missing-fence': -32007,
  'invalid-fence': -32007,
  'invalid-fence-signature': -32007,
  'missing-entity': -32007,
  'invalid-entity': -32007,
  'missing-idempotency-key': -32007,
  'invalid-idempotency-key': -32007,
  'invalid-request': -32007,
  'payload-too-large': -32007,
  'headers-too-large': -32007,
  'upstream-unavailable': -32008,
  'upstream-timeout': -32009,
  'upstream-response-too-large': -32010,
  'store-unavailable': -32011,
  'admission-expired': -32011,
  unauthorized: -32012,
  forbidden: -32012,
  'tool-denied': -32013,
  'internal-error': -32099,
  'no-route': -32099,
  'not-found': -32099,
  'admin-disabled': -32099,
  'not-outcome-unknown': -32099,
};

/** The header naming the refusal on every refused answer of an mcp route. */
export const REFUSAL_HEADER = 'x-fencegate-refusal';

/** A JSON-RPC id as JSON-RPC 2.0 §4 allows it; null when the request had none (or could not be read). */
export type JsonRpcId = string | number | null;

/**
 * A refusal as a JSON-RPC error response to request `id`. HTTP 200 by
 * default: MCP clients read JSON-RPC errors from 200 answers, and some drop
 * the body of a 4xx. `httpStatus: true` keeps the refusal's HTTP status (a
 * GET or DELETE has no JSON-RPC request to answer). `rpcCode` replaces the
 * refusal's code (MCP_ERROR_CODES) where JSON-RPC 2.0 names one of its own:
 * -32600 for a message that is no Request object; `data.type` stays.
 */
export function renderMcpRefusal(refusal: Refusal, id: JsonRpcId, options: { httpStatus?: boolean; rpcCode?: number } = {}): RenderedError {
  const spec = ERROR_CODES[refusal.code];
  const data = { type: refusal.code, title: spec.title, status: spec.status, detail: refusal.detail, ...dropUndefined(refusal.extras ?? {}) };
  const body = { jsonrpc: '2.0', id, error: { code: options.rpcCode ?? MCP_ERROR_CODES[refusal.code], message: `${refusal.code}: ${refusal.detail}`, data } };
  return {
    status: options.httpStatus ? spec.status : 200,
    headers: { 'content-type': 'application/json', [REFUSAL_HEADER]: refusal.code, ...retryAfterHeader(refusal) },
    body: JSON.stringify(body),
  };
}

function dropUndefined(o: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));
}
