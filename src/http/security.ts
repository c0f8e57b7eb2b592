import type { Context, MiddlewareHandler } from 'hono';
import { ConfigError } from '../config/load.js';
import type { Config } from '../config/schema.js';
import { checkKeys, KeyConfigError, verificationKeys } from '../protocol/keys.js';
import type { GatewayStore } from '../store/types.js';
import { renderRefusal, toResponse } from './errors.js';
import type { Logger } from './logger.js';
import { createTokenVerifier, jwtAuth, type AuthRefusal } from './middleware/auth/index.js';
import type { RequestObservation } from './metrics.js';
import { claimScopeOf } from './key-scope.js';
import { normalizePath } from './path.js';
import { clientRequestIdOf } from './request-id.js';
import { createRouter } from './router.js';
import { createSignedFenceCheck, type SignedFenceCheck } from './signed-fence.js';

export interface Security {
  /** Caller auth, when `auth` is configured. */
  auth: {
    /** Step 2 of the proxy: `fencegate:proxy`; skipped when no route matches (404 comes first). */
    proxy: MiddlewareHandler;
    /** `/v1`: `fencegate:audit` to read, `fencegate:admin` to write. */
    admin: MiddlewareHandler;
    /** `/metrics`: `fencegate:audit`. */
    metrics: MiddlewareHandler;
    callerOf: (c: Context) => string | null;
    /** The verified token's claims that a route's `keyScope.claim` names (./key-scope.ts); null without a caller. */
    claimsOf: (c: Context) => Readonly<Record<string, string>> | null;
  } | null;
  checkSignedFence: SignedFenceCheck | undefined;
}

export interface SecurityOptions {
  config: Config;
  store: GatewayStore;
  logger: Logger;
  problemBase: string;
  env: Record<string, string | undefined>;
  observe?: (o: RequestObservation) => void;
}

/**
 * Builds the gateway's security pieces from the config, once, at start-up:
 * the bearer-token middlewares (`auth`) and the signed-fence check
 * (`fence.signed`). A key that cannot be resolved (a missing environment
 * variable) stops start-up with a ConfigError naming the field; a public key
 * that does not import is logged at start-up (and every token it should
 * verify is refused).
 */
export function createSecurity(options: SecurityOptions): Security {
  const { config, store, logger, problemBase } = options;
  try {
    const checkSignedFence = config.fence.signed === undefined ? undefined : createSignedFenceCheck({ config: config.fence.signed, env: options.env, store, logger });
    if (config.auth === undefined) return { auth: null, checkSignedFence };

    const keys = verificationKeys(config.auth, options.env, 'auth');
    checkKeys(keys).catch((err: Error) => logger.error('auth-keys-invalid', { error: err.message }));
    const verify = createTokenVerifier({
      keys,
      issuer: config.auth.issuer,
      audience: config.auth.audience,
      clockToleranceSec: config.auth.clockTolerance / 1000,
      callerClaim: config.auth.callerClaim,
      // Only the claims some route scopes keys by are kept on the caller, never the whole payload.
      claims: config.routes.flatMap((r) => (r.keyScope !== undefined && 'claim' in r.keyScope ? [r.keyScope.claim] : [])),
    });

    // Refusals are logged for auditors: who (if the token was valid), what, why; never the token.
    // Proxy refusals also count in fencegate_requests_total (admin ones do not: they are not proxied requests).
    const onRefused = (proxyRoute: (() => string | null) | null) => async (c: Context, r: AuthRefusal) => {
      // The path only, in the form the proxy routes: a query can carry a token (`?access_token=`).
      const path = normalizePath(new URL(c.req.url).pathname);
      if (proxyRoute) options.observe?.({ route: proxyRoute(), decision: r.code, status: r.code === 'forbidden' ? 403 : 401, totalMs: 0, upstreamMs: undefined });
      await store.recordRejection({
        reason: r.code,
        entity: null,
        presentedFence: null,
        currentFence: null,
        idempotencyKey: null,
        audit: { requestId: r.requestId, clientRequestId: clientRequestIdOf(c.req.raw), caller: r.callerId, method: c.req.method, path, payloadSha256: '' },
        detail: r.tokenSha256 === null ? r.why : `${r.why}; token sha256 ${r.tokenSha256}`,
      });
    };

    const router = createRouter(config.routes);
    // The proxy's own route decision (normal form), so a path that only an encoding kept off a route is not let through unauthenticated.
    const routeOf = (c: Context) => router(c.req.method, normalizePath(new URL(c.req.url).pathname))?.route ?? null;
    const proxy = jwtAuth({
      verify,
      scope: 'fencegate:proxy',
      when: (c) => routeOf(c) !== null,
      claim: (c) => claimScopeOf(routeOf(c)),
      render: (c, refusal) => toResponse(renderRefusal(refusal, routeOf(c)?.errors ?? null, problemBase)),
      onRefused: (c, r) => onRefused(() => routeOf(c)?.name ?? null)(c, r),
    });
    const adminRender = (_c: Context, refusal: Parameters<typeof renderRefusal>[0]) => toResponse(renderRefusal(refusal, null, problemBase));
    const admin = jwtAuth({
      verify,
      scope: (c) => (c.req.method === 'GET' || c.req.method === 'HEAD' ? 'fencegate:audit' : 'fencegate:admin'),
      render: adminRender,
      onRefused: onRefused(null),
    });
    const metrics = jwtAuth({ verify, scope: 'fencegate:audit', render: adminRender, onRefused: onRefused(null) });
    return { auth: { proxy, admin, metrics, callerOf: (c) => c.get('caller')?.id ?? null, claimsOf: (c) => c.get('caller')?.claims ?? null }, checkSignedFence };
  } catch (err) {
    if (err instanceof KeyConfigError) throw new ConfigError(`invalid configuration:\n  ${err.message}`, [err.message], { cause: err });
    throw err;
  }
}
