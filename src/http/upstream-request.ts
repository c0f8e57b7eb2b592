import type { RouteConfig } from '../config/schema.js';
import type { HeaderReader } from './inbound.js';
import { OVERRIDE_FIELDS, overrideHeaderName } from '../protocol/headers.js';
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
  const overrides = overridesStripped(route);
  const out: Record<string, string> = {};
  incoming.forEach((value, name) => {
    if (isHopByHop(name, conn) || strip.has(name)) return;
    // A path or method override would have the upstream act on what the
    // gateway did not decide (../protocol/headers.ts OVERRIDE_FIELDS);
    // `X_Original_URL` too, which CGI-style stacks read as the same field.
    if (name.charCodeAt(0) === 0x78 /* x */ && overrides.has(overrideHeaderName(name))) return;
    out[name] = value;
  });
  // Pass the fencing context on, so a cooperating upstream can check it too.
  if (command.entity !== null) out['x-fence-entity'] = command.entity;
  if (command.fence !== null) out[route.fenceHeader.toLowerCase()] = command.fence.toString();
  out['x-request-id'] = command.requestId;
  for (const [name, value] of Object.entries(deps.upstreamHeaders.get(route.name) ?? {})) out[name.toLowerCase()] = value;
  return out;
}

const OVERRIDE_HEADERS = OVERRIDE_FIELDS.filter((f) => f.startsWith('X-')).map((f) => f.toLowerCase());
const NO_OVERRIDES_ALLOWED: ReadonlySet<string> = new Set(OVERRIDE_HEADERS);
const strippedByRoute = new WeakMap<RouteConfig, ReadonlySet<string>>();

/** The override headers (lower case) not forwarded for `route`: all but those its `allowOverrides` names. */
function overridesStripped(route: RouteConfig): ReadonlySet<string> {
  if (route.allowOverrides.length === 0) return NO_OVERRIDES_ALLOWED;
  let set = strippedByRoute.get(route);
  if (set === undefined) {
    const allowed = new Set(route.allowOverrides.map((n) => n.toLowerCase()));
    set = new Set(OVERRIDE_HEADERS.filter((h) => !allowed.has(h)));
    strippedByRoute.set(route, set);
  }
  return set;
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
