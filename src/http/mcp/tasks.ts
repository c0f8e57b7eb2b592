import type { RouteConfig } from '../../config/schema.js';
import type { Refusal } from '../../protocol/problem.js';
import type { StoredResponse } from '../../store/types.js';
import type { Forwarder, StreamedAnswer, UpstreamResult } from '../forward.js';
import type { HeaderReader } from '../inbound.js';
import type { Command } from '../pipeline/codec.js';
import { parseToolCommand } from './command.js';
import { isObject, type TaskOp } from './message.js';
import { isEncoded, isEventStream, passthrough, type Base, type Settled } from './outcome.js';
import { eventsOf, isResponseTo, parseData } from './stream.js';

// MCP tasks (spec 2025-11-25, the task augmentation of SEP-1686; the SDK
// 1.32.x in use implements that revision). What a route does with them
// (docs/mcp.md "Tasks"):
//
// - A tools/call with `params.task` is a command like any call, and its
//   fingerprint covers `task` (./message.ts argumentsDigest).
// - When the upstream answers it with a CreateTaskResult, the caller gets
//   that handle at once, and the gateway follows the task itself (followTask
//   below): it keeps the record in progress, and so the key and the serial
//   slot, while it polls `tasks/get` upstream, then records the task's
//   `tasks/result` as the key's answer. A retry from any session then gets
//   that result, never a handle another session cannot read.
// - `tasks/cancel` changes a task's state: it must carry the fence and the
//   entity, and is admitted as a fence check alone (no key, no serial slot);
//   a stale fence is refused and never reaches the upstream.
// - `tasks/get`, `tasks/list` and `tasks/result` only read: they pass
//   undecided; a blocking `tasks/result` is bounded by `taskTimeoutMs`, not
//   by the route's `timeoutMs`.

/** The task statuses after which nothing more happens (MCP 2025-11-25 TaskStatus). */
export const TERMINAL_TASK_STATUSES: readonly string[] = ['completed', 'failed', 'cancelled'];

/** The shortest and longest wait between two `tasks/get` the gateway sends (the server's `pollInterval` is kept within them). */
export const MIN_POLL_MS = 50;
export const MAX_POLL_MS = 30_000;

/**
 * The fence and entity of a state-changing task method. It names a task,
 * not a tool: it is read under the route's fields, with the fence required
 * when the route or any tool requires one (the cancel of a fenced tool's
 * task must not pass unfenced), the entity from `_meta` (or the route's
 * entity header: a `{json}` pointer reads a call's arguments, which a
 * cancel does not carry), no key, and admitted `concurrent`: a fence check
 * that takes no serial slot (the task's own call holds it while it runs).
 */
export function parseTaskOpCommand(
  route: RouteConfig,
  op: TaskOp,
  headers: HeaderReader,
  options: { signedFences: boolean },
): { ok: true; route: RouteConfig; command: Command } | { ok: false; route: RouteConfig; refusal: Refusal } {
  const fences = [route.fence, ...Object.values(route.tools).map((t) => t.fence)];
  const fence = fences.includes('required') ? 'required' : fences.every((f) => f === 'off' || f === undefined) && route.fence === 'off' ? 'off' : 'optional';
  const opRoute: RouteConfig = {
    ...route,
    fence,
    idempotency: 'off',
    mode: 'concurrent',
    entity: 'header' in route.entity ? route.entity : { header: 'X-Fence-Entity' },
  };
  const asCall = { kind: 'call' as const, id: op.id, name: op.method, args: {}, argsDigest: '', params: op.params, meta: op.meta, task: null, text: op.text };
  const parsed = parseToolCommand(opRoute, asCall, headers, {}, options);
  if (!parsed.ok) return { ok: false, route: opRoute, refusal: parsed.refusal };
  const { command } = parsed;
  return {
    ok: true,
    route: opRoute,
    command: {
      ...command,
      key: null,
      keyScope: null,
      scopeSuffix: `\u0000${op.method}`,
      fingerprint: { method: 'POST', contentType: 'application/json', bodyDigest: '' },
    },
  };
}

/** A state-changing task method's answer: passed on as it came; nothing is stored (it has no key). */
export function settleTaskOp(result: UpstreamResult | StreamedAnswer, base: Base, fallback: (refusal: Refusal) => Settled): Settled {
  const released = { ...base, outcome: 'released' as const };
  switch (result.kind) {
    case 'stream':
      return { finish: released, reply: passthrough(result.status, result.headers, result.body), decision: 'forwarded' };
    case 'response':
      return { finish: released, reply: passthrough(result.status, result.headers, result.status === 204 ? null : result.body), decision: 'forwarded' };
    case 'refused':
      return fallback({ code: 'upstream-unavailable', detail: `the message could not be sent to the upstream (${result.error}); nothing was sent` });
    case 'unknown':
      return fallback({ code: 'upstream-timeout', detail: `no complete answer from the upstream (${result.error})` });
    case 'too-large':
      return fallback({ code: 'upstream-response-too-large', detail: `the upstream's answer exceeded this route's maxResponseBytes of ${result.limit} bytes` });
  }
}

/** The task of a CreateTaskResult response (its `result.task`), or null when the response is anything else (a plain result, an error). */
export function createdTask(data: string): { taskId: string; status: string; pollInterval: number | null } | null {
  const msg = parseData(data);
  if (!isObject(msg) || !isObject(msg.result) || !isObject(msg.result.task)) return null;
  const t = msg.result.task;
  if (typeof t.taskId !== 'string' || t.taskId.length === 0 || typeof t.status !== 'string') return null;
  return { taskId: t.taskId, status: t.status, pollInterval: typeof t.pollInterval === 'number' && Number.isFinite(t.pollInterval) ? t.pollInterval : null };
}

/** The store's lock extension (DESIGN §3.5), when the store has it: true while this owner still holds the record. */
export type ExtendLock = (input: { scope: string; key: string; owner: string; ms: number }) => Promise<boolean>;

export interface FollowTask {
  forwarder: Forwarder;
  route: RouteConfig;
  /** The upstream URL the call went to (its session's endpoint). */
  url: string;
  /** The call's upstream headers (session, protocol version, credentials), content type and accept set for JSON-RPC. */
  headers: Record<string, string>;
  taskId: string;
  /** The call's JSON-RPC id: the recorded answer is a response to it (a replay re-ids it). */
  callId: string | number;
  pollIntervalMs: number | null;
  /** Keeps the record (and the serial slot) this owner's for `ms` more; absent: the store cannot, and the follow ends with the admission's lock. */
  extend: ((ms: number) => Promise<boolean>) | null;
  /** The admission's lock end (performance.now() clock), and its length. */
  lockEnds: number;
  lockMs: number;
  /** Never past this (performance.now() clock): `taskTimeoutMs` from the call. */
  deadline: number;
  signal?: AbortSignal;
}

export type FollowEnd =
  /** The task is terminal: its `tasks/result` as the response to the call. */
  | { kind: 'done'; response: StoredResponse; status: string }
  /** The record is no longer this owner's (its lock could not be kept): nothing may be recorded. */
  | { kind: 'lost' }
  /** The task's end was not seen within the bound (or the upstream stopped answering): the outcome is unknown. */
  | { kind: 'unknown'; reason: string };

/**
 * Follows a created task to its end, within the record's lock: before each
 * wait the lock is extended by the route's lock length (`timeoutMs +
 * lockMarginMs`), so the record stays in progress (a retry is
 * `idempotency-in-progress`, a serial call of the entity `entity-busy`)
 * for as long as the task runs, and never longer than this process follows
 * it (a gateway that dies lets the lock run out: the record becomes
 * outcome_unknown, as any lost answer, DESIGN §3.12). Without the store's
 * extension the follow ends with the admission's lock. Each `tasks/get` is
 * bounded by the route's `timeoutMs`; the server's `pollInterval` is kept
 * within MIN_POLL_MS..MAX_POLL_MS. Once the task is terminal, `tasks/result`
 * (which then answers at once) gives the answer recorded under the key.
 */
export async function followTask(f: FollowTask): Promise<FollowEnd> {
  const poll = Math.min(MAX_POLL_MS, Math.max(MIN_POLL_MS, f.pollIntervalMs ?? 1000));
  let lockEnds = f.lockEnds;
  let seq = 0;
  let failures = 0;
  for (;;) {
    if (f.signal?.aborted) return { kind: 'unknown', reason: 'the gateway stopped following the task' };
    if (f.extend !== null) {
      let kept: boolean;
      try {
        kept = await f.extend(f.lockMs);
      } catch {
        kept = false;
      }
      if (!kept) return { kind: 'lost' };
      lockEnds = performance.now() + f.lockMs;
    }
    const safeEnd = Math.min(f.deadline, lockEnds - f.route.lockMarginMs);
    if (performance.now() + poll >= safeEnd)
      return { kind: 'unknown', reason: `the task did not end within the ${f.extend === null ? "record's lock" : 'taskTimeoutMs'}` };
    await sleep(poll, f.signal);
    const got = await rpc(f, 'tasks/get', `fencegate-task-get-${++seq}`, Math.min(f.route.timeoutMs, Math.max(1, safeEnd - performance.now())));
    if (got.kind !== 'result') {
      // A passing failure (a restart of the server's front, a slow answer) is tried again while the bound allows; a refusal by the server is final.
      if (got.kind === 'error' || ++failures > 5) return { kind: 'unknown', reason: got.reason };
      continue;
    }
    failures = 0;
    const status = isObject(got.result) && typeof got.result.status === 'string' ? got.result.status : null;
    if (status === null) return { kind: 'unknown', reason: 'tasks/get answered without a status' };
    if (!TERMINAL_TASK_STATUSES.includes(status)) continue;
    const res = await rpc(f, 'tasks/result', `fencegate-task-result-${seq}`, f.route.timeoutMs);
    if (res.kind === 'transport') return { kind: 'unknown', reason: res.reason };
    // The task's outcome as a response to the call: its result (the tool's CallToolResult), or its error.
    const message = res.kind === 'result' ? { jsonrpc: '2.0', id: f.callId, result: res.result } : { jsonrpc: '2.0', id: f.callId, error: res.error };
    const text = JSON.stringify(message);
    if (new TextEncoder().encode(text).byteLength > f.route.maxResponseBytes)
      return { kind: 'unknown', reason: `the task's result exceeded maxResponseBytes of ${f.route.maxResponseBytes}` };
    return { kind: 'done', status, response: { status: 200, headers: [['content-type', 'application/json']], body: new TextEncoder().encode(text) } };
  }
}

type RpcAnswer =
  | { kind: 'result'; result: unknown }
  /** A JSON-RPC error from the server: it read the request. */
  | { kind: 'error'; error: unknown; reason: string }
  /** No readable answer. */
  | { kind: 'transport'; reason: string };

/** One JSON-RPC request about the task to the upstream, in the call's session; its response read from JSON or an event stream. */
async function rpc(f: FollowTask, method: 'tasks/get' | 'tasks/result', id: string, timeoutMs: number): Promise<RpcAnswer> {
  const body = new TextEncoder().encode(JSON.stringify({ jsonrpc: '2.0', id, method, params: { taskId: f.taskId } }));
  let answer: UpstreamResult;
  try {
    answer = await f.forwarder.forward({
      url: f.url,
      method: 'POST',
      headers: f.headers,
      body,
      timeoutMs: Math.max(1, timeoutMs),
      maxResponseBytes: f.route.maxResponseBytes,
    });
  } catch (err) {
    return { kind: 'transport', reason: `${method}: ${String(err)}` };
  }
  if (answer.kind !== 'response') return { kind: 'transport', reason: `${method}: ${answer.kind === 'too-large' ? 'answer too large' : answer.error}` };
  return readRpc(answer.status, answer.headers, answer.body, id, method);
}

/** The JSON-RPC response to `id` in a whole answer (JSON or an event stream). */
export function readRpc(status: number, headers: [string, string][], body: Uint8Array, id: string | number, what: string): RpcAnswer {
  if (status !== 200 || isEncoded(headers)) return { kind: 'transport', reason: `${what}: the upstream answered ${status}` };
  const messages = isEventStream(headers)
    ? (eventsOf(body, Number.MAX_SAFE_INTEGER) ?? []).map((e) => parseData(e.data))
    : [parseData(new TextDecoder().decode(body))];
  const msg = messages.find((m) => isResponseTo(m, id)) as { result?: unknown; error?: unknown } | undefined;
  if (msg === undefined) return { kind: 'transport', reason: `${what}: no response to the request in the upstream's answer` };
  if ('error' in msg && msg.error !== undefined) return { kind: 'error', error: msg.error, reason: `${what}: the server answered an error` };
  return { kind: 'result', result: msg.result };
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done, { once: true });
  });
}
