/**
 * A model's proposed tool calls, in the three shapes providers emit, reduced
 * to `{ name, arguments }`. Only the name and the arguments are read: every
 * other field of a call (an id, a `leaseMs` or `maxAttempts` the model made
 * up) is ignored, so nothing the model writes can choose a lease, a time
 * limit or a retry count.
 */

/** `{ name, arguments }`: the MCP `tools/call` shape. */
export interface PlainToolCall {
  name: string;
  arguments?: Record<string, unknown>;
}

/** An OpenAI chat completion's `tool_calls[i]`: the arguments are a JSON string. */
export interface OpenAiToolCall {
  id?: string;
  type?: 'function';
  function: { name: string; arguments: string };
}

/** An Anthropic `tool_use` content block. */
export interface AnthropicToolUse {
  type: 'tool_use';
  id?: string;
  name: string;
  input: Record<string, unknown>;
}

export type ProposedToolCall = PlainToolCall | OpenAiToolCall | AnthropicToolUse;

/**
 * The Anthropic content blocks that are not calls for this dispatcher: a
 * model's message holds its text (and thinking) between the `tool_use`
 * blocks, and a plan is often that whole `content` array. `server_tool_use`
 * and `mcp_tool_use` are calls too, but ones the API ran itself (its server
 * tools, its MCP connector): dispatching one would run it a second time.
 * Their results (`*_tool_result`) come with them. All of them are skipped,
 * never refused, and take no position (the keys count calls only).
 */
const NOT_A_CALL = new Set(['text', 'thinking', 'redacted_thinking', 'server_tool_use', 'mcp_tool_use']);
const A_RESULT = /^[a-z_]*tool_result$/;

/** Is this entry of a plan an Anthropic block that is not a call to dispatch (`{ type: "text", … }`)? Whatever else it holds, it is never dispatched. */
export function isNonCallBlock(entry: unknown): boolean {
  return isObject(entry) && typeof entry.type === 'string' && (NOT_A_CALL.has(entry.type) || A_RESULT.test(entry.type));
}

export type NormalizedCall = { ok: true; name: string; arguments: unknown } | { ok: false; name: string | undefined; reason: string };

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Tool names: what MCP allows (letters, digits, `_-.`), up to 64, so a job key stays short. */
const TOOL_NAME = /^[A-Za-z0-9_.-]{1,64}$/;

/** Reads one proposed call; never throws (a malformed call is a refusal, not a fault). */
export function normalizeCall(call: unknown): NormalizedCall {
  if (!isObject(call)) return { ok: false, name: undefined, reason: 'a tool call must be an object' };
  let name: unknown;
  let args: unknown;
  if (isObject(call.function)) {
    name = call.function.name;
    const raw = call.function.arguments;
    if (typeof raw === 'string') {
      try {
        args = raw.trim() === '' ? {} : JSON.parse(raw);
      } catch {
        return { ok: false, name: typeof name === 'string' ? name : undefined, reason: 'function.arguments is not valid JSON' };
      }
    } else {
      args = raw;
    }
  } else if (call.type === 'tool_use') {
    name = call.name;
    args = call.input;
  } else if (typeof call.type === 'string' && call.type !== 'function') {
    // A typed block of another kind is never read as a plain call: its
    // `name` with no `arguments` would run the tool with {} (a block type
    // added to the API later, say, that the API runs itself).
    return {
      ok: false,
      name: undefined,
      reason: `a ${JSON.stringify(call.type.slice(0, 64))} entry is not a tool call (a call is { name, arguments }, OpenAI's { function } or Anthropic's tool_use)`,
    };
  } else {
    name = call.name;
    args = call.arguments;
  }
  if (typeof name !== 'string' || !TOOL_NAME.test(name)) {
    return { ok: false, name: typeof name === 'string' ? name.slice(0, 64) : undefined, reason: `the tool name must match ${TOOL_NAME}` };
  }
  if (args === undefined) args = {};
  if (!isObject(args)) return { ok: false, name, reason: 'the arguments must be a JSON object' };
  return { ok: true, name, arguments: args };
}
