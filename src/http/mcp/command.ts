import type { RouteConfig } from '../../config/schema.js';
import { duplicateOnPointerPath, scanPointer } from '../../core/json-duplicates.js';
import { parseEntity, parseFence, parseIdempotencyKey, type Parsed } from '../../protocol/headers.js';
import { caseVariantOf, caseVariantReason, MCP_CALL_MEMBERS, MCP_META, MCP_META_MEMBERS } from '../../protocol/mcp.js';
import type { Refusal } from '../../protocol/problem.js';
import { foldedOnPointerPath, foldedReason, tokensOf, valueAtPointer, type Command } from '../command.js';
import type { HeaderReader } from '../inbound.js';
import { presentedHeader } from '../refusal-log.js';
import type { ToolCall } from './message.js';

// Step 3 for a tools/call (DESIGN §3.3, docs/mcp.md "_meta fields"): the
// fence, the key and the entity of one call. Each may come from
// `params._meta`, from the route's HTTP headers (as on plain routes), and
// the key also from `params.idempotencyKey`; a value sent in several places
// must be the same in all of them, so that the gateway and the upstream can
// never act on two different readings of one call.

type McpCommand = Pick<Command, 'fence' | 'signedFence' | 'key' | 'entity'>;

export function parseToolCommand(
  route: RouteConfig,
  call: ToolCall,
  headers: HeaderReader,
  params: Record<string, string>,
  options: { signedFences: boolean },
): { ok: true; command: McpCommand } | { ok: false; refusal: Refusal } {
  const folded = foldedCallMember(call);
  if (folded !== null) return refuse('invalid-request', folded);
  let fence: bigint | null = null;
  let signedFence: string | null = null;
  if (route.fence !== 'off') {
    const fromMeta = metaFenceText(call);
    if (fromMeta !== undefined && typeof fromMeta !== 'string')
      return refuse(
        'invalid-fence',
        `_meta["${MCP_META.fence}"] must be a decimal string (or a safe non-negative integer written as one: 1000, not 1e3 or 1000.0)`,
      );
    const one = agree(fromMeta ?? null, headers.get(route.fenceHeader), `_meta["${MCP_META.fence}"]`, route.fenceHeader);
    if (!one.ok) return refuse('invalid-fence', one.reason);
    if (one.value === null) {
      if (route.fence === 'required')
        return refuse('missing-fence', `this tool requires a fence: _meta["${MCP_META.fence}"] or the ${route.fenceHeader} header`);
    } else if (options.signedFences) {
      signedFence = one.value;
    } else {
      const parsed = parseFence(one.value);
      if (!parsed.ok) return refuse('invalid-fence', `fence: ${parsed.reason}`);
      fence = parsed.value;
    }
  }

  let key: string | null = null;
  if (route.idempotency !== 'off') {
    const fromMeta = call.meta[MCP_META.idempotencyKey];
    const fromParams = call.params.idempotencyKey;
    if (fromMeta !== undefined && typeof fromMeta !== 'string')
      return refuse('invalid-idempotency-key', `_meta["${MCP_META.idempotencyKey}"] must be a string`);
    if (fromParams !== undefined && typeof fromParams !== 'string') return refuse('invalid-idempotency-key', 'params.idempotencyKey must be a string');
    const inBody = agree(fromMeta ?? null, fromParams ?? null, `_meta["${MCP_META.idempotencyKey}"]`, 'params.idempotencyKey');
    if (!inBody.ok) return refuse('invalid-idempotency-key', inBody.reason);
    // A body key is the key itself; the header's value is read as on plain routes (an sf-string unquoted).
    let raw = inBody.value;
    const header = headers.get(route.idempotencyHeader);
    if (header !== null) {
      const h = parseIdempotencyKey(header, route.maxKeyLength);
      if (!h.ok) return refuse('invalid-idempotency-key', `${route.idempotencyHeader}: ${h.reason}`);
      if (raw !== null && raw !== h.value) return refuse('invalid-idempotency-key', `the key in the body and the ${route.idempotencyHeader} header differ`);
      raw = h.value;
    } else if (raw !== null) {
      // Quoted, so that any printable key is taken as it is (a bare `,` or `"` would be refused).
      const parsed = parseIdempotencyKey(JSON.stringify(raw), route.maxKeyLength);
      if (!parsed.ok) return refuse('invalid-idempotency-key', `idempotency key: ${parsed.reason}`);
      raw = parsed.value;
    }
    if (raw === null && route.idempotency === 'required') {
      return refuse(
        'missing-idempotency-key',
        `this tool requires an idempotency key: _meta["${MCP_META.idempotencyKey}"], params.idempotencyKey or the ${route.idempotencyHeader} header`,
      );
    }
    key = raw;
  }

  const entity = toolEntity(route, call, headers, params);
  if (!entity.ok) return entity;
  return { ok: true, command: { fence, signedFence, key, entity: entity.entity } };
}

/**
 * A member of `params`, or of `params._meta`, whose name differs only in case
 * from one the route reads (`_Meta`, `IdempotencyKey`, `IO.fencegate/Fence`):
 * the reason to refuse the call, else null. Here it is absent, so the call
 * would be decided without the fence, entity or key it holds; to an upstream
 * that binds member names case-insensitively (Go's encoding/json, ASP.NET
 * Core) it is that member, so the upstream would act on what the gateway
 * never checked (DESIGN §3.3; names folded as in §3.4, the fold of the
 * fingerprint and of the message's `method`, ./message.ts). A member next
 * to its exact namesake is a repeated name, refused before this
 * (./message.ts readMessage). The reason names the expected member, never
 * the value sent.
 */
function foldedCallMember(call: ToolCall): string | null {
  const find = (obj: Record<string, unknown>, expected: readonly string[]): string | undefined => {
    for (const name of Object.keys(obj)) {
      const hit = caseVariantOf(name, expected);
      if (hit !== undefined) return hit;
    }
    return undefined;
  };
  const inParams = find(call.params, MCP_CALL_MEMBERS);
  if (inParams !== undefined) return caseVariantReason('params', inParams);
  const inMeta = find(call.meta, MCP_META_MEMBERS);
  if (inMeta !== undefined) return caseVariantReason('params._meta', inMeta);
  return null;
}

/**
 * The `_meta` fence as text: a string as it is; a JSON number by its lexeme
 * as written in the body, and only when that lexeme is the header's one
 * canonical decimal (DESIGN §3.3, ../../protocol/headers.ts parseFence) and
 * a safe integer. JSON.parse reads `1e3`, `1000.0` and `1000` as one number,
 * so the parsed value cannot tell them apart; the fence, like the header,
 * has one spelling per value, so that the gateway and an upstream that
 * reads the number its own way never disagree on it. Anything else (a
 * non-canonical number, a boolean, an object) is returned as it is, for the
 * caller to refuse; undefined when there is none.
 */
function metaFenceText(call: ToolCall): unknown {
  const value = call.meta[MCP_META.fence];
  if (typeof value !== 'number') return value;
  // readMessage refused a repeated name anywhere, so the scan finds the one member JSON.parse read.
  const at = scanPointer(call.text, ['params', '_meta', MCP_META.fence]);
  if (!('start' in at)) return value;
  const lexeme = call.text.slice(at.start, at.end);
  return Number.isSafeInteger(value) && parseFence(lexeme).ok ? lexeme : value;
}

/**
 * The entity: with a `{json}` entity (a pointer into params) it is read
 * there, and a `_meta` entity must name the same one (the config says what
 * the upstream acts on; a worker fenced on something else would be checked
 * against the wrong entity's fence). Otherwise `_meta`, else the header or
 * path parameter, which must agree when both are sent.
 */
function toolEntity(
  route: RouteConfig,
  call: ToolCall,
  headers: HeaderReader,
  params: Record<string, string>,
): { ok: true; entity: string | null } | { ok: false; refusal: Refusal } {
  const metaEntity = call.meta[MCP_META.entity];
  if (metaEntity !== undefined && typeof metaEntity !== 'string') return refuseEntity(`_meta["${MCP_META.entity}"] must be a string`);
  let configured: string | null = null;
  let where: string;
  if ('json' in route.entity) {
    const pointer = route.entity.json;
    where = `params${pointer}`;
    const tokens = tokensOf(pointer);
    const repeated = duplicateOnPointerPath(call.text, ['params', ...tokens]);
    if (repeated !== null)
      return refuseEntity(
        `${where}: the object at "${repeated.object}" has the member ${JSON.stringify(repeated.name.slice(0, 64))} more than once, so parsers disagree on the entity`,
      );
    // `{"Customer":"bob"}` for `/customer`: the entity to a case-insensitive upstream, none here (../command.ts foldedOnPointerPath).
    const folded = foldedOnPointerPath(call.params, tokens);
    if (folded !== null) return refuseEntity(`${where}: ${foldedReason({ ...folded, object: `/params${folded.object}` })}, so parsers disagree on the entity`);
    let node = valueAtPointer(call.params, tokens);
    if (typeof node === 'number' && Number.isSafeInteger(node)) node = String(node);
    configured = typeof node === 'string' ? node : null;
    if (configured !== null && metaEntity !== undefined && metaEntity !== configured) {
      return refuseEntity(`_meta["${MCP_META.entity}"] names another entity than ${where}, where this tool's entity is read`);
    }
  } else {
    const header = 'header' in route.entity;
    where = header ? (route.entity as { header: string }).header : `path parameter ${(route.entity as { path: string }).path}`;
    const raw = header ? headers.get((route.entity as { header: string }).header) : (params[(route.entity as { path: string }).path.slice(1)] ?? null);
    if (raw !== null && header && raw.includes(', '))
      return refuseEntity(`${where}: the header was sent more than once, or its value contains ", " (how HTTP joins repeated headers)`);
    const one = agree(metaEntity ?? null, raw, `_meta["${MCP_META.entity}"]`, where);
    if (!one.ok) return refuseEntity(one.reason);
    configured = one.value;
    if (metaEntity !== undefined) where = `_meta["${MCP_META.entity}"]`;
  }
  if (configured === null) return { ok: true, entity: null };
  const parsed = parseEntity(configured);
  if (!parsed.ok) return refuseEntity(`${where}: ${parsed.reason}`);
  return { ok: true, entity: parsed.value };
}

/** The value a refused call presented for `code` (../refusal-log.ts): `_meta` first, then where a plain route reads it. */
export function presentedInCall(route: RouteConfig, call: ToolCall, code: string, headers: HeaderReader): unknown {
  const meta =
    code === 'invalid-fence'
      ? MCP_META.fence
      : code === 'invalid-idempotency-key'
        ? MCP_META.idempotencyKey
        : code === 'invalid-entity'
          ? MCP_META.entity
          : null;
  if (meta === null) return null;
  return call.meta[meta] ?? (code === 'invalid-idempotency-key' ? call.params.idempotencyKey : undefined) ?? presentedHeader(route, code, headers);
}

/** One value from two places: either may be absent; both present must be equal. */
function agree(a: string | null, b: string | null, aName: string, bName: string): Parsed<string | null> {
  if (a !== null && b !== null && a !== b) return { ok: false, reason: `${aName} and ${bName} differ; send one value, or the same in both` };
  return { ok: true, value: a ?? b };
}

function refuse(code: Refusal['code'], detail: string): { ok: false; refusal: Refusal } {
  return { ok: false, refusal: { code, detail } };
}

function refuseEntity(detail: string): { ok: false; refusal: Refusal } {
  return refuse('invalid-entity', detail);
}
