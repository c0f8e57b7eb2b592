import { randomUUID } from 'node:crypto';
import type { Config, RouteConfig } from '../../config/schema.js';
import { fingerprint } from '../../core/fingerprint.js';
import { parsePreferWait } from '../../protocol/headers.js';
import { retryAfterSeconds, type Refusal } from '../../protocol/problem.js';
import { entityTopic, recordTopic, type Admission, type AdmitInput, type GatewayStore } from '../../store/types.js';
import type { Inbound } from '../inbound.js';
import { credentialBindingOf, keyScopeOf, type CredentialHashing } from '../key-scope.js';
import { errorText, type Logger } from '../logger.js';
import type { Command } from './codec.js';
import { auditOf, type Exchange } from './exchange.js';

// Stage 6 of the decision order (DESIGN §3.5): the one-transaction
// admission, with its bounded waits, and what each refusal says.

/** An admission the store answered: what was asked, the answer, and when it was sent (./lock-budget.ts measures from there). */
export interface Admitted {
  input: AdmitInput;
  admission: Admission;
  sentAt: number;
}

/** An admission that lets the request through to the upstream. */
export type Forwarding = Admitted & { admission: Extract<Admission, { outcome: 'forward' }> };

export const forwards = (a: Admitted): a is Forwarding => a.admission.outcome === 'forward';

export function createAdmitStage(deps: { config: Config; store: GatewayStore; logger: Logger; credentialHashing: CredentialHashing }) {
  const { config, store, logger } = deps;
  /** The admission of `command`, or null when the store could not be reached (nothing was admitted, nothing is sent). */
  return async function admit(x: Exchange, command: Command): Promise<Admitted | null> {
    const route = x.route!;
    const { req } = x;
    // The credentials the upstream sees bind the record, in its fingerprint or its scope (../key-scope.ts credentialBindingOf).
    const credentials = credentialBindingOf(route, req.headers, deps.credentialHashing);
    const { entity } = command;
    const input: AdmitInput = {
      // Per route (and caller, and the codec's own scope: an mcp call's tool and endpoint).
      scope: keyScopeOf(route, x.caller, command.keyScope, credentials.scope) + command.scopeSuffix,
      key: command.key,
      entity: storeEntity(entity, x.caller, config),
      fence: command.fence,
      // With the entity and the credentials: the same key for another entity, or from another caller, is 422, never their replay (DESIGN §3.4).
      fingerprint: fingerprint(
        command.fingerprint.method,
        x.pathname + x.search,
        command.fingerprint.contentType,
        command.fingerprint.bodyDigest,
        entity,
        credentials.fingerprint,
      ),
      ...routeAdmission(route),
      audit: auditOf(x),
    };
    const span = x.span.phase('fencegate.admit');
    try {
      const { admission, sentAt } = await admitWithWaits(store, input, route, req);
      span.end({ 'fencegate.admission': admission.outcome, 'fencegate.takeover': admission.outcome === 'forward' && admission.takeover });
      return { input, admission, sentAt };
    } catch (err) {
      span.end({ 'fencegate.admission': 'store-error' }, err);
      logger.error('store-error', { request_id: x.requestId, route: route.name, phase: 'admit', error: errorText(err) });
      return null;
    }
  };
}

/**
 * The entity as the store keeps its fence and serial slot. With
 * `fence.entityScope: "caller"` it is the caller id, NUL, then the entity:
 * each authenticated caller has fences of its own, so a caller presenting an
 * unsigned giant fence locks only its own view of the entity (DESIGN §2 G1
 * then holds per caller). Entities are printable ASCII (no NUL), so the last
 * NUL splits the pair unambiguously whatever the caller id holds. The
 * upstream, the answers and the signed-fence check keep the entity as sent.
 */
export function storeEntity(entity: string | null, caller: string | null, config: Config): string | null {
  if (entity === null || caller === null || config.fence.entityScope !== 'caller') return entity;
  return `${caller}\u0000${entity}`;
}

/**
 * What an admission takes from the route (a tool's policy already merged in
 * for MCP): the mode, a fresh owner token, and a record lock that outlives
 * any live attempt (`timeoutMs + lockMarginMs`, DESIGN §3.5).
 */
export function routeAdmission(
  route: Pick<RouteConfig, 'mode' | 'timeoutMs' | 'lockMarginMs' | 'retention' | 'onUnknown' | 'longCall'>,
): Pick<AdmitInput, 'mode' | 'ownerToken' | 'lockMs' | 'retentionMs' | 'onUnknown'> {
  // A long call locks for its renewal window, kept alive while it runs (./lock-keeper.ts, DESIGN §3.6 "Long calls").
  const lockMs = route.longCall !== undefined ? route.longCall.lockWindow : route.timeoutMs + route.lockMarginMs;
  return { mode: route.mode, ownerToken: randomUUID(), lockMs, retentionMs: route.retention, onUnknown: route.onUnknown };
}

/**
 * The admission, and `sentAt`: `performance.now()` just before the call whose
 * answer this is was sent. The lock it granted is measured from there
 * (../lock-budget.ts); a time taken after the await would miss the pause.
 */
export async function admitWithWaits(
  store: GatewayStore,
  input: AdmitInput,
  route: RouteConfig,
  req: Inbound,
): Promise<{ admission: Admission; sentAt: number }> {
  const start = Date.now();
  const preferWait = parsePreferWait(req.headers.get('prefer') ?? undefined);
  const keyWaitMs = preferWait === null ? 0 : Math.min(preferWait * 1000, route.maxWaitMs);
  for (;;) {
    const sentAt = performance.now();
    const admission = await store.admit(input);
    const waited = Date.now() - start;
    let topic: string | null = null;
    let budget = 0;
    if (admission.outcome === 'entity-busy' && input.entity !== null) {
      topic = entityTopic(input.entity);
      budget = route.serialWaitMs - waited;
    } else if (admission.outcome === 'idempotency-in-progress' && input.key !== null) {
      topic = recordTopic(input.scope, input.key);
      budget = keyWaitMs - waited;
    }
    // A caller that has gone away stops waiting: nothing was admitted for it.
    if (topic === null || budget <= 0 || req.signal.aborted) return { admission, sentAt };
    await store.waitForChange(topic, budget, req.signal);
  }
}

/** The admission outcomes that refuse the request. */
export type RefusedAdmission = Exclude<Admission, { outcome: 'forward' } | { outcome: 'replay' }>;

/**
 * The refusal an admission outcome answers (DESIGN §3.5 a, d, e, g, h).
 * Those the store logs were written to the rejection log in the admission's
 * transaction. `reconciling`: on a route with `reconcile`, when an
 * outcome-unknown may be asked again (./reconcile.ts reconcileHint, DESIGN §3.12).
 */
export function admissionRefusal(
  admission: RefusedAdmission,
  command: { fence: bigint | null; key: string | null; entity: string | null },
  reconciling: { retryAfterMs: number } | null = null,
): Refusal {
  const { fence, key, entity } = command;
  switch (admission.outcome) {
    case 'stale-fence':
      return {
        code: 'stale-fence',
        detail: `fence ${fence} is older than fence ${admission.currentFence} already accepted for this entity`,
        extras: { entity, presented_fence: fence?.toString() ?? null, current_fence: admission.currentFence.toString() },
      };
    case 'idempotency-key-reused':
      return {
        code: 'idempotency-key-reused',
        detail: 'this idempotency key was used for a different request (method, path, content type, body, entity or the credentials sent differ)',
        extras: { idempotency_key: key },
      };
    case 'idempotency-in-progress':
      return {
        code: 'idempotency-in-progress',
        detail: 'a request with this idempotency key is still in progress; retry later or send Prefer: wait=N',
        extras: { idempotency_key: key, retry_after: retryAfterSeconds(admission.retryAfterMs) },
      };
    case 'outcome-unknown':
      if (reconciling !== null)
        return {
          code: 'outcome-unknown',
          detail:
            "an earlier attempt with this key may have reached the upstream; the gateway is asking the upstream's status endpoint: send the same request again after Retry-After",
          extras: { idempotency_key: key, reconciling: true, retry_after: retryAfterSeconds(reconciling.retryAfterMs) },
        };
      return {
        code: 'outcome-unknown',
        detail: 'an earlier attempt with this key may have reached the upstream; it needs an operator or an upstream check, not a blind retry',
        extras: { idempotency_key: key },
      };
    case 'entity-busy':
      return {
        code: 'entity-busy',
        detail: 'another request for this entity is in flight (serial mode)',
        extras: { entity, retry_after: retryAfterSeconds(admission.retryAfterMs) },
      };
  }
}
