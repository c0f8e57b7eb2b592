import type { Context, MiddlewareHandler } from 'hono';
import { parseEntity } from '../../../protocol/headers.js';
import { renderProblem, type Refusal } from '../../../protocol/problem.js';
import { newRequestId } from '../../request-id.js';
import { hasScope, SCOPES, type Caller, type Scope, type TokenVerifier } from './verify.js';

/** A refused request, as handed to `onRefused` for the rejection log. Never the token. */
export interface AuthRefusal {
  code: 'unauthorized' | 'forbidden';
  /** Why, safe to log: "expired", "wrong audience", "missing scope fencegate:proxy", "no string or integer claim tid", … */
  why: string;
  /** The verified caller (403 only); a 401's claims are not trusted, so null. */
  callerId: string | null;
  /** First 16 hex digits of sha256(token), to correlate repeated attempts; null without a token. */
  tokenSha256: string | null;
  requestId: string;
}

export interface JwtAuthOptions {
  verify: TokenVerifier;
  /** The scope every request needs, or a function of the request (e.g. `fencegate:admin` for writes). */
  scope: Scope | ((c: Context) => Scope);
  /** Renders a refusal. Default: problem+json with `/_fencegate/problems/` types. */
  render?: (c: Context, refusal: Refusal) => Response;
  /** Called once per refusal before it is answered (to write the rejection log); its failure does not change the answer. */
  onRefused?: (c: Context, refusal: AuthRefusal) => void | Promise<void>;
  /** When given and false for a request, the middleware lets it through untouched (e.g. no route matched: 404 comes first). */
  when?: (c: Context) => boolean;
  /** `realm` of `WWW-Authenticate`. Default `fencegate`. */
  realm?: string;
  /**
   * The claim this request needs on the token besides the scope (a route's
   * `keyScope.claim`), or null. The verifier must keep it (its `claims`
   * option). A token without it as a string (or integer), or whose value
   * breaks the key-scope rules, is refused 403 `forbidden`.
   */
  claim?: (c: Context) => string | null;
}

const BEARER = /^Bearer +([A-Za-z0-9\-._~+/]+=*) *$/i;

/**
 * `Authorization: Bearer <JWT>` for Hono (DESIGN §3 step 2). Verifies the
 * token (see `createTokenVerifier`), checks the scope, and sets
 * `c.get('caller')`. Refusals: 401 `unauthorized` (no token, bad signature,
 * `alg: none`, expired, wrong issuer or audience) and 403 `forbidden`
 * (valid token, missing scope), with `WWW-Authenticate` (RFC 6750).
 *
 * @example
 * app.use('/v1/*', jwtAuth({ verify: createTokenVerifier({ keys, issuer, audience }), scope: 'fencegate:audit' }));
 */
export function jwtAuth(options: JwtAuthOptions): MiddlewareHandler {
  const { verify, when, onRefused, claim: claimOf } = options;
  if (typeof options.scope === 'string' && !(SCOPES as readonly string[]).includes(options.scope)) {
    throw new TypeError(`jwtAuth: unknown scope "${options.scope}" (expected one of ${SCOPES.join(', ')})`);
  }
  const scopeOf = typeof options.scope === 'function' ? options.scope : () => options.scope as Scope;
  const realm = options.realm ?? 'fencegate';
  const render =
    options.render ??
    ((_c: Context, refusal: Refusal) => {
      const r = renderProblem(refusal);
      return new Response(r.body, { status: r.status, headers: r.headers });
    });

  return async function authenticate(c, next) {
    if (when !== undefined && !when(c)) return next();
    const checked = await checkBearer(verify, c.req.header('authorization') ?? null, scopeOf(c), claimOf?.(c) ?? null, realm);
    if (checked.ok) {
      c.set('caller', checked.caller);
      return next();
    }
    const { refusal, challenge } = checked;
    if (onRefused !== undefined) {
      try {
        await onRefused(c, refusal);
      } catch {
        // The refusal stands whether or not it could be logged.
      }
    }
    const res = render(c, { code: refusal.code, detail: checked.detail, extras: { request_id: refusal.requestId } });
    res.headers.set('www-authenticate', challenge);
    res.headers.set('x-request-id', refusal.requestId);
    return res;
  };
}

/** A bearer check's answer: the caller, or the refusal with its `WWW-Authenticate` challenge (RFC 6750 §3) and its detail. */
export type BearerCheck = { ok: true; caller: Caller } | { ok: false; refusal: AuthRefusal; challenge: string; detail: string };

/**
 * The bearer check itself, with no framework around it: the token in
 * `authorization` verified, `scope` held, and `claim` (a route's
 * `keyScope.claim`, or null) present. The proxied request's auth stage
 * (../../pipeline/auth.ts) and `jwtAuth` (the admin API's middleware) both
 * call it. `requestId` files the refusal; by default a fresh one.
 */
export async function checkBearer(
  verify: TokenVerifier,
  authorization: string | null,
  scope: Scope,
  claim: string | null,
  realm = 'fencegate',
  requestId: string = newRequestId(),
): Promise<BearerCheck> {
  const token = authorization === null ? null : (BEARER.exec(authorization)?.[1] ?? null);
  let refusal: Omit<AuthRefusal, 'requestId' | 'tokenSha256'>;
  let challenge: string;
  let detail: string;
  if (token === null) {
    refusal = { code: 'unauthorized', why: authorization === null ? 'no bearer token' : 'the Authorization header is not "Bearer <token>"', callerId: null };
    challenge = `Bearer realm="${realm}"`;
    detail = `a valid bearer token is required (${refusal.why})`;
  } else {
    const check = await verify(token);
    if (check.ok && hasScope(check.caller, scope)) {
      const lacking = missingClaim(check.caller, claim);
      if (lacking === null) return { ok: true, caller: check.caller };
      // A valid token that cannot say whose keys these are: 403, before
      // anything is stored (DESIGN §3.5), and logged like a missing scope.
      refusal = { code: 'forbidden', why: lacking, callerId: check.caller.id };
      challenge = `Bearer realm="${realm}", error="insufficient_scope", error_description="${lacking.replace(/["\\]/g, '')}"`;
      detail = `${lacking}, which this route's keyScope needs`;
    } else if (check.ok) {
      refusal = { code: 'forbidden', why: `missing scope ${scope}`, callerId: check.caller.id };
      challenge = `Bearer realm="${realm}", error="insufficient_scope", scope="${scope}"`;
      detail = `this token lacks the scope ${scope}`;
    } else {
      refusal = { code: 'unauthorized', why: check.why, callerId: null };
      challenge = `Bearer realm="${realm}", error="invalid_token", error_description="${check.why.replace(/["\\]/g, '')}"`;
      detail = `a valid bearer token is required (${check.why})`;
    }
  }
  return { ok: false, refusal: { ...refusal, requestId, tokenSha256: token === null ? null : await shortHash(token) }, challenge, detail };
}

/**
 * Why the caller's token cannot scope keys by `claim`, or null when it can:
 * the claim, as the verifier kept it, under the rules of a keyScope header's
 * value (printable ASCII, at most 512 bytes, no spaces at either end), so a
 * claim scope is bounded as a header scope is. The claim's value is never
 * in the answer (it may be personal data).
 */
export function missingClaim(caller: Pick<Caller, 'claims'>, claim: string | null): string | null {
  if (claim === null) return null;
  // Own properties only: a claim named `constructor` is not Object's.
  const value = Object.hasOwn(caller.claims, claim) ? caller.claims[claim] : undefined;
  const name = JSON.stringify(claim).slice(1, -1);
  if (value === undefined) return `the token has no string or integer claim ${name}`;
  const parsed = parseEntity(value, 'the value');
  return parsed.ok ? null : `the token's claim ${name}: ${parsed.reason}`;
}

/** First 16 hex digits of sha256(token): enough to correlate, useless to replay. */
export async function shortHash(token: string): Promise<string> {
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(token));
  return Array.from(new Uint8Array(digest).slice(0, 8), (b) => b.toString(16).padStart(2, '0')).join('');
}

export type { Caller };
