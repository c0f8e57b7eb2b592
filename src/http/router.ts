import type { RouteConfig } from '../config/schema.js';
import { normalizePath } from './path.js';

export interface RouteMatch {
  route: RouteConfig;
  /** Path parameters, percent-decoded. */
  params: Record<string, string>;
}

type Matcher = (segments: string[]) => Record<string, string> | null;

export type Router = (method: string, pathname: string) => RouteMatch | null;

/**
 * Compiles `match.path` patterns: literal segments match exactly, `:name`
 * matches one non-empty segment, a final `*` matches one or more characters
 * of the rest (`/payments/*` matches `/payments/x` and `/payments/x/y`, not
 * `/payments`). Routes are tried in configuration order; the first wins.
 * `pathname` must be in normal form (./path.ts `normalizePath`); so are the
 * patterns, once compiled, so `/%70ayments/*` in a config is `/payments/*`.
 */
export function createRouter(routes: RouteConfig[]): Router {
  const compiled = routes.map((route) => ({ route, methods: new Set<string>(route.match.methods), match: compile(normalizePath(route.match.path)) }));
  return (method, pathname) => {
    const segments = pathname.split('/');
    for (const c of compiled) {
      if (!c.methods.has(method)) continue;
      const params = c.match(segments);
      if (params !== null) return { route: c.route, params };
    }
    return null;
  };
}

/**
 * The first of `readings` (./path.ts `alternativeReadings`) that `router`
 * sends to another route than `matched`, or to the same route with other
 * parameters: an upstream reading the path that way would act under another
 * route's policy (a broader one, with no fence) or on another entity. A
 * reading that matches no route is not one: the gateway forwards only what
 * the matched route allows, and an encoded slash inside a parameter
 * (`/invoices/inv%2F10/pay`) stays usable while no route takes the decoded
 * path. null when every reading agrees.
 */
export function divergentReading(router: Router, method: string, matched: RouteMatch, readings: string[], folded?: Router, path?: string): string | null {
  for (const reading of readings) {
    const other = router(method, reading);
    if (other === null) continue;
    if (other.route !== matched.route || !sameParams(other.params, matched.params)) return reading;
  }
  // Case-insensitive upstreams (Express by default, ASP.NET, IIS) route
  // `/PAYMENTS/x` to the payments handler: a path or reading that, folded,
  // falls to another route than the one matched is refused too. Only the
  // route is compared: parameters keep their case (`/payments/INV-7`).
  if (folded !== undefined) {
    for (const reading of path === undefined ? readings : [path, ...readings]) {
      const other = folded(method, reading.toLowerCase());
      if (other !== null && other.route.name !== matched.route.name) return reading.toLowerCase();
    }
  }
  return null;
}

/**
 * The router as a case-insensitive upstream would match: patterns lower
 * cased, for `divergentReading` (called with lower-cased paths).
 */
export function createFoldedRouter(routes: RouteConfig[]): Router {
  return createRouter(routes.map((r) => ({ ...r, match: { ...r.match, path: r.match.path.toLowerCase() } })));
}

function sameParams(a: Record<string, string>, b: Record<string, string>): boolean {
  const keys = Object.keys(a);
  return keys.length === Object.keys(b).length && keys.every((k) => a[k] === b[k]);
}

function compile(pattern: string): Matcher {
  const parts = pattern.split('/');
  const wildcard = parts[parts.length - 1] === '*';
  if (wildcard) parts.pop();
  return (segments) => {
    if (wildcard ? segments.length <= parts.length : segments.length !== parts.length) return null;
    if (wildcard && segments.slice(parts.length).join('/') === '') return null;
    const params: Record<string, string> = {};
    for (let i = 0; i < parts.length; i++) {
      const p = parts[i]!;
      const s = segments[i]!;
      if (p.startsWith(':')) {
        if (s === '') return null;
        const decoded = safeDecode(s);
        if (decoded === null) return null;
        params[p.slice(1)] = decoded;
      } else if (p !== s) {
        return null;
      }
    }
    return params;
  };
}

function safeDecode(s: string): string | null {
  try {
    return decodeURIComponent(s);
  } catch {
    return null;
  }
}
