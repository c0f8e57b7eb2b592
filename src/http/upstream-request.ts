import type { RouteConfig } from '../config/schema.js';
import type { HeaderReader } from './inbound.js';
import { connectionTokens, isHopByHop } from './forward.js';

// Step 6 of the decision order (DESIGN §3.6): the request the upstream gets.

/** What `upstreamHeaders` needs of the gateway: resolved credentials per route, and whether the caller's Authorization is the gateway's. */
export interface UpstreamHeaderDeps {
  upstreamHeaders: Map<string, Record<string, string>>;
  stripAuthorization: boolean;
}

export function upstreamHeaders(
  incoming: HeaderReader,
  route: RouteConfig,
  deps: UpstreamHeaderDeps,
  command: { requestId: string; entity: string | null; fence: bigint | null },
): Record<string, string> {
  // `Connection` may not strip what the gateway decided with (../http/forward.ts connectionTokens).
  // On Workers a request that came over HTTP arrives without `Connection`
  // (workerd's server drops it and keeps the fields it named), so nothing is
  // stripped here for it: the route's stripHeaders is the remedy there
  // (docs/deploy-workers.md, Hop-by-hop fields).
  const conn = connectionTokens(incoming.get('connection'), reliedOn(route));
  const strip = new Set(route.stripHeaders.map((h) => h.toLowerCase()));
  if (deps.stripAuthorization) strip.add('authorization');
  const out: Record<string, string> = {};
  incoming.forEach((value, name) => {
    if (isHopByHop(name, conn) || strip.has(name)) return;
    out[name] = value;
  });
  // Pass the fencing context on, so a cooperating upstream can check it too.
  if (command.entity !== null) out['x-fence-entity'] = command.entity;
  if (command.fence !== null) out[route.fenceHeader.toLowerCase()] = command.fence.toString();
  out['x-request-id'] = command.requestId;
  for (const [name, value] of Object.entries(deps.upstreamHeaders.get(route.name) ?? {})) out[name.toLowerCase()] = value;
  return out;
}

/** Request fields the decision used (or the upstream needs to check it): end-to-end, whatever `Connection` lists. */
function reliedOn(route: RouteConfig): string[] {
  const names = ['content-type', 'content-encoding', 'x-fence-entity', 'x-request-id', route.fenceHeader, route.idempotencyHeader];
  if ('header' in route.entity) names.push(route.entity.header);
  if (route.keyScope !== undefined && 'header' in route.keyScope) names.push(route.keyScope.header);
  return names;
}

/** `http://up:9000/base` + `/payments/x?y=1` → `http://up:9000/base/payments/x?y=1`. */
export function joinUrl(upstream: string, pathAndQuery: string): string {
  return upstream.replace(/\/+$/, '') + pathAndQuery;
}
