import type { RouteConfig } from '../config/schema.js';
import type { Refusal } from '../protocol/problem.js';
import { cutText, REJECTION_TEXT_LIMITS } from '../store/bounds.js';
import type { AuditInfo, GatewayStore, RejectionReason } from '../store/types.js';
import type { HeaderReader } from './inbound.js';
import { errorText, type Logger } from './logger.js';
import { shortHash, type AuthRefusal } from './middleware/auth/middleware.js';

/**
 * The 400s of step 3 that the rejection log keeps (DESIGN §3.11): a
 * malformed or missing fence, entity or key is what an auditor looks for
 * when a client misbehaves (a worker sending a garbled fence is a worker
 * whose fence check is broken). Every other refusal before admission
 * (`no-route`, `invalid-request`, `payload-too-large`, …) and the transient
 * ones (`entity-busy`, `idempotency-in-progress`, 502/504) stay in the
 * decision log line and the metrics only. `invalid-fence-signature` and
 * `fence-expired` are written by ./signed-fence.ts; the admission's own
 * refusals by the store, in its transaction.
 */
export const LOGGED_REFUSALS: ReadonlySet<string> = new Set<RejectionReason>([
  'invalid-fence',
  'missing-fence',
  'invalid-entity',
  'missing-entity',
  'invalid-idempotency-key',
  'missing-idempotency-key',
  // A tool the route does not let agents use: who tried which tool is what an auditor looks for.
  'tool-denied',
]);

/** Three base64url segments: a compact JWS (a signed fence, or a bearer token sent in the wrong header). */
const JWS = /^[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/;

/**
 * What the log keeps of a value as presented: quoted and cut to
 * `REJECTION_TEXT_LIMITS.presented`; a JWS only as its length and a short
 * hash (it is a credential until it expires, as in ./signed-fence.ts).
 */
export async function presentedText(raw: unknown): Promise<string | null> {
  if (raw === null || raw === undefined) return null;
  const text = typeof raw === 'string' ? raw : (JSON.stringify(raw) ?? String(raw));
  if (JWS.test(text)) return `a JWS of ${text.length} characters, sha256 ${await shortHash(text)}`;
  return JSON.stringify(cutText(text, REJECTION_TEXT_LIMITS.presented));
}

/** The header a plain route read the refused value from; null when it came from the path or the body (the path is in the row). */
export function presentedHeader(route: RouteConfig, code: string, headers: HeaderReader): string | null {
  if (code === 'invalid-fence') return headers.get(route.fenceHeader);
  if (code === 'invalid-idempotency-key') return headers.get(route.idempotencyHeader);
  if (code === 'invalid-entity' && 'header' in route.entity) return headers.get(route.entity.header);
  return null;
}

/**
 * Writes the refusal's row when its code is one of `LOGGED_REFUSALS`; a
 * no-op otherwise. Best effort: a store fault is logged (`store-error`,
 * phase `rejection-log`) and the refusal is answered as it would have been.
 * Rows are bounded (../store/bounds.ts) and swept by `rejectionRetention`,
 * so a client spamming 400s costs at most a few KB a row until the sweep.
 */
export async function logRefusal(deps: { store: GatewayStore; logger: Logger }, refusal: Refusal, audit: AuditInfo, presented: unknown): Promise<void> {
  if (!LOGGED_REFUSALS.has(refusal.code)) return;
  try {
    const shown = await presentedText(presented);
    await deps.store.recordRejection({
      reason: refusal.code as RejectionReason,
      entity: null,
      presentedFence: null,
      currentFence: null,
      idempotencyKey: null,
      audit,
      detail: shown === null ? refusal.detail : `${refusal.detail}; presented ${shown}`,
    });
  } catch (err) {
    deps.logger.error('store-error', { request_id: audit.requestId, phase: 'rejection-log', reason: refusal.code, error: errorText(err) });
  }
}

/**
 * An auth refusal's row (401 `unauthorized`, 403 `forbidden`): who, if the
 * token was valid, what and why; never the token, only a short hash of it
 * to correlate repeated attempts. Best effort, as `logRefusal`.
 */
export async function logAuthRefusal(
  deps: { store: GatewayStore; logger: Logger },
  r: AuthRefusal,
  audit: Omit<AuditInfo, 'requestId' | 'caller' | 'payloadSha256'>,
): Promise<void> {
  try {
    await deps.store.recordRejection({
      reason: r.code,
      entity: null,
      presentedFence: null,
      currentFence: null,
      idempotencyKey: null,
      audit: { ...audit, requestId: r.requestId, caller: r.callerId, payloadSha256: '' },
      detail: r.tokenSha256 === null ? r.why : `${r.why}; token sha256 ${r.tokenSha256}`,
    });
  } catch (err) {
    deps.logger.error('store-error', { request_id: r.requestId, phase: 'rejection-log', reason: r.code, error: errorText(err) });
  }
}
