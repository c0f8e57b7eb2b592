import type { HeaderReader } from './inbound.js';
import type { RouteConfig } from '../config/schema.js';
import { duplicateOnPointerPath } from '../core/json-duplicates.js';
import { parseEntity, parseFence, parseIdempotencyKey } from '../protocol/headers.js';
import type { Refusal } from '../protocol/problem.js';

/** What the headers (and path) of a proxied request say, once parsed (DESIGN §3.3). */
export interface Command {
  fence: bigint | null;
  /** With `fence.signed`: the fence header as sent (a JWS to verify once the entity is known); `fence` stays null until then. */
  signedFence: string | null;
  key: string | null;
  /** From the header or the path; a JSON-pointer entity is read after the body. */
  entity: string | null;
}

export type CommandResult = { ok: true; command: Command } | { ok: false; refusal: Refusal };

/**
 * Step 3 of the decision order: parse the fence, the idempotency key and the
 * entity (when it comes from a header or the path). Nothing is stored yet,
 * so a refusal here changes no state.
 */
export function parseCommand(route: RouteConfig, headers: HeaderReader, params: Record<string, string>, options: { signedFences?: boolean } = {}): CommandResult {
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
      if (route.idempotency === 'required') return refuse('missing-idempotency-key', `this route requires the ${route.idempotencyHeader} header`);
    } else {
      const parsed = parseIdempotencyKey(raw);
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
  return { ok: true, command: { fence, signedFence, key, entity } };
}

/**
 * A JSON-pointer entity (RFC 6901) from the request body: a string, or an
 * integer written as its decimal text. An object on the pointer's path with
 * a repeated member name is refused (400 `invalid-entity`): JSON.parse keeps
 * the last copy, an upstream may keep the first and act on another entity
 * than the one fenced (../core/json-duplicates.ts).
 */
export function entityFromJson(pointer: string, body: Uint8Array): { ok: true; entity: string | null } | { ok: false; refusal: Refusal } {
  let doc: unknown;
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(body);
    doc = JSON.parse(text);
  } catch {
    return { ok: true, entity: null };
  }
  const tokens = pointer === '' ? [] : pointer.slice(1).split('/').map((t) => t.replace(/~1/g, '/').replace(/~0/g, '~'));
  const repeated = duplicateOnPointerPath(text, tokens);
  if (repeated !== null) {
    return {
      ok: false,
      refusal: {
        code: 'invalid-entity',
        detail: `body ${pointer}: the object at "${repeated.object}" has the member ${JSON.stringify(repeated.name.slice(0, 64))} more than once, so parsers disagree on the entity`,
      },
    };
  }
  let node: unknown = doc;
  for (const t of tokens) {
    if (node === null || typeof node !== 'object' || !Object.prototype.hasOwnProperty.call(node, t)) return { ok: true, entity: null };
    node = (node as Record<string, unknown>)[t];
  }
  if (typeof node === 'number' && Number.isSafeInteger(node)) node = String(node);
  if (typeof node !== 'string') return { ok: true, entity: null };
  const parsed = parseEntity(node);
  if (!parsed.ok) return { ok: false, refusal: { code: 'invalid-entity', detail: `body ${pointer}: ${parsed.reason}` } };
  return { ok: true, entity: parsed.value };
}

function refuse(code: Refusal['code'], detail: string): CommandResult {
  return { ok: false, refusal: { code, detail } };
}
