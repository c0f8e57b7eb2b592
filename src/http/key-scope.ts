import { createHash, createHmac } from 'node:crypto';
import type { Config, RouteConfig } from '../config/schema.js';
import { ConfigError } from '../config/load.js';
import { credentialHeaderCollision, formatIdempotencyKey } from '../protocol/headers.js';
import type { HeaderReader, Reply } from './inbound.js';
import type { Logger } from './logger.js';
import { setHeader } from './pipeline/reply.js';

/**
 * Whose key a key is (DESIGN §3.5: the store compares keys within a scope).
 * Always the route's; with caller auth, the caller's within it; with
 * `keyScope`, also the scope header's value or the verified token's claim
 * (a tenant), so that callers who share one credential, or none, or one
 * `sub` across tenants, do not share one key space; and, on a route with
 * `credentialBinding: "scope"`, the hash of the credentials the upstream
 * sees (`credentials`, credentialBindingOf), so that callers the upstream
 * tells apart never share one. The parts are joined
 * with NUL, which no route name, scope value or (in practice) caller id
 * contains; the `key-scope:` (header), `key-claim:` (claim) and `cred:`
 * marks keep one part from ever reading as another. A request with no
 * credentials has the scope it had before credentials entered it, so its
 * records and replays are the same.
 */
export function keyScopeOf(route: RouteConfig, caller: string | null, keyScope: string | null, credentials: string | null = null): string {
  let scope = caller === null ? route.name : `${route.name}\u0000${caller}`;
  if (keyScope !== null) scope += `\u0000${route.keyScope !== undefined && 'claim' in route.keyScope ? 'key-claim:' : 'key-scope:'}${keyScope}`;
  if (credentials !== null) scope += `\u0000cred:${credentials}`;
  return scope;
}

/** How credentials are hashed for fingerprints and key scopes: HMAC-SHA256 under `credentialHashKey`, or (none configured) a domain-separated SHA-256. */
export interface CredentialHashing {
  /** The gateway checks caller auth: the caller's `Authorization` is its own (the caller id scopes keys) and is never forwarded. */
  auth: boolean;
  key: Uint8Array | null;
}

/** The hash's domain: no other digest fencegate makes (fingerprints, body digests, endpoint keys) starts with it. */
const CREDENTIAL_DOMAIN = 'fencegate/key-scope/credentials/v1\u0000';

/**
 * The hash of the credentials the upstream sees on this request, or null
 * when it carries none: `Authorization` (without caller auth; with it the
 * gateway checks and drops that header) and the route's `credentialHeaders`,
 * each by lower-case name with its value as received (repeated fields joined
 * as `Headers.get` joins them), absent ones as null. An upstream that
 * authenticates its clients (an API key per customer, an MCP server's
 * OAuth token) tells its clients apart by them; without this, two callers
 * who pick the same key would share one stored answer, and one would be
 * handed the other's result (DESIGN §2 G2). Where the hash goes is the
 * route's `credentialBinding` (credentialBindingOf).
 *
 * HMAC-SHA256 under the configured `credentialHashKey`: the table then holds
 * a value that no one without the key can test a guessed credential against
 * (an API key of few bits, a password in Basic auth). Without the key the
 * hash is SHA-256 over the domain and the credentials: it hides a
 * high-entropy token but lets a reader of the table confirm a guess, which
 * the start-up warning `credential-hash-unkeyed` says (docs/auth-audit.md).
 * The key must be the same on every replica and across restarts, or a retry
 * lands in another scope and runs again.
 */
export function credentialScopeOf(route: RouteConfig, headers: HeaderReader, hashing: CredentialHashing): string | null {
  const names = credentialNamesOf(route, hashing.auth);
  if (names.length === 0) return null;
  const values = names.map((n) => headers.get(n));
  if (values.every((v) => v === null)) return null;
  const material = CREDENTIAL_DOMAIN + JSON.stringify(names.map((n, i) => [n, values[i]]));
  const hash = hashing.key !== null ? createHmac('sha256', hashing.key) : createHash('sha256');
  return hash.update(material, 'utf8').digest('hex');
}

/**
 * The request headers whose values are the credentials the upstream sees
 * (lower case): the route's `credentialHeaders` (the config refuses one that
 * does not reach the upstream as sent) and the caller's `Authorization`
 * where it reaches the upstream: not with caller auth (checked and
 * dropped), nor when the route's `stripHeaders` lists it or its
 * `upstreamHeaders` sets it (the gateway's own credential then replaces
 * the caller's). A header the upstream never sees tells no two of its
 * clients apart; binding it would refuse a retry whose caller-side token
 * changed (422), or with `"scope"` run that retry a second time, although
 * the upstream saw one credential both times.
 */
function credentialNamesOf(route: RouteConfig, auth: boolean): readonly string[] {
  const cache = auth ? namesWithAuth : namesWithoutAuth;
  let names = cache.get(route);
  if (names === undefined) {
    const list = credentialHeaderCollision(route, 'Authorization', { auth }) === null ? ['authorization'] : [];
    for (const h of route.credentialHeaders) if (!list.includes(h.toLowerCase())) list.push(h.toLowerCase());
    cache.set(route, (names = list));
  }
  return names;
}
const namesWithAuth = new WeakMap<RouteConfig, readonly string[]>();
const namesWithoutAuth = new WeakMap<RouteConfig, readonly string[]>();

/** The credential hash of a request, placed as the route's `credentialBinding` says: in the fingerprint or in the key scope. */
export interface CredentialBinding {
  scope: string | null;
  fingerprint: string | null;
}

/**
 * `fingerprint` (the default): the hash enters the request fingerprint
 * (../core/fingerprint.ts, DESIGN §3.4), so the key's record is bound to the
 * credentials that made it. Another caller under the key (other
 * credentials, or none where the first had some, or the reverse) is 422
 * `idempotency-key-reused`: never handed the first one's answer, never run
 * a second time. That is also what a retry gets whose credentials changed
 * between attempts (an OAuth token refreshed, a worker taking over another's
 * job with its own token, a record stored before credentials counted): a
 * visible refusal, not a second execution, which in the scope it would be,
 * since a new scope holds no record to replay or refuse. For the same reason
 * the auth code refuses to scope keys by a claim that changes with every
 * token (PER_TOKEN_CLAIMS in ../config/schema.ts).
 *
 * `scope`: the hash enters the key scope (keyScopeOf), each credential set
 * its own key space, as Stripe scopes keys per API key: right only for
 * credentials that never change between a command's attempts.
 */
export function credentialBindingOf(route: RouteConfig, headers: HeaderReader, hashing: CredentialHashing): CredentialBinding {
  const hash = credentialScopeOf(route, headers, hashing);
  return route.credentialBinding === 'scope' ? { scope: hash, fingerprint: null } : { scope: null, fingerprint: hash };
}

/** The configured `credentialHashKey`, read once at start-up; a missing variable stops it. */
export function credentialHashKeyOf(config: Config, env: Record<string, string | undefined>): Uint8Array | null {
  const spec = config.credentialHashKey;
  if (spec === undefined) return null;
  const text = typeof spec === 'string' ? spec : env[spec.env];
  if (text === undefined || text === '')
    throw new ConfigError(`invalid configuration:\n  credentialHashKey: environment variable ${(spec as { env: string }).env} is not set`, [
      'credentialHashKey',
    ]);
  if (text.length < 32) throw new ConfigError('invalid configuration:\n  credentialHashKey: must be at least 32 characters (256 bits)', ['credentialHashKey']);
  return new TextEncoder().encode(text);
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
 * front sets the header and drops the client's own copy (docs/http-api.md "Key rules").
 */
export function warnGlobalKeys(config: Config, logger: Logger): void {
  if (config.auth !== undefined) return;
  let keyed = false;
  for (const route of config.routes) {
    if (route.idempotency === 'off') continue;
    keyed = true;
    // A claim scope needs auth (the config refuses it without), so it never gets here.
    if (route.keyScope !== undefined && 'claim' in route.keyScope) continue;
    // Credentials bind records (or scope keys) only when the caller sends them: callers that send none still share one key space.
    const credentials = [...(credentialNamesOf(route, false).includes('authorization') ? ['Authorization'] : []), ...route.credentialHeaders].join(', ');
    const bound =
      credentials === ''
        ? "every caller shares one key space and its stored answers: no credential of the caller reaches the upstream (the route's stripHeaders or upstreamHeaders replace Authorization), so none binds a record"
        : route.credentialBinding === 'scope'
          ? `keys are scoped by the caller's credentials (${credentials}) only, so every caller that sends none shares one key space`
          : `every caller shares one key space: a record answers only the credentials (${credentials}) that made it, others get 422, but callers that send none share stored answers and any caller can take a key another one will use`;
    const reason =
      route.keyScope === undefined
        ? `no auth and no keyScope: ${bound}; configure auth or keyScope`
        : `no auth: the keyScope header ${route.keyScope.header} is whatever the caller sends, so a caller can use another tenant's key space; it must be set by a trusted proxy that strips the client's copy, or configure auth`;
    logger.warn('global-keys', { route: route.name, reason });
  }
  if (keyed && config.credentialHashKey === undefined) {
    logger.warn('credential-hash-unkeyed', {
      reason:
        'no credentialHashKey: the credentials that bind records are hashed into fingerprints (or key scopes) as an unkeyed SHA-256, against which a reader of the table can confirm a guessed low-entropy credential (an API key, a password); configure credentialHashKey',
    });
  }
}

/** With `echoKey`: the key in the route's key header, on first and replayed answers, in a form that reads back as the same key. */
export function echoKey(reply: Reply, route: RouteConfig, key: string | null): void {
  if (route.echoKey && key !== null) setHeader(reply, route.idempotencyHeader.toLowerCase(), formatIdempotencyKey(key));
}
