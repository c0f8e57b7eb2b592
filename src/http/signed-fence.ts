import type { SignedFenceConfig } from '../config/schema.js';
import { verifyFence } from '../protocol/fence-token.js';
import { verificationKeys } from '../protocol/keys.js';
import { shortHash } from './middleware/auth/middleware.js';
import type { Refusal } from '../protocol/problem.js';
import type { AuditInfo, GatewayStore } from '../store/types.js';
import type { Logger } from './logger.js';

export type SignedFenceCheck = (
  jws: string,
  entity: string,
  request: { audit: AuditInfo; idempotencyKey: string | null },
) => Promise<{ ok: true; fence: bigint } | { ok: false; refusal: Refusal }>;

export interface SignedFenceOptions {
  config: SignedFenceConfig;
  env: Record<string, string | undefined>;
  store: GatewayStore;
  logger: Logger;
  /** Current time in epoch ms (tests). Default `Date.now`: `exp` is a JWT claim, checked on the gateway's clock. */
  now?: () => number;
}

/**
 * Step 3 with `fence.signed` (DESIGN §7): the fence header must be a JWS
 * minted with the configured keys for this very entity and not yet expired.
 * Runs once the entity is known (after the body for a JSON-pointer entity).
 * Every refusal is written to the rejection log before it is answered:
 * 401 `invalid-fence-signature` (forged, bare integer, other entity) and
 * 409 `fence-expired` (a genuine fence whose holder's lease has run out,
 * refused even before a newer owner shows up). The log keeps the presented
 * fence value and a short hash of the JWS, never the JWS (it is a bearer
 * credential for the entity until it expires).
 */
export function createSignedFenceCheck(options: SignedFenceOptions): SignedFenceCheck {
  const { config, store, logger } = options;
  const keys = verificationKeys(config, options.env, 'fence.signed');
  const toleranceSec = config.clockTolerance / 1000;
  const now = options.now ?? Date.now;

  return async function checkSignedFence(jws, entity, request) {
    const v = await verifyFence(jws, keys, { entity, clockToleranceSec: toleranceSec, now: now(), ...(config.issuer ? { issuer: config.issuer } : {}) });
    if (v.ok) return { ok: true, fence: v.fence.fence };
    const hash = await shortHash(jws);
    let refusal: Refusal;
    let detail: string;
    if (v.code === 'fence-expired') {
      const ago = Math.max(0, Math.round(now() / 1000 - v.exp));
      detail = `fence expired ${ago}s ago${v.sub ? ` (holder ${v.sub})` : ''}; jws sha256 ${hash}`;
      refusal = {
        code: 'fence-expired',
        detail: `this signed fence expired at ${new Date(v.exp * 1000).toISOString()}: the lease it stood for has run out`,
        extras: { entity, presented_fence: v.presented.toString() },
      };
    } else {
      const why = v.why === 'wrong-entity' ? 'the fence was signed for another entity' : v.why;
      detail = `${why}; jws sha256 ${hash}`;
      refusal = {
        code: 'invalid-fence-signature',
        detail: `the fence is not a valid signed fence for this entity (${why})`,
        extras: { entity, presented_fence: v.presented?.toString() ?? null },
      };
    }
    try {
      await store.recordRejection({
        reason: refusal.code as 'fence-expired' | 'invalid-fence-signature',
        entity,
        presentedFence: v.presented,
        currentFence: null,
        idempotencyKey: request.idempotencyKey,
        audit: request.audit,
        detail,
      });
    } catch (err) {
      // The refusal stands: it never depended on the store.
      logger.error('rejection-log-failed', {
        request_id: request.audit.requestId,
        reason: refusal.code,
        error: err instanceof Error ? err.message : String(err),
      });
    }
    return { ok: false, refusal };
  };
}
