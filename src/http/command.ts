import type { HeaderReader } from './inbound.js';
import type { RouteConfig } from '../config/schema.js';
import { duplicateOnPointerPath, foldName, keyTextOf, scanPointer } from '../core/json-duplicates.js';
import { tokensOf, valueAtPointer } from '../core/json-pointer.js';
import { checkKey, parseEntity, parseFence, parseIdempotencyKey } from '../protocol/headers.js';
import type { Refusal } from '../protocol/problem.js';
import { missingClaim } from './middleware/auth/middleware.js';

/** What the headers (and path) of a proxied request say, once parsed (DESIGN §3.3). */
export interface Command {
  fence: bigint | null;
  /** With `fence.signed`: the fence header as sent (a JWS to verify once the entity is known); `fence` stays null until then. */
  signedFence: string | null;
  key: string | null;
  /** From the header or the path; a JSON-pointer entity is read after the body. */
  entity: string | null;
  /** With `keyScope`: the scope header's value, or the verified token's claim (./key-scope.ts). */
  keyScope: string | null;
}

export type CommandResult = { ok: true; command: Command } | { ok: false; refusal: Refusal };

/**
 * Step 3 of the decision order: parse the fence, the idempotency key and the
 * entity (when it comes from a header or the path). Nothing is stored yet,
 * so a refusal here changes no state.
 */
export function parseCommand(
  route: RouteConfig,
  headers: HeaderReader,
  params: Record<string, string>,
  options: { signedFences?: boolean; claims?: Readonly<Record<string, string>> | null } = {},
): CommandResult {
  let fence: bigint | null = null;
  let signedFence: string | null = null;
  if (route.fence !== 'off') {
    const raw = headers.get(route.fenceHeader);
    if (raw === null) {
      if (route.fence === 'required') return refuse('missing-fence', `this route requires the ${route.fenceHeader} header`);
    } else if (options.signedFences) {
      // Verified (and logged when refused, a bare integer included) by the proxy.
      signedFence = raw;
    } else {
      const parsed = parseFence(raw);
      if (!parsed.ok) return refuse('invalid-fence', `${route.fenceHeader}: ${parsed.reason}`);
      fence = parsed.value;
    }
  }

  let key: string | null = null;
  if (route.idempotency !== 'off') {
    const raw = headers.get(route.idempotencyHeader);
    if (raw === null) {
      // With `idempotencyKeyFrom` the body may still hold it (keyFromJson).
      if (route.idempotency === 'required' && route.idempotencyKeyFrom === undefined)
        return refuse('missing-idempotency-key', `this route requires the ${route.idempotencyHeader} header`);
    } else {
      const parsed = parseIdempotencyKey(raw, route.maxKeyLength);
      if (!parsed.ok) return refuse('invalid-idempotency-key', `${route.idempotencyHeader}: ${parsed.reason}`);
      key = parsed.value;
    }
  }

  let entity: string | null = null;
  if ('header' in route.entity || 'path' in route.entity) {
    const raw = 'header' in route.entity ? headers.get(route.entity.header) : (params[route.entity.path.slice(1)] ?? null);
    const where = 'header' in route.entity ? route.entity.header : `path parameter ${route.entity.path}`;
    if (raw !== null) {
      // HTTP joins a repeated header into one value with ", " (RFC 9110
      // §5.3). Read as one entity, `X-Fence-Entity: job-1` sent twice would be
      // the unfenced entity "job-1, job-1", while a cooperating upstream reads
      // job-1: a stale command for job-1 would get through. So a header entity
      // may not contain ", " (the lease module's fence keys never do).
      if ('header' in route.entity && raw.includes(', ')) {
        return refuse('invalid-entity', `${where}: the header was sent more than once, or its value contains ", " (how HTTP joins repeated headers)`);
      }
      const parsed = parseEntity(raw);
      if (!parsed.ok) return refuse('invalid-entity', `${where}: ${parsed.reason}`);
      entity = parsed.value;
    }
  }
  let keyScope: string | null = null;
  if (route.keyScope === undefined || route.idempotency === 'off') {
    // No scope beyond the route (and caller).
  } else if ('claim' in route.keyScope) {
    // The auth middleware refused a token without it (403, logged); this is
    // the last word, so a request that got here some other way without the
    // claim is refused too, never scoped by nothing.
    const lacking = missingClaim({ claims: options.claims ?? {} }, route.keyScope.claim);
    if (lacking !== null) return refuse('forbidden', `${lacking}, which this route's keyScope needs`);
    keyScope = options.claims![route.keyScope.claim]!;
  } else {
    const name = route.keyScope.header;
    const raw = headers.get(name);
    // Without it, callers that share no other scope would share one key space.
    if (raw === null) return refuse('invalid-request', `this route scopes idempotency keys by the ${name} header, which is missing`);
    const parsed = raw.includes(', ') ? { ok: false as const, reason: 'the header was sent more than once' } : parseEntity(raw, 'the value');
    if (!parsed.ok) return refuse('invalid-request', `${name} (the key scope): ${parsed.reason}`);
    keyScope = parsed.value;
  }
  return { ok: true, command: { fence, signedFence, key, entity, keyScope } };
}

/**
 * A JSON-pointer entity (RFC 6901) from the request body: a string, or an
 * integer written as its decimal text. An object on the pointer's path with
 * a repeated member name is refused (400 `invalid-entity`): JSON.parse keeps
 * the last copy, an upstream may keep the first and act on another entity
 * than the one fenced (../core/json-duplicates.ts). So is one with a member
 * that differs from the pointer's token only in case (foldedOnPointerPath).
 */
export function entityFromJson(pointer: string, body: Uint8Array): { ok: true; entity: string | null } | { ok: false; refusal: Refusal } {
  const read = stringAtPointer(pointer, body);
  if (!read.ok) return { ok: false, refusal: { code: 'invalid-entity', detail: `body ${pointer}: ${read.reason}, so parsers disagree on the entity` } };
  if (read.value === null) return { ok: true, entity: null };
  const parsed = parseEntity(read.value);
  if (!parsed.ok) return { ok: false, refusal: { code: 'invalid-entity', detail: `body ${pointer}: ${parsed.reason}` } };
  return { ok: true, entity: parsed.value };
}

/**
 * With `idempotencyKeyFrom: { json }`: the key from the body, under the
 * refusal of a repeated member name (the upstream must read the key the
 * gateway stored under) and the key rules of a header key. What the gateway
 * and the upstream read there must be one key, so (400
 * `invalid-idempotency-key`, docs/http-api.md "Key rules"):
 * - a string is the key; an integer is the key as written, a plain decimal
 *   within ±(2^53−1): `1.0`, `1e0` and `-0` are refused, never read as `1`
 *   or `0`, and a larger integer is refused, not rounded to a double;
 * - any other value there (a fraction, `true`, an object, an array) is
 *   refused, not taken as "no key": the client meant to send one;
 * - `null` or nothing there is no key in the body, but a member whose name
 *   differs from a token of the pointer only in case is refused
 *   (foldedOnPointerPath): it is the key to a case-insensitive upstream;
 * - with a key header too, the two must be the same key, or the gateway
 *   would store under one key while an upstream that reads the other
 *   deduplicates by it.
 * No key anywhere on a key-required route: 400 `missing-idempotency-key`.
 */
export function keyFromJson(route: RouteConfig, key: string | null, body: Uint8Array): { ok: true; key: string | null } | { ok: false; refusal: Refusal } {
  if (route.idempotencyKeyFrom === undefined || route.idempotency === 'off') return { ok: true, key };
  const pointer = route.idempotencyKeyFrom.json;
  const invalid = (detail: string) => ({ ok: false as const, refusal: { code: 'invalid-idempotency-key' as const, detail: `body ${pointer}: ${detail}` } });
  const read = keyAtPointer(pointer, body);
  if (!read.ok) return invalid(read.reason);
  if (read.value === null) {
    if (key !== null || route.idempotency !== 'required') return { ok: true, key };
    return {
      ok: false,
      refusal: {
        code: 'missing-idempotency-key',
        detail: `this route requires the ${route.idempotencyHeader} header or a string at ${pointer} in a JSON body`,
      },
    };
  }
  const checked = checkKey(read.value, route.maxKeyLength);
  if (!checked.ok) return invalid(checked.reason);
  if (key !== null && key !== checked.value)
    return invalid(`the ${route.idempotencyHeader} header names another key than the body; send one of them, or the same key in both`);
  return { ok: true, key: checked.value };
}

/** The key the body holds at `pointer`, from its text as written; null when the body is not JSON or holds none (or null) there. */
function keyAtPointer(pointer: string, body: Uint8Array): { ok: true; value: string | null } | { ok: false; reason: string } {
  let text: string;
  let doc: unknown;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(body);
    doc = JSON.parse(text);
  } catch {
    return { ok: true, value: null };
  }
  const tokens = tokensOf(pointer);
  const found = scanPointer(text, tokens);
  if ('duplicate' in found) return { ok: false, reason: `${repeatReason(found.duplicate)}, so parsers disagree on the key` };
  if ('absent' in found) {
    const folded = foldedOnPointerPath(doc, tokens);
    if (folded !== null) return { ok: false, reason: `${foldedReason(folded)}, so parsers disagree on the key` };
    return { ok: true, value: null };
  }
  const lexeme = text.slice(found.start, found.end);
  if (lexeme === 'null') return { ok: true, value: null };
  const key = keyTextOf(lexeme);
  if (key !== null) return { ok: true, value: key };
  const what =
    lexeme === 'true' || lexeme === 'false'
      ? 'a boolean'
      : lexeme.startsWith('{')
        ? 'an object'
        : lexeme.startsWith('[')
          ? 'an array'
          : 'a number that is not a plain integer within ±(2^53-1) (no fraction, exponent or -0)';
  return { ok: false, reason: `the key is ${what}; send a string or an integer` };
}

/**
 * Where a token of the pointer finds no member of its own name but one whose
 * name folds to it (`"Customer"` for `/customer`, `"cuſtomer"` too): the
 * object's pointer and the token, else null. To the gateway nothing is
 * there; to an upstream that binds member names case-insensitively (Go's
 * encoding/json, ASP.NET Core) that member is the entity or the key, so the
 * gateway would skip the entity's serial slot and fence (or store under no
 * key, or another) while the upstream acts on it (DESIGN §3.3 for the
 * entity, §3.5 for a key from the body). Names are folded as the fingerprint
 * folds them (DESIGN §3.4; ../core/json-duplicates.ts foldName, the FOLDED
 * check of ../core/fingerprint.ts). Checked at every token on the
 * way; `doc` is what JSON.parse made of a body whose objects on the path
 * repeat no folded name (refused before this runs), so an exact member and
 * a folded one never stand side by side here.
 */
export function foldedOnPointerPath(doc: unknown, tokens: string[]): { object: string; token: string } | null {
  let node = doc;
  for (let depth = 0; depth < tokens.length; depth++) {
    const token = tokens[depth]!;
    if (node === null || typeof node !== 'object') return null;
    // An array's own names are its indices, which no case fold changes: only objects can hold a folded member.
    if (Array.isArray(node)) {
      node = valueAtPointer(node, [token]);
      continue;
    }
    if (Object.hasOwn(node, token)) {
      node = (node as Record<string, unknown>)[token];
      continue;
    }
    const folded = foldName(token);
    if (Object.keys(node).some((name) => foldName(name) === folded)) return { object: pointerOf(tokens.slice(0, depth)), token };
    return null;
  }
  return null;
}

/** The refusal's reason: it names the object and the pointer's token (from the config), never the member the client sent or its value. */
export function foldedReason(f: { object: string; token: string }): string {
  return `the object at "${f.object}" has a member whose name differs only in case from ${JSON.stringify(f.token.slice(0, 64))} (a case-insensitive decoder reads it as that member)`;
}

function pointerOf(tokens: string[]): string {
  return tokens.map((t) => `/${t.replace(/~/g, '~0').replace(/\//g, '~1')}`).join('');
}

function repeatReason(r: { object: string; name: string }): string {
  return `the object at "${r.object}" has the member ${JSON.stringify(r.name.slice(0, 64))} more than once (names compared case-insensitively)`;
}

/** The string (or safe integer, as decimal text) at `pointer`; null when the body is not JSON or holds none there. */
function stringAtPointer(pointer: string, body: Uint8Array): { ok: true; value: string | null } | { ok: false; reason: string } {
  let doc: unknown;
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(body);
    doc = JSON.parse(text);
  } catch {
    return { ok: true, value: null };
  }
  const tokens = tokensOf(pointer);
  const repeated = duplicateOnPointerPath(text, tokens);
  if (repeated !== null) return { ok: false, reason: repeatReason(repeated) };
  const folded = foldedOnPointerPath(doc, tokens);
  if (folded !== null) return { ok: false, reason: foldedReason(folded) };
  let node = valueAtPointer(doc, tokens);
  if (typeof node === 'number' && Number.isSafeInteger(node)) node = String(node);
  return { ok: true, value: typeof node === 'string' ? node : null };
}

function refuse(code: Refusal['code'], detail: string): CommandResult {
  return { ok: false, refusal: { code, detail } };
}

// The pointer helpers live in ../core/json-pointer.ts (the lease module's dispatcher reads entities with them too).
export { tokensOf, valueAtPointer };
