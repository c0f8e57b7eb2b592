import { bodyDigest } from '../../core/fingerprint.js';
import { duplicateOnPointerPath, foldName } from '../../core/json-duplicates.js';
import { caseVariantOf, caseVariantReason, MCP_CALL_MEMBERS, type JsonRpcId } from '../../protocol/mcp.js';
import type { Refusal } from '../../protocol/problem.js';

// What a POST to an mcp route carries (JSON-RPC 2.0 over MCP Streamable
// HTTP), read once, before anything is decided or forwarded.

/** A `tools/call` request: the one message an mcp route decides. */
export interface ToolCall {
  kind: 'call';
  id: string | number;
  name: string;
  /** `params.arguments` (an empty object when absent). */
  args: Record<string, unknown>;
  /** The digest of `arguments` as written (./message.ts argumentsDigest): what the fingerprint covers. */
  argsDigest: string;
  params: Record<string, unknown>;
  /** `params._meta`, or an empty object. */
  meta: Record<string, unknown>;
  /**
   * `params.task` (MCP 2025-11-25 task augmentation, ./tasks.ts): the caller
   * asks the server to run the call as a task and answer a CreateTaskResult.
   * Null for a plain call. It is in the fingerprint (`argsDigest`): a plain
   * call and a task call under one key are two commands.
   */
  task: Record<string, unknown> | null;
  /** The body as text, for the duplicate-name checks of pointers into it. */
  text: string;
}

/**
 * A task method that changes a task's state (MCP 2025-11-25 tasks:
 * `tasks/cancel`), decided like a call's fence (./tasks.ts): it must carry
 * the fence and the entity, and a stale fence never reaches the upstream.
 */
export interface TaskOp {
  kind: 'task-op';
  id: string | number;
  method: (typeof STATE_CHANGING_TASK_METHODS)[number];
  taskId: string;
  params: Record<string, unknown>;
  /** `params._meta`, or an empty object. */
  meta: Record<string, unknown>;
  text: string;
}

/** The task methods that change a task's state; `tasks/get`, `tasks/list` and `tasks/result` read it and pass undecided. */
export const STATE_CHANGING_TASK_METHODS = ['tasks/cancel'] as const;

export type McpMessage =
  | ToolCall
  | TaskOp
  /**
   * Anything else: forwarded as it came. `listId`: the id of a `tools/list` request, whose answer teaches the route's annotations.
   * `hiddenList`: a `tools/list` whose answer the route could not read as one (in a batch, or under another spelling of
   * the method that a lenient upstream answers as a list), which a route that filters lists refuses (./codec.ts).
   */
  | { kind: 'pass'; id: JsonRpcId; listId: string | number | null; hiddenList?: true; method?: string }
  /** `rpcCode`: the JSON-RPC code when it is not the refusal's own (MCP_ERROR_CODES), e.g. -32600 for a message that is no Request object. */
  | { kind: 'refused'; id: JsonRpcId; refusal: Refusal; rpcCode?: number };

/**
 * Classifies a POST body. Refused (never forwarded, no state): a body that
 * is not UTF-8 JSON; a batch holding a `tools/call` (batching left the
 * protocol in 2025-06-18, and one HTTP answer cannot carry several
 * decisions); a repeated member name in the message or its params (JSON.parse
 * keeps the last copy, an upstream may act on the first: a `method` or a
 * tool `name` read two ways would let a side-effecting call pass as another);
 * a `tools/call` without an id, without a string name, or with arguments or
 * `_meta` that are not objects; a method that is tools/call in another
 * case or with whitespace (`isCallVariant`, replaceable by tests only); a
 * `method` that is present but not a string, alone or in a batch (JSON-RPC
 * 2.0 §4 -32600 Invalid Request: the gateway would pass `["tools/call"]`
 * as no call, and an upstream that looks handlers up in a plain object,
 * `handlers[msg.method]`, stringifies it to "tools/call" and runs it).
 */
export function readMessage(body: Uint8Array, isCallVariant: (method: unknown) => boolean = looksLikeToolsCall): McpMessage {
  let text: string;
  let doc: unknown;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(body);
    doc = JSON.parse(text);
  } catch {
    return bad(null, 'the body is not JSON (an mcp route carries JSON-RPC messages)');
  }
  if (Array.isArray(doc)) {
    let hiddenList = false;
    for (let i = 0; i < doc.length; i++) {
      if (duplicateOnPointerPath(text, [String(i), 'params', 'name']) !== null) return bad(null, `batch element ${i} has a member name more than once`);
      const m = doc[i] as { method?: unknown } | null;
      if (m !== null && typeof m === 'object' && !methodIsString(m)) return notARequest(null, `batch element ${i}: ${METHOD_NOT_STRING}`);
      if (m !== null && typeof m === 'object' && foldedMethod(m) !== null) return bad(null, `batch element ${i}: ${foldedMethodReason(foldedMethod(m)!)}`);
      if (m !== null && typeof m === 'object' && (m.method === 'tools/call' || isCallVariant(m.method))) {
        return bad(null, 'a JSON-RPC batch may not carry tools/call: each call needs a decision and an answer of its own; send it as a single message');
      }
      if (m !== null && typeof m === 'object' && looksLikeTaskOp(m.method))
        return bad(null, 'a JSON-RPC batch may not carry tasks/cancel: it is fenced like a call and needs a decision of its own; send it as a single message');
      if (m !== null && typeof m === 'object' && looksLikeToolsList(m.method)) hiddenList = true;
    }
    return { kind: 'pass', id: null, listId: null, ...(hiddenList ? { hiddenList: true as const } : {}) };
  }
  if (doc === null || typeof doc !== 'object') return bad(null, 'the body is not a JSON-RPC message (an object) or batch');
  const msg = doc as Record<string, unknown>;
  const id = isId(msg.id) ? msg.id : null;
  const repeated = duplicateOnPointerPath(text, ['params', 'name']);
  if (repeated !== null)
    return bad(
      id,
      `the object at "${repeated.object}" has the member ${JSON.stringify(repeated.name.slice(0, 64))} more than once, so parsers disagree on the message`,
    );
  if (!methodIsString(msg)) return notARequest(id, METHOD_NOT_STRING);
  const folded = foldedMethod(msg);
  if (folded !== null) return bad(id, foldedMethodReason(folded));
  if (msg.method !== 'tools/call' && isCallVariant(msg.method)) {
    return bad(
      id,
      `the method ${JSON.stringify(String(msg.method).slice(0, 64))} is not tools/call as written, but an upstream may read it as one; send the method exactly as "tools/call"`,
    );
  }
  // A list without a string or integer id (a notification, `"id": null`, `"id": 1.5`) is one whose answer cannot be told by its id.
  if (msg.method === 'tools/list') return isId(msg.id) ? { kind: 'pass', id, listId: msg.id } : { kind: 'pass', id, listId: null, hiddenList: true };
  if (looksLikeToolsList(msg.method)) return { kind: 'pass', id: typeof msg.method === 'string' ? id : null, listId: null, hiddenList: true };
  const taskOp = STATE_CHANGING_TASK_METHODS.find((m) => m === msg.method);
  if (taskOp === undefined && looksLikeTaskOp(msg.method))
    return bad(
      id,
      `the method ${JSON.stringify(String(msg.method).slice(0, 64))} is not ${lettersOf(msg.method as string) === 'TASKSCANCEL' ? 'tasks/cancel' : 'a task method'} as written, but an upstream may read it as one; send the method exactly as written in MCP`,
    );
  if (taskOp !== undefined) {
    if (!isId(msg.id)) return bad(null, `a ${taskOp} must be a request with a string or integer id`);
    const params = msg.params;
    if (!isObject(params)) return bad(id, `${taskOp} params must be an object`);
    if (typeof params.taskId !== 'string' || params.taskId.length === 0) return bad(id, `${taskOp} params.taskId must be a non-empty string`);
    if (params._meta !== undefined && !isObject(params._meta)) return bad(id, `${taskOp} params._meta must be an object`);
    if (argumentsDigest(body) === null)
      return bad(
        id,
        'the message repeats a member name in some object (names compared case-insensitively) or nests deeper than 128 levels, so parsers disagree on it',
      );
    return {
      kind: 'task-op',
      id: msg.id,
      method: taskOp,
      taskId: params.taskId,
      params,
      meta: (params._meta as Record<string, unknown>) ?? {},
      text,
    };
  }
  // A response (the agent's answer to a server request) is not answered: its id is the server's.
  if (msg.method !== 'tools/call')
    return typeof msg.method === 'string' ? { kind: 'pass', id, listId: null, method: msg.method } : { kind: 'pass', id: null, listId: null };

  if (!isId(msg.id)) return bad(null, 'a tools/call must be a request with a string or integer id (a notification cannot be answered or replayed)');
  const params = msg.params;
  if (!isObject(params)) return bad(id, 'tools/call params must be an object');
  const name = params.name;
  if (typeof name !== 'string' || name.length === 0) return bad(id, 'tools/call params.name must be a non-empty string');
  // The name scopes the key and labels logs: no control characters, bounded.
  if (name.length > 256 || /[\u0000-\u001f\u007f]/.test(name))
    return bad(id, 'tools/call params.name must be at most 256 characters without control characters');
  if (params.arguments !== undefined && !isObject(params.arguments)) return bad(id, 'tools/call params.arguments must be an object');
  if (params._meta !== undefined && !isObject(params._meta)) return bad(id, 'tools/call params._meta must be an object');
  if (params.task !== undefined && !isObject(params.task)) return bad(id, 'tools/call params.task must be an object (MCP task augmentation)');
  // `Task` is the task request to a case-insensitive decoder, and no task here: the call would be decided as a plain one.
  if (params.task === undefined && Object.keys(params).some((k) => k !== 'task' && foldName(k) === TASK)) return bad(id, caseVariantReason('params', 'task'));
  // One pass over the whole message finds every repeated name (argumentsDigest below);
  // the scans that name the object run only to word the refusal of one that did.
  const argsDigest = argumentsDigest(body, params.task !== undefined);
  if (argsDigest === null) {
    // A lone `Arguments` is absent here and the arguments to a case-insensitive decoder: the digest is refused for it (bodyDigest's folded check); say so.
    if (params.arguments === undefined && Object.keys(params).some((k) => caseVariantOf(k, MCP_CALL_MEMBERS) === 'arguments')) {
      return bad(id, caseVariantReason('params', 'arguments'));
    }
    for (const inner of ['_meta', 'arguments']) {
      const r = duplicateOnPointerPath(text, ['params', inner, '']);
      if (r !== null)
        return bad(id, `the object at "${r.object}" has the member ${JSON.stringify(r.name.slice(0, 64))} more than once, so parsers disagree on the call`);
    }
    return bad(
      id,
      'the message repeats a member name in some object (names compared case-insensitively) or nests deeper than 128 levels, so parsers disagree on the call',
    );
  }
  return {
    kind: 'call',
    id: msg.id,
    name,
    args: (params.arguments as Record<string, unknown>) ?? {},
    argsDigest,
    params,
    meta: (params._meta as Record<string, unknown>) ?? {},
    task: (params.task as Record<string, unknown> | undefined) ?? null,
    text,
  };
}

const TASK = foldName('task');

/**
 * The digest of the call's `arguments` (and, for a task call, its `task`)
 * from the raw text (../../core/fingerprint.ts
 * bodyDigest): members sorted and whitespace gone, so the same call written
 * with another key order or spacing has one fingerprint, but number literals
 * kept as written (JSON.parse reads 9007199254740993 and 9007199254740992,
 * 1e400 and null, -0 and 0, 1.0 and 1 as one value; an upstream with exact
 * decimals reads two). The JSON-RPC id, `_meta` (progress tokens, the fence)
 * and the session do not enter it. Null when an object anywhere in the
 * message repeats a member name (JSON.parse keeps the last copy, other
 * parsers the first: two calls would share one canonical form).
 * A task call's digest covers `params.task` as written too, so a plain call
 * and a task call under one key are two commands (`idempotency-key-reused`,
 * never one's answer for the other: a plain call would get a task handle,
 * a task call a result it did not ask for); a plain call's digest is the
 * one it always was, so records stored before stay valid.
 */
export function argumentsDigest(body: Uint8Array, task = false): string | null {
  const digest = bodyDigest({ json: task ? ['/params/arguments', '/params/task'] : ['/params/arguments'] }, body, '');
  return digest.startsWith('json:') ? digest : null;
}

/**
 * A method that is `tools/call` in another case, or with whitespace or
 * invisible characters around or inside it. Only the exact `tools/call` is
 * decided; an upstream that folds case or trims (some JSON-RPC dispatchers
 * do) would run such a variant as a call that no fence or key checked, so
 * it is refused rather than passed (docs/mcp.md "What is decided, what passes").
 */
function looksLikeToolsCall(method: unknown): boolean {
  // No length cut: `tools/call` padded with a thousand spaces is still one to a server that trims.
  if (typeof method !== 'string') return false;
  // Its letters alone, after compatibility folding (fullwidth `ｔｏｏｌｓ`) and
  // both case folds (`ſ`, U+017F, upper-cases to `S`): whatever stands
  // between or around them (`tools.call`, `tools//call`, a bidi mark), no
  // other MCP method has these letters, so refusing costs nothing.
  return (
    method
      .normalize('NFKC')
      .toLowerCase()
      .toUpperCase()
      .replace(/[^A-Z]/g, '') === 'TOOLSCALL'
  );
}

/** The letters of a method after compatibility and case folding (as looksLikeToolsCall reads them). */
function lettersOf(method: string): string {
  return method
    .normalize('NFKC')
    .toLowerCase()
    .toUpperCase()
    .replace(/[^A-Z]/g, '');
}

/** A state-changing task method (`tasks/cancel`) under any spelling a lenient upstream would answer as one. */
function looksLikeTaskOp(method: unknown): boolean {
  return typeof method === 'string' && lettersOf(method) === 'TASKSCANCEL';
}

/** `tools/list` under any spelling an upstream that folds case, width or trims would answer as one (as looksLikeToolsCall). */
function looksLikeToolsList(method: unknown): boolean {
  return (
    typeof method === 'string' &&
    method
      .normalize('NFKC')
      .toLowerCase()
      .toUpperCase()
      .replace(/[^A-Z]/g, '') === 'TOOLSLIST'
  );
}

/**
 * A member that is `method` to a decoder that matches names
 * case-insensitively (Go's encoding/json, ASP.NET: `Method`, `METHOD`,
 * `meThod`, with `ſ` and `K` folded as they fold them), where the message
 * has no `method` of its own: such a server reads a call that this gateway
 * would pass as a response. (A message with both is refused earlier, as a
 * repeated name.)
 */
function foldedMethod(msg: object): string | null {
  for (const k of Object.keys(msg)) if (k !== 'method' && foldName(k) === METHOD) return k;
  return null;
}
const METHOD = foldName('method');
const foldedMethodReason = (name: string) =>
  `the member ${JSON.stringify(name.slice(0, 64))} is "method" to a case-insensitive decoder, which would read the message as a call; send it exactly as "method"`;

export function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** JSON-RPC 2.0 §4: a string or a number; fencegate takes integers only (a fractional id is "SHOULD NOT"). */
function isId(v: unknown): v is string | number {
  return typeof v === 'string' || (typeof v === 'number' && Number.isSafeInteger(v));
}

/** No `method`, or a string one: a `method` of any other type (`["tools/call"]`, `null`, `{}`) makes the message no JSON-RPC Request. */
function methodIsString(m: object): boolean {
  return !Object.hasOwn(m, 'method') || typeof (m as { method?: unknown }).method === 'string';
}
const METHOD_NOT_STRING =
  'the member "method" must be a string (JSON-RPC 2.0 §4); an upstream that looks methods up by key would read ["tools/call"] as "tools/call"';

/** The message is no JSON-RPC Request object: -32600, the refusal's type `invalid-request`. */
function notARequest(id: JsonRpcId, detail: string): McpMessage {
  return { kind: 'refused', id, refusal: { code: 'invalid-request', detail }, rpcCode: JSONRPC_INVALID_REQUEST };
}
const JSONRPC_INVALID_REQUEST = -32600;

function bad(id: JsonRpcId, detail: string): McpMessage {
  return { kind: 'refused', id, refusal: { code: 'invalid-request', detail } };
}
