import type { Config } from '../config/schema.js';
import { ERROR_CODES, type ErrorCode } from '../protocol/codes.js';
import type { Refusal } from '../protocol/problem.js';
import type { CommandInput, CommandOutcome, GatewayStore } from '../store/types.js';
import { errorText, type Logger } from './logger.js';
import { storeEntity } from './pipeline/admit.js';
import { auditOf, type Exchange } from './pipeline/exchange.js';

/**
 * The command log (DESIGN §4.1 `commands`, §3.11): one row per outcome of a
 * request the gateway decided on, so that an entity's story (who changed it,
 * with which fence, what came back) is a query, not a grep of log lines.
 *
 * - An admitted request's row rides on its finish (`FinishInput.command`,
 *   ./pipeline/settle.ts), written in the finish's transaction: completed,
 *   released (429/503 "not processed", a 502 `upstream-unavailable`, a 503
 *   `admission-expired`) or outcome_unknown (a 504 `upstream-timeout`), with
 *   the status the caller was answered.
 * - The transient refusals that have no finish and no rejection-log row get
 *   a row of their own here, best effort like the 400 rows of the rejection
 *   log (../refusal-log.ts): `entity-busy` and `idempotency-in-progress`
 *   (decided by the admission, which wrote nothing), and `payload-too-large`
 *   (decided before admission, with what the headers said of entity, fence and key).
 * - Everything else that is refused is in the rejection log (G5) or, being
 *   malformed input or a store fault, in the decision log line only.
 */
export const COMMAND_REFUSALS: ReadonlySet<string> = new Set<CommandOutcome>(['entity-busy', 'idempotency-in-progress', 'payload-too-large']);

/**
 * The status a row records: the gateway's own for its refusals (an mcp
 * route answers them as JSON-RPC errors over HTTP 200, and an auditor looks
 * for the 504), else the status the caller was answered.
 */
export function commandStatus(decision: string, replyStatus: number): number {
  const code = decision.replace(/-after-takeover$/, '');
  return Object.hasOwn(ERROR_CODES, code) ? ERROR_CODES[code as ErrorCode].status : replyStatus;
}

/** A command-log row of this exchange: its route, its entity as the store keeps it, its audit fields. */
export function commandOf(
  x: Exchange,
  config: Pick<Config, 'fence'>,
  fields: { scope: string | null; outcome: CommandOutcome; decision: string; status: number },
): CommandInput {
  const t = x.trace;
  let fence: bigint | null = null;
  if (t.fence !== undefined && t.fence !== null) {
    try {
      fence = BigInt(t.fence);
    } catch {
      fence = null;
    }
  }
  return {
    route: x.route!.name,
    scope: fields.scope,
    entity: storeEntity(t.entity ?? null, x.caller, config as Config),
    fence,
    idempotencyKey: t.idempotency_key ?? null,
    outcome: fields.outcome,
    decision: fields.decision,
    status: fields.status,
    upstreamMs: t.upstream_ms ?? null,
    audit: auditOf(x),
  };
}

/**
 * The row of a transient refusal (`COMMAND_REFUSALS`); a no-op for other
 * codes. Best effort: a store fault is logged (`store-error`, phase
 * `command-log`) and the refusal is answered as it would have been.
 */
export async function logCommandRefusal(
  deps: { store: GatewayStore; logger: Logger; config?: Pick<Config, 'fence'> | undefined },
  x: Exchange,
  refusal: Refusal,
  status: number,
): Promise<void> {
  if (!COMMAND_REFUSALS.has(refusal.code) || x.route === null || deps.config === undefined) return;
  try {
    const row = commandOf(x, deps.config, {
      scope: null,
      outcome: refusal.code as CommandOutcome,
      decision: refusal.code,
      status: commandStatus(refusal.code, status),
    });
    await deps.store.recordCommand(row);
  } catch (err) {
    deps.logger.error('store-error', { request_id: x.requestId, phase: 'command-log', reason: refusal.code, error: errorText(err) });
  }
}
