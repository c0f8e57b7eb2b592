import { boundRejectionText, cutText } from './bounds.js';
import type { CommandInput, CommandOutcome, CommandQuery } from './types.js';

/**
 * The command log (DESIGN §4.1 `commands`): what every store writes of one
 * outcome, bounded as the rejection log's rows are (./bounds.ts): the
 * request's text fields at the same lengths, plus the route, the key scope
 * and the decision. A row holds ids, hashes and bounded text, never a body,
 * a token or a query string (the path is the normal form without it).
 */
export const COMMAND_TEXT_LIMITS = {
  /** Route names are short; a scope is the route, the caller and the codec's suffix (an mcp tool and path). */
  route: 256,
  scope: 4096,
  decision: 64,
} as const;

/** The bounded values of one command row, as every store binds them. */
export interface CommandText {
  route: string;
  scope: string | null;
  entity: string | null;
  fence: string | null;
  idempotencyKey: string | null;
  caller: string | null;
  method: string;
  path: string;
  payloadSha256: string | null;
  requestId: string;
  clientRequestId: string | null;
  tool: string | null;
  outcome: CommandOutcome;
  decision: string;
  status: number;
  upstreamMs: number | null;
}

export function commandText(c: CommandInput): CommandText {
  const t = boundRejectionText({ entity: c.entity, idempotencyKey: c.idempotencyKey, audit: c.audit });
  return {
    route: cutText(c.route, COMMAND_TEXT_LIMITS.route),
    scope: c.scope === null ? null : cutText(c.scope, COMMAND_TEXT_LIMITS.scope),
    entity: t.entity,
    fence: c.fence === null ? null : c.fence.toString(),
    idempotencyKey: t.idempotencyKey,
    caller: t.caller,
    method: t.method,
    path: t.path,
    payloadSha256: t.payloadSha256,
    requestId: t.requestId,
    clientRequestId: t.clientRequestId,
    tool: t.tool,
    outcome: c.outcome,
    decision: cutText(c.decision, COMMAND_TEXT_LIMITS.decision),
    status: c.status,
    upstreamMs: c.upstreamMs === null || !Number.isFinite(c.upstreamMs) ? null : Math.round(c.upstreamMs * 100) / 100,
  };
}

/** The outcome a finish's row records: `late-finish` when the finish found the record taken over or resolved. */
export function finishedOutcome(outcome: CommandOutcome, recorded: boolean): CommandOutcome {
  return recorded ? outcome : 'late-finish';
}

/** A cursor is a row id (decimal): anything else is refused before it reaches SQL. */
export function checkCommandCursor(query: CommandQuery): void {
  if (query.cursor !== undefined && !/^\d{1,19}$/.test(query.cursor)) throw new RangeError(`invalid command cursor: ${JSON.stringify(query.cursor)}`);
}
