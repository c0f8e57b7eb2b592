import type { Context, Hono } from 'hono';
import { z } from 'zod';
import type { RouteConfig } from '../../config/schema.js';
import type { Refusal } from '../../protocol/problem.js';
import type { FenceHistoryRow, GatewayStore, OperatorAction, RecordInfo, RecordState, Resolution } from '../../store/types.js';
import { readBody } from '../body.js';
import { reconcileStatus } from '../reconciler.js';
import { newRequestId } from '../request-id.js';
import { registerBulkResolve } from './bulk-resolve.js';

export interface AuditRouteOptions {
  store: GatewayStore;
  problem: (refusal: Refusal) => Response;
  /** The configured routes: a resolved record keeps its route's `retention` and `replayHeaders`. */
  routes: RouteConfig[];
}

/** Largest response body an operator may store when resolving a record as completed. */
const MAX_RESOLVE_BYTES = 1024 * 1024;
const DEFAULT_RETENTION_MS = 24 * 3_600_000;

const ResolveBody = z
  .strictObject({
    /** Needed only when several outcome_unknown records carry the key (one per route, or per caller). */
    scope: z.string().min(1).optional(),
    outcome: z.enum(['completed', 'released']),
    response: z
      .strictObject({
        status: z.number().int().min(200).max(599),
        headers: z.record(z.string().regex(/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/, 'must be an HTTP header name'), z.string()).default({}),
        body: z.string().optional(),
        body_base64: z
          .string()
          .regex(/^[A-Za-z0-9+/]*={0,2}$/, 'must be base64')
          .optional(),
      })
      .refine((r) => r.body === undefined || r.body_base64 === undefined, 'give "body" or "body_base64", not both')
      .optional(),
    note: z.string().max(2000).optional(),
    /**
     * The record's `created_at` as the listing showed it: only that attempt is
     * resolved, not a later one that reused the key after a release.
     */
    created_at: z.iso.datetime({ offset: true, error: "must be the record's created_at, e.g. 2026-05-01T10:00:00.123Z" }).optional(),
  })
  .superRefine((b, ctx) => {
    if (b.outcome === 'completed' && b.response === undefined)
      ctx.addIssue({ code: 'custom', path: ['response'], message: 'completed needs the response the upstream gave' });
    if (b.outcome === 'released' && b.response !== undefined) ctx.addIssue({ code: 'custom', path: ['response'], message: 'released takes no response' });
  });

/**
 * The audit endpoints under `/v1` (DESIGN §4.1; the guard in front of
 * them is the admin app's): fence history, the records waiting for an
 * operator, their resolution, and the operator-action log.
 */
export function registerAuditRoutes(app: Hono, options: AuditRouteOptions): void {
  const { store, problem } = options;
  const page = (c: Context): { limit: number; cursor?: string } | string => {
    const limit = c.req.query('limit');
    const cursor = c.req.query('cursor');
    if (limit !== undefined && (!/^\d{1,4}$/.test(limit) || Number(limit) < 1 || Number(limit) > 1000)) return 'limit: expected an integer from 1 to 1000';
    if (cursor !== undefined && cursor !== '' && !/^[A-Za-z0-9_-]{1,2048}$/.test(cursor)) return 'cursor: not a cursor from next_cursor';
    return { limit: limit === undefined ? 100 : Number(limit), ...(cursor ? { cursor } : {}) };
  };
  const badCursor = (err: unknown) =>
    err instanceof RangeError || err instanceof SyntaxError ? problem({ code: 'invalid-request', detail: 'cursor: not a cursor from next_cursor' }) : null;

  app.get('/v1/entities/:entity/history', async (c) => {
    const p = page(c);
    if (typeof p === 'string') return problem({ code: 'invalid-request', detail: p });
    if (p.cursor !== undefined && !/^\d{1,19}$/.test(p.cursor)) return problem({ code: 'invalid-request', detail: 'cursor: not a cursor from next_cursor' });
    const h = await store.getFenceHistory(c.req.param('entity'), p);
    return c.json({ entity: c.req.param('entity'), items: h.items.map(historyJson), next_cursor: h.nextCursor });
  });

  // The records that need an operator: ?state=outcome_unknown (the default).
  app.get('/v1/idempotency', async (c) => {
    const state = (c.req.query('state') ?? 'outcome_unknown') as RecordState;
    if (!['outcome_unknown', 'in_progress', 'completed'].includes(state))
      return problem({ code: 'invalid-request', detail: 'state: expected outcome_unknown, in_progress or completed' });
    const p = page(c);
    if (typeof p === 'string') return problem({ code: 'invalid-request', detail: p });
    try {
      const r = await store.listRecords({ state, ...p });
      // A route with `reconcile`: whether the reconciler still asks, or left the record to an operator (DESIGN §3.12).
      const now = Date.now();
      const items = r.items.map((rec) => {
        const status = reconcileStatus(rec, options.routes, now);
        return status === undefined ? recordJson(rec) : { ...recordJson(rec), reconcile: status };
      });
      return c.json({ items, next_cursor: r.nextCursor });
    } catch (err) {
      const bad = badCursor(err);
      if (bad) return bad;
      throw err;
    }
  });

  app.post('/v1/idempotency/:key/resolve', async (c) => {
    const key = c.req.param('key');
    const read = await readBody(c.req.raw, MAX_RESOLVE_BYTES * 2);
    if (!read.ok) return problem({ code: 'payload-too-large', detail: `the resolution is over ${MAX_RESOLVE_BYTES * 2} bytes` });
    let json: unknown;
    try {
      json = JSON.parse(new TextDecoder().decode(read.body));
    } catch {
      return problem({
        code: 'invalid-request',
        detail: 'the body must be JSON: {"outcome": "completed" | "released", "response"?, "scope"?, "note"?, "created_at"?}',
      });
    }
    const parsed = ResolveBody.safeParse(json);
    if (!parsed.success) {
      return problem({ code: 'invalid-request', detail: parsed.error.issues.map((i) => `${i.path.join('.') || '(body)'}: ${i.message}`).join('; ') });
    }
    const b = parsed.data;

    // Which record: the named scope, or the one outcome_unknown record with this key.
    let scope = b.scope;
    if (scope === undefined) {
      const records = await store.getRecords(key);
      const unknown = records.filter((r) => r.state === 'outcome_unknown');
      if (records.length === 0) return problem({ code: 'not-found', detail: 'no record with this idempotency key' });
      if (unknown.length === 0)
        return problem({
          code: 'not-outcome-unknown',
          detail: `the record is ${records[0]!.state}, not outcome_unknown`,
          extras: { state: records[0]!.state },
        });
      if (unknown.length > 1)
        return problem({
          code: 'invalid-request',
          detail: 'several outcome_unknown records carry this key: name one with "scope"',
          extras: { scopes: unknown.map((r) => r.scope) },
        });
      scope = unknown[0]!.scope;
    }
    const route = options.routes.find((r) => r.name === scope!.split('\u0000')[0]);

    let resolution: Resolution;
    if (b.outcome === 'released') {
      resolution = { outcome: 'released' };
    } else {
      const resp = b.response!;
      const body =
        resp.body_base64 !== undefined ? Uint8Array.from(atob(resp.body_base64), (ch) => ch.charCodeAt(0)) : new TextEncoder().encode(resp.body ?? '');
      if (body.byteLength > MAX_RESOLVE_BYTES) return problem({ code: 'payload-too-large', detail: `response.body is over ${MAX_RESOLVE_BYTES} bytes` });
      const allowed = new Set((route?.replayHeaders ?? ['content-type']).map((h) => h.toLowerCase()));
      const headers: [string, string][] = [];
      for (const [name, value] of Object.entries(resp.headers)) {
        if (!allowed.has(name.toLowerCase()))
          return problem({ code: 'invalid-request', detail: `response.headers.${name}: not in this route's replayHeaders` });
        if (/[\r\n\0]/.test(value)) return problem({ code: 'invalid-request', detail: `response.headers.${name}: invalid header value` });
        headers.push([name.toLowerCase(), value]);
      }
      resolution = { outcome: 'completed', response: { status: resp.status, headers, body }, retentionMs: route?.retention ?? DEFAULT_RETENTION_MS };
    }

    const result = await store.resolveRecord({
      scope,
      key,
      resolution,
      operator: c.get('caller')?.id ?? null,
      note: b.note ?? null,
      requestId: newRequestId(),
      ...(b.created_at !== undefined ? { createdAt: new Date(b.created_at) } : {}),
    });
    if (!result.ok) {
      if (result.reason === 'not-found') return problem({ code: 'not-found', detail: 'no record with this idempotency key in this scope' });
      if (result.reason === 'changed') {
        const createdAt = result.createdAt.toISOString();
        return problem({
          code: 'not-outcome-unknown',
          detail: `the outcome_unknown record with this key is another attempt (created_at ${createdAt}), not the one given`,
          extras: { state: 'outcome_unknown', created_at: createdAt },
        });
      }
      // An operator's release names no notBefore, so never `too-early` here; answered all the same.
      if (result.reason === 'too-early')
        return problem({ code: 'not-outcome-unknown', detail: 'the attempt may still be in flight', extras: { state: 'outcome_unknown' } });
      return problem({ code: 'not-outcome-unknown', detail: `the record is ${result.state}, not outcome_unknown`, extras: { state: result.state } });
    }
    return c.json({ action: actionJson(result.action) });
  });

  registerBulkResolve(app, { store, problem });

  app.get('/v1/operator-actions', async (c) => {
    const p = page(c);
    if (typeof p === 'string') return problem({ code: 'invalid-request', detail: p });
    if (p.cursor !== undefined && !/^\d{1,19}$/.test(p.cursor)) return problem({ code: 'invalid-request', detail: 'cursor: not a cursor from next_cursor' });
    const r = await store.listOperatorActions(p);
    return c.json({ items: r.items.map(actionJson), next_cursor: r.nextCursor });
  });
}

/** An entity's latest fences for `GET /v1/entities/:entity`. */
export async function latestHistory(
  store: GatewayStore,
  entity: string,
  limit = 20,
): Promise<{ history: ReturnType<typeof historyJson>[]; history_next_cursor: string | null }> {
  const h = await store.getFenceHistory(entity, { limit });
  return { history: h.items.map(historyJson), history_next_cursor: h.nextCursor };
}

export function historyJson(h: FenceHistoryRow) {
  return { fence: h.fence, at: h.at.toISOString(), caller: h.caller, request_id: h.requestId };
}

export function recordJson(r: RecordInfo) {
  return {
    key: r.key,
    scope: r.scope,
    state: r.state,
    fingerprint: r.fingerprint,
    entity: r.entity,
    fence: r.fence,
    status: r.status,
    locked_until: r.lockedUntil?.toISOString() ?? null,
    created_at: r.createdAt.toISOString(),
    expires_at: r.expiresAt.toISOString(),
    // The attempt last sent: its lock end (what a reconciler's "not found" is weighed against) and request id (DESIGN §3.12).
    attempt_until: r.attemptUntil?.toISOString() ?? null,
    request_id: r.requestId,
    // An outcome_unknown record carrying an interim answer (DESIGN §3.7); never the body here.
    interim: r.interim,
    // The reconciler's last answer that settled nothing, by the database clock (DESIGN §3.12).
    last_reconcile: r.lastReconcile === undefined ? null : { result: r.lastReconcile.result, at: r.lastReconcile.at.toISOString() },
  };
}

export function actionJson(a: OperatorAction) {
  return {
    id: a.id,
    at: a.at.toISOString(),
    action: a.action,
    scope: a.scope,
    key: a.key,
    entity: a.entity,
    fence: a.fence,
    fingerprint: a.fingerprint,
    status: a.status,
    operator: a.operator,
    note: a.note,
    request_id: a.requestId,
  };
}
