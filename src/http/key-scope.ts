import type { Config, RouteConfig } from '../config/schema.js';
import { formatIdempotencyKey } from '../protocol/headers.js';
import type { Reply } from './inbound.js';
import type { Logger } from './logger.js';
import { setHeader } from './settle.js';

/**
 * Whose key a key is (DESIGN §3.5: the store compares keys within a scope).
 * Always the route's; with caller auth, the caller's within it; with
 * `keyScope`, also the scope header's value or the verified token's claim
 * (a tenant), so that callers who share one credential, or none, or one
 * `sub` across tenants, do not share one key space. The parts are joined
 * with NUL, which no route name, scope value or (in practice) caller id
 * contains; the `key-scope:` (header) and `key-claim:` (claim) marks keep a
 * scope value from ever reading as a caller id, or a claim's value as the
 * same text sent in a header.
 */
export function keyScopeOf(route: RouteConfig, caller: string | null, keyScope: string | null): string {
  const base = caller === null ? route.name : `${route.name}\u0000${caller}`;
  if (keyScope === null) return base;
  const mark = route.keyScope !== undefined && 'claim' in route.keyScope ? 'key-claim:' : 'key-scope:';
  return `${base}\u0000${mark}${keyScope}`;
}

/** The token claim that scopes this route's keys (`keyScope: { claim }`), or null: none, a header scope, or no keys. */
export function claimScopeOf(route: RouteConfig | null): string | null {
  if (route === null || route.keyScope === undefined || !('claim' in route.keyScope) || route.idempotency === 'off') return null;
  return route.keyScope.claim;
}

/**
 * One warning line at start-up per route whose keys are global: no caller
 * auth, so any two callers that pick one key (`1`, an order number) share its
 * stored answer, and one caller can read another's replay. `keyScope` alone
 * does not end that: without auth its header is whatever the caller sends,
 * so a caller who sends another tenant's value is in that tenant's key space
 * and is handed its replays. It scopes keys only when a trusted proxy in
 * front sets the header and drops the client's own copy (README "Key rules").
 */
export function warnGlobalKeys(config: Config, logger: Logger): void {
  if (config.auth !== undefined) return;
  for (const route of config.routes) {
    if (route.idempotency === 'off') continue;
    // A claim scope needs auth (the config refuses it without), so it never gets here.
    if (route.keyScope !== undefined && 'claim' in route.keyScope) continue;
    const reason =
      route.keyScope === undefined
        ? 'no auth and no keyScope: every caller of this route shares one key space; configure auth or keyScope'
        : `no auth: the keyScope header ${route.keyScope.header} is whatever the caller sends, so a caller can use another tenant's key space; it must be set by a trusted proxy that strips the client's copy, or configure auth`;
    logger.warn('global-keys', { route: route.name, reason });
  }
}

/** With `echoKey`: the key in the route's key header, on first and replayed answers, in a form that reads back as the same key. */
export function echoKey(reply: Reply, route: RouteConfig, key: string | null): void {
  if (route.echoKey && key !== null) setHeader(reply, route.idempotencyHeader.toLowerCase(), formatIdempotencyKey(key));
}
