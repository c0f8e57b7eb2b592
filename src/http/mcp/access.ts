import type { RouteConfig } from '../../config/schema.js';
import { scanPointer } from '../../core/json-duplicates.js';
import { isObject } from './message.js';

// Which tools an mcp route lets agents use (docs/mcp.md "Allowed tools"):
// the route's `toolAccess` lists, applied to every tools/call (refused
// `tool-denied`, never forwarded) and to every tools/list answer that
// passes (the denied tools taken out, so a model is not shown what it
// cannot call).

/** A route's tool access, compiled once per route. */
export interface ToolAccess {
  /** Null when the tool may be called; else the pattern (or the missing allow match) that refuses it. */
  denial(name: string): string | null;
}

/**
 * A name as an upstream that is lenient about tool names would look it up:
 * Unicode compatibility folding (fullwidth `ｄｅｌｅｔｅ`), both case folds
 * (`ſ`, U+017F, upper-cases to `S`), and no whitespace or invisible
 * characters (`delete_user\u200b`, ` delete_user`). MCP tool names are
 * case-sensitive, and most servers look them up exactly; but a server built
 * on a case-insensitive map, or one that trims, runs `Delete_User` as
 * `delete_user`. A deny pattern is therefore matched on this fold (it only
 * ever refuses more), an allow pattern on the exact name (a variant of an
 * allowed name is not allowed: it only ever refuses more too).
 */
export function foldToolName(name: string): string {
  return name
    .normalize('NFKC')
    .toLowerCase()
    .toUpperCase()
    .replace(/[\s\p{Default_Ignorable_Code_Point}]/gu, '');
}

/**
 * A pattern as a whole-name matcher: `*` is any run of characters (none
 * included), everything else literal. `fold` is applied to the literal
 * parts and to the name (never to `*` itself: a fullwidth `＊` folds to a
 * `*` that stays literal).
 */
function matcher(pattern: string, fold: (s: string) => string): (name: string) => boolean {
  const parts = pattern.split('*').map(fold);
  if (parts.length === 1) return (name) => fold(name) === parts[0];
  const first = parts[0]!;
  const last = parts[parts.length - 1]!;
  const middle = parts.slice(1, -1);
  return (raw) => {
    const name = fold(raw);
    if (name.length < first.length + last.length || !name.startsWith(first) || !name.endsWith(last)) return false;
    // Leftmost match of each middle part, between the prefix and the suffix: enough for `*` alone.
    let at = first.length;
    const stop = name.length - last.length;
    for (const p of middle) {
      const i = name.indexOf(p, at);
      if (i === -1 || i + p.length > stop) return false;
      at = i + p.length;
    }
    return true;
  };
}

const exact = (s: string) => s;

/** Null when the route has no `toolAccess` (every tool may be called, every listed tool is shown). */
export function compileToolAccess(route: RouteConfig): ToolAccess | null {
  const access = route.toolAccess;
  if (access === undefined) return null;
  const allow = access.allow?.map((p) => ({ p, m: matcher(p, exact) })) ?? null;
  const deny = (access.deny ?? []).map((p) => ({ p, m: matcher(p, foldToolName) }));
  return {
    denial(name) {
      // Deny wins over allow, whatever their order.
      const denied = deny.find((d) => d.m(name));
      if (denied !== undefined)
        return `denied by ${JSON.stringify(denied.p)}${foldToolName(name) !== name && !matcher(denied.p, exact)(name) ? ' (names compared without regard to case, width, whitespace and invisible characters)' : ''}`;
      if (allow !== null && !allow.some((a) => a.m(name))) return 'not in the allow list';
      return null;
    },
  };
}

/**
 * The JSON text of a `tools/list` response with the tools `access` denies
 * taken out of `result.tools`, everything else byte for byte (each removed
 * element is cut from the text with its separating comma); the text as it
 * came when nothing is removed or it is no tools/list result. Null when the
 * text cannot be read as one (the caller refuses to pass it unfiltered).
 */
export function filterToolsList(text: string, access: ToolAccess): string | null {
  let msg: unknown;
  try {
    msg = JSON.parse(text);
  } catch {
    return null;
  }
  if (!isObject(msg)) return null;
  // An error response, or a result without a list: nothing to take out.
  if (!isObject(msg.result)) return 'error' in msg ? text : null;
  if (msg.result.tools === undefined) return text;
  if (!Array.isArray(msg.result.tools)) return null;
  const tools = msg.result.tools as unknown[];
  // A tool with no readable name cannot be judged: not shown.
  const drop = tools.map((t) => !isObject(t) || typeof t.name !== 'string' || access.denial(t.name) !== null);
  if (!drop.includes(true)) return text;
  // The spans of the elements, in the text. JSON.parse read the text, so the
  // scan is of valid JSON; a repeated `result` or `tools` (JSON.parse keeps
  // the last) makes the spans uncertain: then the whole message is rewritten.
  const spans: { start: number; end: number }[] = [];
  for (let i = 0; i < tools.length; i++) {
    const at = scanPointer(text, ['result', 'tools', String(i)], exact);
    if (!('start' in at)) return rewritten(msg, tools, drop);
    spans.push(at);
  }
  const arr = scanPointer(text, ['result', 'tools'], exact);
  if (!('start' in arr)) return rewritten(msg, tools, drop);
  // The kept elements as written, joined by commas; the text around the array as it came.
  const kept = spans.filter((_, i) => !drop[i]);
  const inner = kept.map((s) => text.slice(s.start, s.end)).join(',');
  return `${text.slice(0, arr.start)}[${inner}]${text.slice(arr.end)}`;
}

function rewritten(msg: Record<string, unknown>, tools: unknown[], drop: boolean[]): string {
  return JSON.stringify({ ...msg, result: { ...(msg.result as Record<string, unknown>), tools: tools.filter((_, i) => !drop[i]) } });
}

/**
 * A message that is not the answer to the list being filtered (`msg`, its
 * parsed `text`): only a response whose `result` holds a `tools` array is
 * narrowed (a list's answer under another id, or one a resumed GET stream
 * replays); anything else is returned as it came.
 */
export function filterMessage(text: string, msg: unknown, access: ToolAccess): string {
  if (!isObject(msg) || msg.method !== undefined || !isObject(msg.result) || !Array.isArray(msg.result.tools)) return text;
  // A tools array parses, so the list filter reads it.
  return filterToolsList(text, access) ?? text;
}
