import type { RouteConfig } from '../../config/schema.js';
import type { Refusal } from '../../protocol/problem.js';
import type { GatewayStore } from '../../store/types.js';
import { claimScopeOf } from '../key-scope.js';
import type { Logger } from '../logger.js';
import { checkBearer, type TokenVerifier } from '../middleware/auth/index.js';
import { resourceMetadataUrl } from '../../protocol/resource-metadata.js';
import { logAuthRefusal } from '../refusal-log.js';
import type { Exchange } from './exchange.js';

// Stage 2 of the decision order (DESIGN §3.2): caller auth, when `auth` is
// configured. After the route (a path no route takes is 404 first, and is
// never asked for a token) and before anything of the command is read.

export type Authenticated = { ok: true; caller: string; claims: Readonly<Record<string, string>> } | { ok: false; refusal: Refusal; challenge: string };

/**
 * A bearer token with the `fencegate:proxy` scope, and the claim the
 * route's `keyScope` reads (403 without it, before anything is stored).
 * A refusal is written to the rejection log before it is answered. With
 * `auth.resource` its challenge names the protected resource metadata
 * (`resource_metadata`, RFC 9728 §5.1), where an MCP client finds the
 * authorization server to get a token from (MCP authorization, 2025-06-18).
 */
export function createAuthStage(deps: { verify: TokenVerifier; store: GatewayStore; logger: Logger; resource: string | null }) {
  const metadata = deps.resource === null ? '' : `, resource_metadata="${resourceMetadataUrl(deps.resource)}"`;
  return async function authenticate(x: Exchange, route: RouteConfig): Promise<Authenticated> {
    const checked = await checkBearer(deps.verify, x.req.headers.get('authorization'), 'fencegate:proxy', claimScopeOf(route), 'fencegate', x.requestId);
    if (checked.ok) return { ok: true, caller: checked.caller.id, claims: checked.caller.claims };
    // The path only, in the form the proxy routes: a query can carry a token (`?access_token=`).
    await logAuthRefusal(deps, checked.refusal, { clientRequestId: x.clientRequestId, method: x.req.method, path: x.pathname });
    return { ok: false, refusal: { code: checked.refusal.code, detail: checked.detail }, challenge: checked.challenge + metadata };
  };
}
