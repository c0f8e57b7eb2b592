import { createHash } from 'node:crypto';
import type { RouteConfig } from '../../config/schema.js';
import { isObject } from './message.js';

// Which tools an mcp route decides, and how (docs/mcp.md "Per-tool policy").

/** Most tools remembered per route from `tools/list` answers, over all its endpoints: the upstream's lists, not the caller, size it, but it stays bounded. */
const MAX_LEARNED_TOOLS = 10_000;
/**
 * Most endpoints remembered per route. The endpoint is the caller's path
 * and query, so a caller could name endless ones; each is kept as a 64-byte
 * digest (never cut: two endpoints sharing a key would let one's read-only
 * tool pass on the other), and one whose list taught no tool is not kept.
 */
const MAX_LEARNED_ENDPOINTS = 1_000;

/** The endpoint's key: sha256 of its path and query as sent upstream, so a long query costs no memory. */
const endpointKey = (endpoint: string) => createHash('sha256').update(endpoint).digest('hex');

/** The route as one tool's call is decided: the route's fields with the tool's (then `"*"`'s) overrides. */
export interface ToolPolicy {
  route: RouteConfig;
  /** Passed through undecided: no fence, no key, nothing stored. */
  readOnly: boolean;
  /** Why, for the log: `config` or `annotations`. */
  readOnlyFrom: 'config' | 'annotations' | null;
}

/**
 * `readOnlyHint` per tool name, per route and endpoint, as the upstream's
 * `tools/list` answers said it. The endpoint is the path and query the
 * message goes to upstream (normal form, ../path.ts): a route matching
 * `/mcp/*` may front several MCP servers, and a name read-only on one is
 * another server's tool on the next, so what one endpoint's list says
 * applies to calls to that endpoint alone. In memory: a restarted gateway
 * decides every tool again until it sees a list (a tool never listed is
 * side-effecting). When a route's endpoints together pass
 * MAX_LEARNED_TOOLS tools, or MAX_LEARNED_ENDPOINTS endpoints, the
 * endpoint whose list came longest ago is forgotten first (forgetting only
 * ever decides a tool again).
 */
export class ToolAnnotations {
  private readonly byRoute = new Map<string, { size: number; endpoints: Map<string, Map<string, boolean>> }>();

  readOnly(route: string, endpoint: string, tool: string): boolean | undefined {
    return this.byRoute.get(route)?.endpoints.get(endpointKey(endpoint))?.get(tool);
  }

  known(route: string, endpoint: string, tool: string): boolean {
    return this.byRoute.get(route)?.endpoints.get(endpointKey(endpoint))?.has(tool) ?? false;
  }

  /** Reads a `tools/list` result (`{ tools: [{ name, annotations }] }`) answered at `endpoint`; anything else is ignored. */
  learn(route: string, endpoint: string, result: unknown): void {
    if (!isObject(result) || !Array.isArray(result.tools)) return;
    let learnt = this.byRoute.get(route);
    if (learnt === undefined) this.byRoute.set(route, (learnt = { size: 0, endpoints: new Map() }));
    const key = endpointKey(endpoint);
    let tools = learnt.endpoints.get(key);
    if (tools === undefined) {
      while (learnt.endpoints.size >= MAX_LEARNED_ENDPOINTS && forgetOldest(learnt, key));
      learnt.endpoints.set(key, (tools = new Map()));
    } else {
      // Listed again: now the endpoint listed last, so that callers inventing
      // endpoints (a query string each) push out each other before the
      // endpoint the agents actually list.
      learnt.endpoints.delete(key);
      learnt.endpoints.set(key, tools);
    }
    for (const t of result.tools) {
      // A name no tools/call could carry (./message.ts: at most 256 characters, no control characters) is not remembered.
      if (!isObject(t) || typeof t.name !== 'string' || t.name.length === 0 || t.name.length > 256 || /[\u0000-\u001f\u007f]/.test(t.name)) continue;
      if (!tools.has(t.name)) {
        while (learnt.size >= MAX_LEARNED_TOOLS && forgetOldest(learnt, key));
        if (learnt.size >= MAX_LEARNED_TOOLS) continue;
        learnt.size++;
      }
      // Only an explicit `true` is read-only: the hint's default is false (MCP 2025-06-18 ToolAnnotations).
      tools.set(t.name, isObject(t.annotations) && t.annotations.readOnlyHint === true);
    }
    if (tools.size === 0) learnt.endpoints.delete(key);
  }
}

/** Drops the endpoint listed longest ago other than `keep`; false when there is none (`keep` alone holds the route's budget). */
function forgetOldest(learnt: { size: number; endpoints: Map<string, Map<string, boolean>> }, keep: string): boolean {
  for (const [endpoint, tools] of learnt.endpoints) {
    if (endpoint === keep) continue;
    learnt.endpoints.delete(endpoint);
    learnt.size -= tools.size;
    return true;
  }
  return false;
}

/**
 * The tool's policy: the tool's own entry, else `"*"`, over the route;
 * the hint is the one learnt at `endpoint` (the call's path and query).
 * `readOnly` from the config (the tool's, else `"*"`'s) wins over the
 * server's hint: hints are the server's claims, which MCP says not to trust
 * from an untrusted server. A tool with neither is side-effecting.
 */
export function toolPolicy(route: RouteConfig, tool: string, annotations: ToolAnnotations, endpoint: string): ToolPolicy {
  const own = route.tools[tool];
  const star = route.tools['*'];
  const pick = <K extends 'fence' | 'idempotency' | 'entity' | 'mode' | 'timeoutMs' | 'retention' | 'onUnknown'>(k: K) => own?.[k] ?? star?.[k];
  const merged: RouteConfig = {
    ...route,
    fence: pick('fence') ?? route.fence,
    idempotency: pick('idempotency') ?? route.idempotency,
    entity: pick('entity') ?? route.entity,
    mode: pick('mode') ?? route.mode,
    timeoutMs: pick('timeoutMs') ?? route.timeoutMs,
    retention: pick('retention') ?? route.retention,
    onUnknown: pick('onUnknown') ?? route.onUnknown,
  };
  // `"*": { readOnly: false }` is how a route says "decide every tool, whatever the server hints".
  const configured = own?.readOnly ?? star?.readOnly;
  if (configured !== undefined) return { route: merged, readOnly: configured, readOnlyFrom: 'config' };
  const hint = annotations.readOnly(route.name, endpoint, tool) === true;
  return { route: merged, readOnly: hint, readOnlyFrom: hint ? 'annotations' : null };
}
