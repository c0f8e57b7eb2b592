import type { Config, RouteConfig } from '../../config/schema.js';
import { resourceMetadataPath } from '../../protocol/resource-metadata.js';
import type { Refusal } from '../../protocol/problem.js';
import { MAX_READING_CHARS, normalizePath, readingsWithin } from '../path.js';
import { createFoldedRouter, createRouter, divergentReading } from '../router.js';

// Stage 1 of the decision order (DESIGN §3.1): the route, from the path in
// normal form, and one route decision per path.

/** The route, or the refusal (with the route it was matched to, when a reading of its path is what was refused). */
export type Routed = { ok: true; route: RouteConfig; params: Record<string, string> } | { ok: false; refusal: Refusal; route: RouteConfig | null };

/**
 * Whether a path is the gateway's own, served by its Hono app and never
 * proxied: the admin API under `adminPrefix` (the prefix itself, or below
 * it), and with `auth.resource` the protected resource metadata's one path
 * (`metadataPath`, RFC 9728 §3.1; see metadataPathOf). The one rule both
 * ways in apply. The admin app (Hono) routes on its own decoding of the
 * path (`decodeURI`, `%25` kept: honoReading), the proxy on the normal form;
 * a path that is the gateway's in either reading is the gateway's, so no
 * path is served by the app on one way in and proxied on the other, and a
 * path the app would not take (`/_fencegate%2Fhealth`: `decodeURI` keeps
 * `%2F`) stays a proxied path. `pathname` is as URL parsing left it.
 */
export function isAdminPath(pathname: string, adminPrefix: string, metadataPath: string | null = null): boolean {
  return inEitherReading(pathname, (p) => underPrefix(p, adminPrefix) || p === metadataPath);
}

/** The metadata part of isAdminPath alone: what the app serves the metadata document at (../gateway.ts). */
export function isMetadataPath(pathname: string, metadataPath: string): boolean {
  return inEitherReading(pathname, (p) => p === metadataPath);
}

function inEitherReading(pathname: string, test: (path: string) => boolean): boolean {
  if (test(normalizePath(pathname))) return true;
  if (!pathname.includes('%')) return false;
  if (test(honoReading(pathname))) return true;
  // A lone "%" makes Hono read the path a second way (hono/utils/url getPath); here the whole decoding stands for it, a superset.
  return /%(?![0-9A-Fa-f]{2})/.test(pathname) && test(fullyDecoded(pathname));
}

/** The protected resource metadata's path when `auth.resource` is configured (../../protocol/resource-metadata.ts), else null. */
export function metadataPathOf(config: Pick<Config, 'auth'>): string | null {
  return config.auth?.resource === undefined ? null : resourceMetadataPath(config.auth.resource);
}

export function createRouteStage(routes: RouteConfig[], adminPrefix: string, metadataPath: string | null = null) {
  const router = createRouter(routes);
  const folded = createFoldedRouter(routes);
  /** `raw` is the path as URL parsing left it, `pathname` its normal form. */
  return function route(method: string, raw: string, pathname: string, shownPath: string): Routed {
    const matched = isAdminPath(raw, adminPrefix, metadataPath) ? null : router(method, pathname);
    if (matched === null) return { ok: false, refusal: { code: 'no-route', detail: `no route for ${method} ${shownPath}` }, route: null };
    // One route decision per path: refused when an upstream could read it
    // another way that routes elsewhere (`%2F`, `%5C`, `%252F`, `;params`,
    // `a./`, `ſ`, `//`, ../path.ts READINGS). Within a bound of work
    // (../path.ts MAX_READING_CHARS): a long path with every kind of
    // ambiguity would cost tens of milliseconds.
    const readings = readingsWithin(pathname);
    if (readings === null) {
      return {
        ok: false,
        route: matched.route,
        refusal: {
          code: 'invalid-request',
          detail: `the path is ${pathname.length} characters long and can be read in too many ways (encoded or raw separators, a second decoding, path parameters, trailing dots or spaces, Unicode folding, repeated slashes) for the gateway to check them all within its bound of ${MAX_READING_CHARS} characters; send it shorter or in one unambiguous form`,
        },
      };
    }
    const divergent = divergentReading(router, method, matched, readings, folded, pathname);
    if (divergent !== null) {
      return {
        ok: false,
        route: matched.route,
        refusal: {
          code: 'invalid-request',
          detail: `the path can also be read as ${JSON.stringify(divergent.slice(0, 256))} (an encoded or raw separator, a second decoding, path parameters, trailing dots or spaces, Unicode folding, repeated slashes, case), which another route (or other parameters) would take; send it in one unambiguous form`,
        },
      };
    }
    return { ok: true, route: matched.route, params: matched.params };
  };
}

function underPrefix(path: string, prefix: string): boolean {
  return path === prefix || path.startsWith(`${prefix}/`);
}

/**
 * The path as Hono's router reads it (hono/utils/url getPath): `decodeURI`
 * (which keeps the reserved characters' escapes, `%2F` among them) with
 * `%25` kept, falling back run by run where the whole does not decode.
 */
function honoReading(path: string): string {
  const decode = (v: string) => decodeURI(v.includes('%25') ? v.replace(/%25/g, '%2525') : v);
  try {
    return decode(path);
  } catch {
    return path.replace(/(?:%[0-9A-Fa-f]{2})+/g, (run) => {
      try {
        return decode(run);
      } catch {
        return run;
      }
    });
  }
}

/** Every well-formed run of %XX decoded; malformed runs stay as they are. */
function fullyDecoded(path: string): string {
  return path.replace(/(?:%[0-9A-Fa-f]{2})+/g, (run) => {
    try {
      return decodeURIComponent(run);
    } catch {
      return run;
    }
  });
}
