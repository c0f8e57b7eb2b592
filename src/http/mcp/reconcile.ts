import type { McpReconcileConfig, RouteConfig } from '../../config/schema.js';
import { tokensOf, valueAtPointer } from '../command.js';
import type { StoredResponse } from '../../store/types.js';
import type { UpstreamResult } from '../forward.js';
import { errorText } from '../logger.js';
import { newRequestId } from '../request-id.js';
import { joinUrl } from '../upstream-request.js';
import {
  notBefore,
  RECONCILER,
  reported,
  type ReconcileDeps,
  type ReconcileOutcome,
  type ReconcileResult,
  type ReconcileTarget,
} from '../pipeline/reconcile-rules.js';
import { isObject } from './message.js';
import { createdTask, readRpc, TERMINAL_TASK_STATUSES } from './tasks.js';

// The status query of an mcp route (DESIGN §3.12, docs/mcp.md "Reconciling a
// lost answer"): the gateway asks a status tool of the same server, by the
// lost call's key, whether the call was performed. The store side is the
// plain routes' (../pipeline/reconcile.ts): a found answer completes the
// record, a not-found one releases it only once the database clock says the
// attempt can no longer be in flight nor still be landing (resolveRecord
// with notBefore), every decision under the operator `reconciler`.
//
// What the status tool's result means:
//   notFound matches                                  → not found
//   else isError not true, structuredContent an object,
//        and `found` (when configured) matches        → found; the result is the call's stored answer,
//                                                       marked `_meta["io.fencegate/reconciled"]: true`
//   anything else (an error, a transport failure, a
//        result that is neither)                      → unknown: nothing changes
//
// A task call whose follow ended without the task's end (./tasks.ts) keeps
// its CreateTaskResult as the record's interim answer: then the task is asked
// about instead (`tasks/get`, and `tasks/result` once it is over: found, its
// result stored), and the record is never released (the server created the
// task, so it had the call). A server that binds tasks to the session that
// made them (the SDK's stateful servers) answers "not found" to the query's
// own session: nothing is settled, the record stays the operator's.
//
// The query is a session of its own: `initialize`, `notifications/initialized`,
// the `tools/call` (or the task's requests), then `DELETE` of the session. It goes to the endpoint the
// call went to (the path in the record's key scope), with `reconcile.headers`,
// never the caller's headers.

/** The `_meta` member of a reconciled answer. */
export const RECONCILED_META = 'io.fencegate/reconciled';

/** The MCP revision the query's session asks for (the SDK in use speaks it; a server answers the one it has). */
const PROTOCOL_VERSION = '2025-11-25';

type McpTarget = ReconcileTarget & { route: RouteConfig & { reconcile: McpReconcileConfig } };

/** The endpoint (path) a call's record was made at: its key scope ends with `path:<pathname>` (./codec.ts scopeSuffix). */
export function endpointOfScope(scope: string): string | null {
  const i = scope.lastIndexOf('\u0000path:');
  return i === -1 ? null : scope.slice(i + '\u0000path:'.length);
}

/** The arguments with {key}, {entity}, {fence} substituted in every string; null when one is named but the record lacks it. */
export function statusArguments(template: Record<string, unknown>, values: Record<string, string | null>): Record<string, unknown> | null {
  let missing = false;
  const walk = (v: unknown): unknown => {
    if (typeof v === 'string')
      return v.replace(/\{(key|entity|fence)\}/g, (_, name: string) => {
        const x = values[name];
        if (x === null || x === undefined) missing = true;
        return x ?? '';
      });
    if (Array.isArray(v)) return v.map(walk);
    if (isObject(v)) return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, walk(x)]));
    return v;
  };
  const out = walk(template) as Record<string, unknown>;
  return missing ? null : out;
}

/** What a status tool's result says (the rule above). */
export function readStatusResult(rc: McpReconcileConfig, result: unknown): 'found' | 'not-found' | 'unknown' {
  if (!isObject(result)) return 'unknown';
  const at = (pointer: string) => valueAtPointer(result, tokensOf(pointer));
  if (at(rc.notFound.pointer) === rc.notFound.equals) return 'not-found';
  if (result.isError === true || !isObject(result.structuredContent)) return 'unknown';
  if (rc.found !== undefined && at(rc.found.pointer) !== rc.found.equals) return 'unknown';
  return 'found';
}

export function createMcpReconcileQuery(deps: ReconcileDeps) {
  const { store, forwarder, logger } = deps;
  return async function query(t: ReconcileTarget, timeoutMs: number, requestId: string = newRequestId()): Promise<ReconcileOutcome> {
    const route = (t as McpTarget).route;
    const rc = route.reconcile;
    const done = (result: ReconcileResult, changed = false): Promise<ReconcileOutcome> => reported(deps, t, requestId, result, changed);
    const endpoint = endpointOfScope(t.scope);
    const args = statusArguments(rc.arguments, { key: t.key, entity: t.entity, fence: t.fence });
    if (endpoint === null || args === null) return done('error');
    const deadline = performance.now() + Math.max(1, timeoutMs);
    const left = () => Math.max(1, deadline - performance.now());
    const url = joinUrl(route.upstream, endpoint);
    const headers: Record<string, string> = {
      ...(deps.headers.get(route.name) ?? {}),
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'accept-encoding': 'identity',
      'x-request-id': requestId,
    };
    const post = (message: object): Promise<UpstreamResult> =>
      forwarder.forward({
        url,
        method: 'POST',
        headers,
        body: new TextEncoder().encode(JSON.stringify(message)),
        timeoutMs: left(),
        maxResponseBytes: route.maxResponseBytes,
      });
    // A task call's handle, kept as the record's interim answer when its follow ended early.
    let taskId: string | null = null;
    try {
      const interim = await store.getInterim({ scope: t.scope, key: t.key, createdAt: t.createdAt });
      if (interim !== null) taskId = createdTask(new TextDecoder().decode(interim.body))?.taskId ?? null;
    } catch (err) {
      logger.error('reconcile-error', { request_id: requestId, route: route.name, error: errorText(err) });
      return done('error');
    }
    /** The task's state, then its result once it is over: found; anything else settles nothing (never "not found": the task exists). */
    const askTask = async (id: string): Promise<{ kind: 'found'; result: Record<string, unknown> } | { kind: ReconcileResult }> => {
      const got = await post({ jsonrpc: '2.0', id: 'fencegate-reconcile-task', method: 'tasks/get', params: { taskId: id } });
      if (got.kind !== 'response') return { kind: 'unknown' };
      const state = readRpc(got.status, got.headers, got.body, 'fencegate-reconcile-task', 'tasks/get');
      const status = state.kind === 'result' && isObject(state.result) ? state.result.status : undefined;
      if (typeof status !== 'string' || !TERMINAL_TASK_STATUSES.includes(status)) return { kind: 'unknown' };
      const res = await post({ jsonrpc: '2.0', id: 'fencegate-reconcile-result', method: 'tasks/result', params: { taskId: id } });
      if (res.kind !== 'response') return { kind: 'unknown' };
      const answer = readRpc(res.status, res.headers, res.body, 'fencegate-reconcile-result', 'tasks/result');
      return answer.kind === 'result' && isObject(answer.result) ? { kind: 'found', result: answer.result } : { kind: 'unknown' };
    };
    let session: string | null = null;
    let verdict: { kind: 'found'; result: Record<string, unknown> } | { kind: 'not-found' } | { kind: ReconcileResult } = { kind: 'error' };
    try {
      const init = await post({
        jsonrpc: '2.0',
        id: 'fencegate-reconcile-init',
        method: 'initialize',
        params: { protocolVersion: PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: 'fencegate-reconciler', version: '1' } },
      });
      if (init.kind !== 'response') throw new Error(`initialize: ${init.kind === 'too-large' ? 'too large' : init.error}`);
      const initAnswer = readRpc(init.status, init.headers, init.body, 'fencegate-reconcile-init', 'initialize');
      if (initAnswer.kind !== 'result') throw new Error(initAnswer.reason);
      session = init.headers.find(([n]) => n.toLowerCase() === 'mcp-session-id')?.[1] ?? null;
      if (session !== null) headers['mcp-session-id'] = session;
      const version =
        isObject(initAnswer.result) && typeof initAnswer.result.protocolVersion === 'string' ? initAnswer.result.protocolVersion : PROTOCOL_VERSION;
      headers['mcp-protocol-version'] = version;
      await post({ jsonrpc: '2.0', method: 'notifications/initialized' });
      if (taskId !== null) verdict = await askTask(taskId);
      else {
        const call = await post({ jsonrpc: '2.0', id: 'fencegate-reconcile', method: 'tools/call', params: { name: rc.tool, arguments: args } });
        if (call.kind === 'refused') verdict = { kind: 'error' };
        else if (call.kind !== 'response') verdict = { kind: 'unknown' };
        else {
          const answer = readRpc(call.status, call.headers, call.body, 'fencegate-reconcile', 'tools/call');
          const read = answer.kind === 'result' ? readStatusResult(rc, answer.result) : 'unknown';
          verdict = read === 'found' ? { kind: 'found', result: answer.kind === 'result' ? (answer.result as Record<string, unknown>) : {} } : { kind: read };
        }
      }
    } catch (err) {
      logger.error('reconcile-error', { request_id: requestId, route: route.name, error: errorText(err) });
      verdict = { kind: 'error' };
    } finally {
      // The session is the query's own: ended, without waiting long for it.
      if (session !== null)
        void forwarder.forward({ url, method: 'DELETE', headers: { ...headers }, body: null, timeoutMs: 1_000, maxResponseBytes: 4096 }).catch(() => {});
    }

    const base = { scope: t.scope, key: t.key, operator: RECONCILER, requestId, createdAt: t.createdAt };
    try {
      if (verdict.kind === 'found') {
        const { result } = verdict as { result: Record<string, unknown> };
        const meta = isObject(result._meta) ? result._meta : {};
        // A response to the call (a replay answers it under the retry's own id).
        const message = { jsonrpc: '2.0', id: 'fencegate-reconciled', result: { ...result, _meta: { ...meta, [RECONCILED_META]: true } } };
        const response: StoredResponse = {
          status: 200,
          headers: [['content-type', 'application/json']],
          body: new TextEncoder().encode(JSON.stringify(message)),
        };
        await store.resolveRecord({
          ...base,
          resolution: { outcome: 'completed', response, retentionMs: route.retention },
          note: taskId !== null ? `task ${taskId.slice(0, 64)} is over: performed` : `status tool ${rc.tool} found the call: performed`,
        });
        return done('found', true);
      }
      if (verdict.kind === 'not-found') {
        const r = await store.resolveRecord({
          ...base,
          resolution: { outcome: 'released', notBefore: notBefore(t.route) },
          note: `status tool ${rc.tool} did not find the call: not performed`,
        });
        if (r.ok) return done('not-found', true);
        if (r.reason === 'too-early') return done('not-yet-trusted');
        return done('not-found', true);
      }
    } catch (err) {
      logger.error('reconcile-error', { request_id: requestId, route: route.name, error: errorText(err) });
      return done('error');
    }
    return done(verdict.kind === 'error' ? 'error' : 'unknown');
  };
}
