import type { Context, MiddlewareHandler } from 'hono';
import { ConfigError } from '../config/load.js';
import type { Config } from '../config/schema.js';
import { checkKeys, KeyConfigError, verificationKeys } from '../protocol/keys.js';
import type { GatewayStore } from '../store/types.js';
import { renderRefusal, toResponse } from './errors.js';
import type { Logger } from './logger.js';
import { createTokenVerifier, jwtAuth, type AuthRefusal, type TokenVerifier } from './middleware/auth/index.js';
import { normalizePath } from './path.js';
import { logAuthRefusal } from './refusal-log.js';
import { clientRequestIdOf } from './request-id.js';
import { createSignedFenceCheck, type SignedFenceCheck } from './signed-fence.js';

export interface Security {
  /** Caller auth, when `auth` is configured. */
  auth: {
    /** The bearer-token verifier: the proxied request's auth stage (./pipeline/auth.ts) checks `fencegate:proxy` with it. */
    verify: TokenVerifier;
    /** `/v1`: `fencegate:audit` to read, `fencegate:admin` to write. */
    admin: MiddlewareHandler;
    /** `/metrics`: `fencegate:audit`. */
    metrics: MiddlewareHandler;
  } | null;
  checkSignedFence: SignedFenceCheck | undefined;
}

export interface SecurityOptions {
  config: Config;
  store: GatewayStore;
  logger: Logger;
  problemBase: string;
  env: Record<string, string | undefined>;
}

/**
 * Builds the gateway's security pieces from the config, once, at start-up:
 * the bearer-token verifier and the admin API's middlewares (`auth`) and the signed-fence check
 * (`fence.signed`). A key that cannot be resolved (a missing environment
 * variable) stops start-up with a ConfigError naming the field; a public key
 * that does not import is logged at start-up (and every token it should
 * verify is refused).
 */
export function createSecurity(options: SecurityOptions): Security {
  const { config, store, logger, problemBase } = options;
  try {
    const checkSignedFence =
      config.fence.signed === undefined ? undefined : createSignedFenceCheck({ config: config.fence.signed, env: options.env, store, logger });
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
    // The path only, in the form the proxy routes: a query can carry a token (`?access_token=`).
    const onRefused = (c: Context, r: AuthRefusal) =>
      logAuthRefusal({ store, logger }, r, {
        clientRequestId: clientRequestIdOf(c.req.raw),
        method: c.req.method,
        path: normalizePath(new URL(c.req.url).pathname),
      });
    const adminRender = (_c: Context, refusal: Parameters<typeof renderRefusal>[0]) => toResponse(renderRefusal(refusal, null, problemBase));
    const admin = jwtAuth({
      verify,
      scope: (c) => (c.req.method === 'GET' || c.req.method === 'HEAD' ? 'fencegate:audit' : 'fencegate:admin'),
      render: adminRender,
      onRefused,
    });
    const metrics = jwtAuth({ verify, scope: 'fencegate:audit', render: adminRender, onRefused });
    return { auth: { verify, admin, metrics }, checkSignedFence };
  } catch (err) {
    if (err instanceof KeyConfigError) throw new ConfigError(`invalid configuration:\n  ${err.message}`, [err.message], { cause: err });
    throw err;
  }
}
