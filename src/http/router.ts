import type { RouteConfig } from '../config/schema.js';

export interface RouteMatch {
  route: RouteConfig;
  /** Path parameters, percent-decoded. */
  params: Record<string, string>;
}

type Matcher = (segments: string[]) => Record<string, string> | null;

/**
 * Compiles `match.path` patterns: literal segments match exactly, `:name`
 * matches one non-empty segment, a final `*` matches one or more characters
 * of the rest (`/payments/*` matches `/payments/x` and `/payments/x/y`, not
 * `/payments`). Routes are tried in configuration order; the first wins.
 */
export function createRouter(routes: RouteConfig[]): (method: string, pathname: string) => RouteMatch | null {
  const compiled = routes.map((route) => ({ route, methods: new Set<string>(route.match.methods), match: compile(route.match.path) }));
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
