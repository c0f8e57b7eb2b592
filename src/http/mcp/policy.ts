import type { RouteConfig } from '../../config/schema.js';
import { isObject } from './message.js';

// Which tools an mcp route decides, and how (docs/mcp.md "Per-tool policy").

/** Most tools remembered per route from `tools/list` answers: the upstream's list, not the caller, sizes it, but it stays bounded. */
const MAX_LEARNED_TOOLS = 10_000;

/** The route as one tool's call is decided: the route's fields with the tool's (then `"*"`'s) overrides. */
export interface ToolPolicy {
  route: RouteConfig;
  /** Passed through undecided: no fence, no key, nothing stored. */
  readOnly: boolean;
  /** Why, for the log: `config` or `annotations`. */
  readOnlyFrom: 'config' | 'annotations' | null;
}

/**
 * `readOnlyHint` per tool name, per route, as the upstream's `tools/list`
 * answers said it. In memory: a restarted gateway decides every tool again
 * until it sees a list (a tool never listed is side-effecting).
 */
export class ToolAnnotations {
  private readonly byRoute = new Map<string, Map<string, boolean>>();

  readOnly(route: string, tool: string): boolean | undefined {
    return this.byRoute.get(route)?.get(tool);
  }

  known(route: string, tool: string): boolean {
    return this.byRoute.get(route)?.has(tool) ?? false;
  }

  /** Reads a `tools/list` result (`{ tools: [{ name, annotations }] }`); anything else is ignored. */
  learn(route: string, result: unknown): void {
    if (!isObject(result) || !Array.isArray(result.tools)) return;
    let tools = this.byRoute.get(route);
    if (tools === undefined) this.byRoute.set(route, (tools = new Map()));
    for (const t of result.tools) {
      // A name no tools/call could carry (./message.ts: at most 256 characters, no control characters) is not remembered.
      if (!isObject(t) || typeof t.name !== 'string' || t.name.length === 0 || t.name.length > 256 || /[\u0000-\u001f\u007f]/.test(t.name)) continue;
      if (!tools.has(t.name) && tools.size >= MAX_LEARNED_TOOLS) continue;
      // Only an explicit `true` is read-only: the hint's default is false (MCP 2025-06-18 ToolAnnotations).
      tools.set(t.name, isObject(t.annotations) && t.annotations.readOnlyHint === true);
    }
  }
}

/**
 * The tool's policy: the tool's own entry, else `"*"`, over the route.
 * `readOnly` from the config (the tool's, else `"*"`'s) wins over the
 * server's hint: hints are the server's claims, which MCP says not to trust
 * from an untrusted server. A tool with neither is side-effecting.
 */
export function toolPolicy(route: RouteConfig, tool: string, annotations: ToolAnnotations): ToolPolicy {
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
  const hint = annotations.readOnly(route.name, tool) === true;
  return { route: merged, readOnly: hint, readOnlyFrom: hint ? 'annotations' : null };
}
