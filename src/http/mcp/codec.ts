import type { RouteConfig } from '../../config/schema.js';
import { sha256Hex } from '../../core/fingerprint.js';
import { MCP_META, type JsonRpcId } from '../../protocol/mcp.js';
import type { Refusal } from '../../protocol/problem.js';
import type { StoredResponse } from '../../store/types.js';
import type { StreamedAnswer } from '../forward.js';
import type { Reply } from '../inbound.js';
import type { Codec, Command, Pass, Settled, Streaming } from '../pipeline/codec.js';
import { roundMs, type Exchange } from '../pipeline/exchange.js';
import { compileToolAccess, filterMessage, filterToolsList, type ToolAccess } from './access.js';
import { parseToolCommand, presentedInCall } from './command.js';
import { readMessage, type TaskOp, type ToolCall } from './message.js';
import {
  isEncoded,
  isEventStream,
  mcpUpstreamHeaders,
  passthrough,
  refusalReply,
  replayReply,
  settleBuffered,
  storedMessage,
  tooLargeAnswer,
  type Base,
} from './outcome.js';
import { ToolAnnotations, toolPolicy } from './policy.js';
import { cancelledRequestId, follow as followStreams, InFlightCalls, sessionOf, watchResumed, type CallWatch, type ResumeUpstream } from './resume.js';
import { SseSplitter, type SseEvent } from './sse.js';
import { CallerStream, eventsOf, isResponseTo, messageOf, parseData, sseMessage } from './stream.js';
import { createdTask, followTask, parseTaskOpCommand, settleTaskOp, TERMINAL_TASK_STATUSES, type ExtendLock } from './tasks.js';
import type { Forwarder } from '../forward.js';

/** What the mcp codec keeps of one request: the JSON-RPC id refusals answer, and the call once read. */
interface McpState {
  /** The message's id (null before the body is read, for a GET or DELETE, and for a batch). */
  id: JsonRpcId;
  /** A GET or DELETE carries no JSON-RPC request: its refusals keep their HTTP status. */
  httpStatus: boolean;
  /** The JSON-RPC code when it is not the refusal's own (e.g. -32600 for a message that is no Request object). */
  rpcCode?: number;
  call: ToolCall | null;
  /** A decided call watched in flight (./resume.ts): its resumed streams and its cancels. */
  watch?: CallWatch | null;
  /** A state-changing task method (`tasks/cancel`, ./tasks.ts), decided as a fence check. */
  op?: TaskOp;
}

/**
 * MCP over Streamable HTTP (docs/mcp.md). Only a `tools/call` of a tool
 * that is not read-only is a command: its fence, key and entity from
 * `_meta` (or the route's headers), its fingerprint over the tool and its
 * arguments as written, its refusals JSON-RPC errors to its id, its stored
 * answer the JSON-RPC response alone. Every other message, the server's
 * event stream (GET) and the session's end (DELETE) pass undecided, both
 * ways, and nothing of them is stored. The route learns its tools'
 * `readOnlyHint`s from the `tools/list` answers that pass, per endpoint
 * (path and query), as the call's decision reads them.
 */
export function createMcpCodec(deps: {
  signedFences: boolean;
  canStream: boolean;
  /** Sends a task call's `tasks/get` and `tasks/result` (./tasks.ts followTask); absent: a created task is recorded as its handle. */
  forwarder?: Forwarder;
  /** The store's lock extension, when it has one: a followed task keeps its record for as long as it runs. */
  extendLock?: ExtendLock | null;
  /** Aborted when the gateway closes: a followed task is then recorded unknown, with its handle as the interim answer. */
  closing?: AbortSignal;
  /** The gateway's own resuming GET of a call's stream the server closed (./resume.ts); absent: not resumed. */
  resume?: ResumeUpstream | undefined;
}): Codec<McpState> {
  const annotations = new ToolAnnotations();
  /** The decided calls in flight (./resume.ts). */
  const calls = new InFlightCalls();
  /**
   * The entity of each task this process follows (route and task id → the
   * entity its call named, as presented): a state-changing task method must
   * name that entity, so that its fence is checked against the task's own
   * (DESIGN §3.7 "Tasks"). Bounded, and forgotten when the follow ends; a
   * task this process does not follow (another process's, or after a
   * restart) is fenced by the entity the method names, as before.
   */
  const followedTasks = new Map<string, string | null>();
  const MAX_FOLLOWED_TASKS = 10_000;
  /** Each route's `toolAccess`, compiled once (null: every tool allowed, every list as it came). */
  const accessOf = new WeakMap<RouteConfig, ToolAccess | null>();
  const toolAccess = (route: RouteConfig): ToolAccess | null => {
    if (!accessOf.has(route)) accessOf.set(route, compileToolAccess(route));
    return accessOf.get(route)!;
  };

  /** A message forwarded undecided (see Pass). */
  const passing = (x: Exchange, id: JsonRpcId, listId: string | number | null, decision = 'passed', timeoutMs?: number): Pass => {
    const route = x.route!;
    const endpoint = x.pathname + x.search;
    const httpStatus = x.req.method !== 'POST';
    // What may carry a tools list to the agent: the answer to a tools/list, and the server's GET stream (a list's response replayed on resumption).
    const access = listId !== null || x.req.method === 'GET' ? toolAccess(route) : null;
    const refused = (refusal: Refusal, d: string) => ({ reply: refusalReply(refusal, id, x.requestId, { httpStatus }), decision: d });
    // A GET that resumes a decided call's stream carries that call's answer (./resume.ts).
    const tied = x.req.method === 'GET' && deps.canStream ? calls.tiedTo(sessionOf(x), x.req.headers.get('last-event-id')) : undefined;
    // Read whole, the server's GET stream would hang until the deadline: say there is none (MCP lets a server answer 405 here).
    const local: Reply | undefined =
      x.req.method === 'GET' && !deps.canStream
        ? {
            status: 405,
            headers: [
              ['allow', 'POST, DELETE'],
              ['content-type', 'application/json'],
            ],
            body: JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message: 'this gateway cannot stream; no server event stream on GET' } }),
          }
        : undefined;
    return {
      decision,
      ...(local !== undefined ? { local } : {}),
      ...(timeoutMs !== undefined ? { timeoutMs } : {}),
      // An event stream as it comes, with no deadline past its head (a GET stream lives as long as the session); anything else read whole.
      streamIf: (_status, headers) => isEventStream(headers),
      answer(result) {
        const resumed = tied !== undefined && result.kind === 'stream' && result.status === 200;
        if (tied !== undefined && !resumed) tied.untie();
        switch (result.kind) {
          case 'stream': {
            const body = resumed ? watchResumed(result.body, tied!, route.maxResponseBytes) : result.body;
            const stream =
              access !== null
                ? filtering(body, route, endpoint, listId, access, x.requestId)
                : listId === null
                  ? body
                  : learning(body, route, endpoint, listId);
            return { reply: passthrough(result.status, result.headers, stream), decision };
          }
          case 'response': {
            if (listId !== null && result.status === 200) learnFrom(result.headers, result.body, route, endpoint, listId);
            let body: Uint8Array | null = result.status === 204 ? null : result.body;
            if (access !== null && result.status === 200) {
              const filtered = filteredAnswer(result.headers, result.body, route, listId, access);
              if (filtered === null) return refused(unfilterable(route), 'upstream-unavailable');
              body = filtered;
            }
            return { reply: passthrough(result.status, result.headers, body), decision };
          }
          case 'refused':
            return refused(
              { code: 'upstream-unavailable', detail: `the message could not be sent to the upstream (${result.error}); nothing was sent` },
              'upstream-unavailable',
            );
          case 'unknown':
            return refused({ code: 'upstream-timeout', detail: `no complete answer from the upstream (${result.error})` }, 'upstream-timeout');
          case 'too-large':
            return refused(
              {
                code: 'upstream-response-too-large',
                detail: `the upstream's answer exceeded this route's maxResponseBytes of ${result.limit} bytes`,
                extras: { upstream_status: result.status },
              },
              'upstream-response-too-large',
            );
        }
      },
    };
  };

  /** The stream as it came, byte for byte, read on the way for the `tools/list` response. */
  function learning(body: ReadableStream<Uint8Array>, route: RouteConfig, endpoint: string, listId: string | number): ReadableStream<Uint8Array> {
    let splitter: SseSplitter | null = new SseSplitter(route.maxResponseBytes);
    return body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, controller) {
          controller.enqueue(chunk);
          const events = splitter?.push(chunk) ?? null;
          if (events === null) splitter = null;
          for (const e of events ?? []) {
            const msg = messageOf(e);
            if (isResponseTo(msg, listId)) annotations.learn(route.name, endpoint, (msg as { result?: unknown }).result);
          }
        },
      }),
    );
  }

  /**
   * On a route with `toolAccess`: the stream passed on event by event (each as it came), the list's
   * response (to `listId`), and any other response that holds a tools list, with the denied tools taken
   * out (filterEvent below). An event past maxResponseBytes, or a response to the list that cannot
   * be read, ends the stream, with a JSON-RPC error to the list when there is one: never a list unfiltered.
   */
  function filtering(
    body: ReadableStream<Uint8Array>,
    route: RouteConfig,
    endpoint: string,
    listId: string | number | null,
    access: ToolAccess,
    requestId: string,
  ): ReadableStream<Uint8Array> {
    const splitter = new SseSplitter(route.maxResponseBytes);
    const encoder = new TextEncoder();
    const pass = (events: SseEvent[], controller: TransformStreamDefaultController<Uint8Array>): void => {
      for (const e of events) {
        const msg = messageOf(e);
        const isList = listId !== null && isResponseTo(msg, listId);
        if (isList) annotations.learn(route.name, endpoint, (msg as { result?: unknown }).result);
        const raw = filterEvent(e, msg, access, isList);
        if (raw === null) return fail(controller, unfilterable(route));
        controller.enqueue(encoder.encode(raw));
      }
    };
    const fail = (controller: TransformStreamDefaultController<Uint8Array>, refusal: Refusal): void => {
      if (listId !== null) controller.enqueue(encoder.encode(sseMessage(refusalReply(refusal, listId, requestId).body as string)));
      controller.terminate();
    };
    return body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, controller) {
          const events = splitter.push(chunk);
          if (events === null)
            return fail(controller, {
              code: 'upstream-response-too-large',
              detail: `an event of the upstream's answer exceeded this route's maxResponseBytes of ${route.maxResponseBytes} bytes; it was not passed on, as it could not be checked for tools this route does not allow`,
            });
          pass(events, controller);
        },
        flush(controller) {
          pass(splitter.end(), controller);
        },
      }),
    );
  }

  /**
   * A whole answer (JSON, or an event stream read whole) with the denied tools taken out as `filtering`
   * does; null when the answer to the list (`listId`) cannot be read. Anything else unreadable passes as it came.
   */
  function filteredAnswer(
    headers: [string, string][],
    body: Uint8Array,
    route: RouteConfig,
    listId: string | number | null,
    access: ToolAccess,
  ): Uint8Array | null {
    const strict = listId !== null;
    let text: string;
    try {
      if (isEncoded(headers)) throw new Error('encoded');
      text = new TextDecoder('utf-8', { fatal: true }).decode(body);
    } catch {
      return strict ? null : body;
    }
    if (!isEventStream(headers)) {
      // A JSON answer is the response itself (its id is the client's to check).
      const filtered = strict ? filterToolsList(text, access) : filterMessage(text, parseData(text), access);
      return filtered === null ? null : filtered === text ? body : new TextEncoder().encode(filtered);
    }
    const events = eventsOf(body, route.maxResponseBytes);
    if (events === null) return strict ? null : body;
    let out = '';
    let changed = false;
    for (const e of events) {
      const msg = messageOf(e);
      const raw = filterEvent(e, msg, access, strict && isResponseTo(msg, listId));
      if (raw === null) return null;
      changed ||= raw !== e.raw;
      out += raw;
    }
    return changed ? new TextEncoder().encode(out) : body;
  }

  function learnFrom(headers: [string, string][], body: Uint8Array, route: RouteConfig, endpoint: string, listId: string | number): void {
    const messages = isEventStream(headers)
      ? (eventsOf(body, route.maxResponseBytes) ?? []).map((e) => messageOf(e))
      : [parseData(new TextDecoder().decode(body))];
    for (const msg of messages) if (isResponseTo(msg, listId)) annotations.learn(route.name, endpoint, (msg as { result?: unknown }).result);
  }

  /**
   * A task call answered with a CreateTaskResult whose task is not over: the
   * follow (./tasks.ts followTask) to the finish that records the task's
   * result under the key. Null for anything else (a plain result, an error,
   * a handle of a task already over, no forwarder): recorded as it came.
   */
  function following(x: Exchange, call: ToolCall, stored: StoredResponse, base: Base, timeoutMs: number): Promise<Omit<Settled, 'reply'>> | null {
    if (call.task === null || deps.forwarder === undefined || x.sent === undefined || base.key === null) return null;
    const task = createdTask(new TextDecoder().decode(stored.body));
    if (task === null || TERMINAL_TASK_STATUSES.includes(task.status)) return null;
    const route = x.route!;
    const extendLock = deps.extendLock ?? null;
    const key = base.key;
    const followed = performance.now();
    const tracked = `${route.name}\u0000${task.taskId}`;
    if (followedTasks.size < MAX_FOLLOWED_TASKS) followedTasks.set(tracked, x.trace.entity ?? null);
    return followTask({
      forwarder: deps.forwarder,
      route,
      url: x.sent.url,
      headers: { ...x.sent.headers, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      taskId: task.taskId,
      callId: call.id,
      pollIntervalMs: task.pollInterval,
      // The record and, on a serial route, the entity's slot: both stay this call's while its task runs.
      extend: extendLock === null ? null : (ms) => extendLock({ scope: base.scope, key, entity: base.entity, owner: base.ownerToken, ms }),
      lockEnds: x.upstreamStarted + timeoutMs + route.lockMarginMs,
      lockMs: route.timeoutMs + route.lockMarginMs,
      deadline: followed + route.taskTimeoutMs,
      ...(deps.closing !== undefined ? { signal: deps.closing } : {}),
    }).then((end) => {
      followedTasks.delete(tracked);
      x.trace.upstream_ms = roundMs(performance.now() - x.upstreamStarted);
      if (end.kind === 'done')
        return { finish: { ...base, outcome: 'completed', response: end.response, retentionMs: route.retention }, decision: `task-${end.status}` };
      // The handle stays with the record as its interim answer: the task's id, for the reconciler's tasks/get (./reconcile.ts).
      return { finish: { ...base, outcome: 'unknown', interim: stored }, decision: end.kind === 'lost' ? 'task-lock-lost' : 'task-unknown' };
    });
  }

  return {
    // Everything of a call is in its body.
    head: (x) => ({ ok: true, state: { id: null, httpStatus: x.req.method !== 'POST', call: null } }),

    read(x, state, body, hash) {
      if (x.req.method !== 'POST') {
        // A GET or DELETE carries no JSON-RPC message: a body on one would reach the upstream undecided (a tools/call smuggled past the decision).
        if (body.byteLength > 0)
          return {
            kind: 'refused',
            refusal: { code: 'invalid-request', detail: `a ${x.req.method} to an mcp route carries no body; send JSON-RPC messages as POST` },
            state,
          };
        return { kind: 'pass', pass: passing(x, null, null) };
      }
      const message = readMessage(body);
      if (message.kind === 'refused') {
        return {
          kind: 'refused',
          refusal: message.refusal,
          state: { ...state, id: message.id, ...(message.rpcCode !== undefined ? { rpcCode: message.rpcCode } : {}) },
        };
      }
      if (message.kind === 'pass') {
        if (message.hiddenList === true && toolAccess(x.route!) !== null) {
          // Its answer could not be told and filtered (./access.ts): a lenient upstream would show every tool.
          return {
            kind: 'refused',
            refusal: {
              code: 'invalid-request',
              detail:
                'this route shows only its allowed tools, so a tools/list must be a single message (no batch) with a string or integer id and the method exactly "tools/list"',
            },
            state: { ...state, id: message.id },
          };
        }
        // A cancel of a decided call in flight is not forwarded: the server would drop the call's answer, and its outcome would be unknown (./resume.ts).
        const cancelled = cancelledRequestId(body);
        if (cancelled !== undefined && calls.cancelled(sessionOf(x), cancelled) !== undefined) {
          return { kind: 'pass', pass: { ...passing(x, message.id, null, 'cancel-withheld'), local: { status: 202, headers: [], body: null } } };
        }
        // A tasks/result blocks until its task ends (MCP 2025-11-25): bounded by taskTimeoutMs, not the route's timeoutMs (./tasks.ts).
        const blocking = message.method === 'tasks/result' ? Math.max(x.route!.timeoutMs, x.route!.taskTimeoutMs) : undefined;
        return { kind: 'pass', pass: passing(x, message.id, message.listId, 'passed', blocking) };
      }
      if (message.kind === 'task-op') {
        // A task method that changes state: fenced as a call is, no key (./tasks.ts parseTaskOpCommand).
        hash();
        const followedRoute = x.route!.name;
        const op = parseTaskOpCommand(x.route!, message, x.req.headers, { signedFences: deps.signedFences });
        x.route = op.route;
        const opState: McpState = { id: message.id, httpStatus: false, call: null, op: message };
        if (!op.ok) return { kind: 'refused', refusal: op.refusal, state: opState };
        // A task this process follows is changed only under its own entity: else a stale holder
        // could name a fresh entity, whose first fence is accepted, and cancel the task.
        const owner = followedTasks.get(`${followedRoute}\u0000${message.taskId}`);
        if (owner !== undefined && owner !== op.command.entity)
          return {
            kind: 'refused',
            refusal: {
              code: 'invalid-entity',
              detail: `${message.method}: task ${message.taskId.slice(0, 64)} belongs to another entity than the one this message names`,
            },
            state: opState,
          };
        return { kind: 'command', state: opState, command: op.command };
      }

      const route = x.route!;
      // A name the config lists or the upstream's list had, else one label for all: the metric's labels stay bounded.
      // What the upstream's lists taught is per endpoint: this path and query, where this call goes (./policy.ts).
      const endpoint = x.pathname + x.search;
      x.tool = {
        name: message.name,
        label: route.tools[message.name] !== undefined || annotations.known(route.name, endpoint, message.name) ? message.name : '_unlisted',
      };
      x.trace.tool = message.name.slice(0, 128);
      // Before the tool's policy: a denied tool is refused whether it is read-only or not, and never forwarded.
      const denial = toolAccess(route)?.denial(message.name) ?? null;
      if (denial !== null) {
        // A tool call's rows carry its body's hash (the call is its body).
        hash();
        return {
          kind: 'refused',
          refusal: {
            code: 'tool-denied',
            detail: `the tool ${JSON.stringify(message.name.slice(0, 128))} is not allowed on this route (${denial}); nothing was sent`,
          },
          state: { id: message.id, httpStatus: false, call: message },
        };
      }
      const policy = toolPolicy(route, message.name, annotations, endpoint);
      if (policy.readOnly) {
        x.trace.read_only = policy.readOnlyFrom!;
        return { kind: 'pass', pass: passing(x, message.id, null, 'passed-read-only') };
      }
      // The call is decided under the tool's policy: the route's fields with the tool's overrides.
      x.route = policy.route;
      hash();
      const called: McpState = { id: message.id, httpStatus: false, call: message };
      const parsed = parseToolCommand(policy.route, message, x.req.headers, x.params, { signedFences: deps.signedFences });
      if (!parsed.ok) return { kind: 'refused', refusal: parsed.refusal, state: called };
      const tool = `mcp:${message.name}`;
      const command: Command = {
        ...parsed.command,
        keyScope: null,
        // Per route and tool (and caller), not per session: a retry on a new session gets the stored answer.
        // And per path: on a `/mcp/*` route `/mcp/tenant-a` and `/mcp/tenant-b` are two endpoints, so two key spaces.
        scopeSuffix: `\u0000${tool}\u0000path:${x.pathname}`,
        // The path and query as a plain route's, the tool and its arguments as written; not the
        // JSON-RPC id, not _meta (progress tokens, the fence), not the session (DESIGN §3.4).
        fingerprint: { method: 'POST', contentType: 'application/json', bodyDigest: sha256Hex(new TextEncoder().encode(`${tool}\u0000${message.argsDigest}`)) },
      };
      called.watch = calls.open(sessionOf(x), message.id, policy.route.timeoutMs + policy.route.lockMarginMs);
      return { kind: 'command', state: called, command };
    },

    render: (x, refusal, state) => {
      state?.watch?.close();
      return refusalReply(refusal, state?.id ?? null, x.requestId, {
        ...(state?.httpStatus ? { httpStatus: true } : {}),
        ...(state?.rpcCode !== undefined ? { rpcCode: state.rpcCode } : {}),
      });
    },
    presented: (x, code, state) =>
      state?.call
        ? presentedInCall(x.route!, state.call, code, x.req.headers)
        : state?.op
          ? presentedInCall(x.route!, { ...state.op, params: state.op.params } as unknown as ToolCall, code, x.req.headers)
          : null,
    entitySource: (x) => `_meta["${MCP_META.entity}"]${'json' in x.route!.entity ? ` or params${x.route!.entity.json}` : ''}`,
    replay: (_x, stored, state) => {
      state.watch?.close();
      return replayReply(stored, state.id);
    },
    upstreamHeaders: mcpUpstreamHeaders,
    // An event stream that holds the call's answer is read as it comes; anything else whole.
    streamIf: (status, headers) => status === 200 && isEventStream(headers) && !isEncoded(headers),

    settle(x, state, result, base, timeoutMs): Settled | Streaming {
      const route = x.route!;
      if (state.op !== undefined) {
        const op = state.op;
        return settleTaskOp(result, base, (refusal) => ({
          finish: { ...base, outcome: 'released' },
          decision: refusal.code,
          reply: refusalReply(refusal, op.id, x.requestId),
        }));
      }
      const call = state.call!;
      const answer = (finish: Settled['finish'], decision: string, refusal: Refusal): Settled => ({
        finish,
        decision,
        reply: refusalReply(refusal, call.id, x.requestId),
      });
      const watch = state.watch ?? null;
      // Only a streamed answer can come on another stream; for any other the call is no longer watched.
      if (result.kind !== 'stream') watch?.close();
      switch (result.kind) {
        case 'stream':
          return streamed(x, call, result, base, timeoutMs, following, watch, deps.resume);
        case 'response': {
          const settled = settleBuffered(result, call, route, base, route.maxResponseBytes);
          const follow = settled.finish.outcome === 'completed' ? following(x, call, settled.finish.response, base, timeoutMs) : null;
          if (follow === null) return settled;
          // The handle goes to the caller now; the record stays in progress until the task's end is recorded (./tasks.ts).
          return { head: settled.reply, ended: follow.then((end) => ({ ...end, reply: settled.reply, after: () => {} })), abort: () => {} };
        }
        case 'refused':
          return answer({ ...base, outcome: 'released' }, 'upstream-unavailable', {
            code: 'upstream-unavailable',
            detail: `the call could not be sent to the upstream (${result.error}); nothing was sent, retry with the same key is safe`,
          });
        case 'unknown':
          return answer({ ...base, outcome: 'unknown' }, 'upstream-timeout', unknownRefusal(result.timedOut, result.error, timeoutMs));
        case 'too-large': {
          if (route.releaseStatuses.includes(result.status)) {
            return answer({ ...base, outcome: 'released' }, 'upstream-response-too-large-released', {
              code: 'upstream-response-too-large',
              detail: `the upstream answered ${result.status} (not processed) with a body over maxResponseBytes; the key was released, a retry is safe`,
            });
          }
          const { stored, json } = tooLargeAnswer(result.status, result.limit, call, x.requestId);
          return {
            finish: { ...base, outcome: 'completed', response: stored, retentionMs: route.retention },
            reply: { status: 200, headers: stored.headers.slice(), body: json },
            decision: 'upstream-response-too-large',
          };
        }
      }
    },

    expiredDetail: (lockMs) =>
      `the gateway was delayed past this call's ${lockMs} ms lock before the upstream; nothing was sent, retry with the same key is safe`,
    expiredExtras: (command) => ({ entity: command.entity, idempotency_key: command.key }),
  };
}

/**
 * An event stream: its head and events go to the caller now; the call's
 * response is recorded first and forwarded then (`after`), so the caller
 * never sees an answer that is not yet durable.
 */
function streamed(
  x: Exchange,
  call: ToolCall,
  answer: StreamedAnswer,
  base: Base,
  timeoutMs: number,
  following: (x: Exchange, call: ToolCall, stored: StoredResponse, base: Base, timeoutMs: number) => Promise<Omit<Settled, 'reply'>> | null,
  watch: CallWatch | null,
  resume: ResumeUpstream | undefined,
): Streaming {
  const route = x.route!;
  const caller = new CallerStream(route.maxResponseBytes);
  const left = Math.max(1, timeoutMs - (performance.now() - x.upstreamStarted));
  const head = passthrough(answer.status, answer.headers, caller.stream);
  watch?.extend(left + route.lockMarginMs);
  const ended = (async () => {
    // Across the streams that may carry the answer: the POST's, a resuming GET of the client's, the gateway's own resume (./resume.ts).
    const end = await followStreams(answer.body, call, {
      limit: route.maxResponseBytes,
      deadline: performance.now() + left,
      forward: (e) => caller.send(e.raw),
      watch,
      resume: resume === undefined ? null : (lastEventId, ms) => resume(x, lastEventId, ms),
      resumed: () => void (x.trace.resumes = (x.trace.resumes ?? 0) + 1),
    });
    x.trace.upstream_ms = roundMs(performance.now() - x.upstreamStarted);
    let settled: Omit<Settled, 'reply'>;
    let last: string;
    if (end.kind === 'final') {
      const stored = storedMessage(end.data);
      const follow = following(x, call, stored, base, timeoutMs);
      if (follow !== null) {
        // A created task: its handle ends the caller's stream now; the record waits for the task's end (./tasks.ts).
        watch?.close();
        caller.send(end.event.raw);
        caller.close();
        return { ...(await follow), reply: { status: head.status, headers: head.headers, body: null }, after() {} };
      }
      settled = { finish: { ...base, outcome: 'completed', response: stored, retentionMs: route.retention }, decision: 'forwarded' };
      last = end.event.raw;
    } else if (end.kind === 'too-large') {
      const { stored, json } = tooLargeAnswer(answer.status, route.maxResponseBytes, call, x.requestId);
      settled = { finish: { ...base, outcome: 'completed', response: stored, retentionMs: route.retention }, decision: 'upstream-response-too-large' };
      last = sseMessage(json);
    } else {
      settled = { finish: { ...base, outcome: 'unknown' }, decision: 'upstream-timeout' };
      last = sseMessage(refusalReply(unknownRefusal(end.timedOut, end.error, timeoutMs), call.id, x.requestId).body as string);
    }
    return {
      ...settled,
      reply: { status: head.status, headers: head.headers, body: null },
      after() {
        watch?.close();
        caller.send(last);
        caller.close();
      },
    };
  })();
  return {
    head,
    ended,
    abort: () => {
      watch?.close();
      caller.close();
    },
  };
}

/** Why a `tools/list` answer on a route with `toolAccess` is not passed on: it could not be read, so not filtered. */
function unfilterable(route: RouteConfig): Refusal {
  return {
    code: 'upstream-unavailable',
    detail: `the upstream's tools/list answer could not be read as a JSON-RPC response (encoded, not UTF-8, not JSON, or its tools not a list), so it could not be narrowed to route ${route.name}'s allowed tools and was not passed on`,
  };
}

/**
 * An event as it is passed on: the response to the list (`isList`) with the denied tools taken out, null
 * when it cannot be read; any other response that holds a tools list likewise, else the event as it came.
 */
function filterEvent(e: SseEvent, msg: unknown, access: ToolAccess, isList: boolean): string | null {
  if (msg === undefined && !isList) return e.raw;
  const filtered = isList ? filterToolsList(e.data!, access) : filterMessage(e.data!, msg, access);
  if (filtered === null) return null;
  return filtered === e.data ? e.raw : withData(e.raw, filtered);
}

/** An event with its `data` replaced by `json` (one `data:` line per line of it), its other fields as they came. */
function withData(raw: string, json: string): string {
  const fields = raw.split(/\r\n|\r|\n/).filter((line) => line !== '' && !/^data(:|$)/.test(line));
  return [...fields, ...json.split(/\r\n|\r|\n/).map((line) => `data: ${line}`)].join('\n') + '\n\n';
}

function unknownRefusal(timedOut: boolean, error: string, timeoutMs: number): Refusal {
  return {
    code: 'upstream-timeout',
    detail: `${timedOut ? `no answer to the call within ${timeoutMs} ms` : `the connection failed (${error})`} after the call may have reached the tool; the outcome is unknown`,
  };
}
