import type { Hono } from 'hono';
import { z } from 'zod';
import type { Refusal } from '../../protocol/problem.js';
import type { GatewayStore, RecordInfo } from '../../store/types.js';
import { readBody } from '../body.js';
import { newRequestId } from '../request-id.js';

/** Most records one call settles; the answer's `more` says whether others are left. */
export const BULK_RESOLVE_MAX = 10_000;
/** How many of the settled keys the answer lists. */
const KEYS_SHOWN = 100;
const PAGE = 1000;

const Iso = z.iso.datetime({ offset: true, error: 'must be an ISO 8601 time, e.g. 2026-05-01T10:00:00Z' });

const BulkBody = z
  .strictObject({
    route: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/, 'must be a route name'),
    from: Iso,
    to: Iso,
    /** Only `released`: a bulk `completed` would need each record's own confirmed answer. */
    outcome: z.literal('released', { error: 'only "released" is settled in bulk; resolve completed records one at a time' }),
    note: z.string().max(2000).optional(),
    dry_run: z.boolean().default(false),
  })
  .refine((b) => Date.parse(b.from) < Date.parse(b.to), { path: ['to'], message: 'must be after "from"' });

export interface BulkResolveOptions {
  store: GatewayStore;
  problem: (refusal: Refusal) => Response;
}

/**
 * `POST /v1/idempotency/resolve-unknown` (docs/http-api.md "Admin API"): every
 * outcome_unknown record of one route created in [from, to) settled as
 * released. For the operator after an upstream outage on Workers, where every
 * request of the outage is left outcome_unknown (docs/deploy-workers.md).
 *
 * Built only from the store's audit methods: the candidates come from
 * `listRecords` (newest first, so the walk stops at the first record older
 * than `from`), and each is settled by `resolveRecord`, the same conditional
 * write as the one-key resolve, naming the listed attempt by its createdAt: a
 * record that left outcome_unknown meanwhile (a retry, another operator), or
 * that a new attempt replaced after a release, is counted as skipped, never
 * overwritten. Each
 * resolution writes its own operator-action row; the shared bulk id in its
 * note ties them together.
 */
export function registerBulkResolve(app: Hono, options: BulkResolveOptions): void {
  const { store, problem } = options;

  app.post('/v1/idempotency/resolve-unknown', async (c) => {
    const read = await readBody(c.req.raw, 16 * 1024);
    if (!read.ok) return problem({ code: 'payload-too-large', detail: 'the request is over 16384 bytes' });
    let json: unknown;
    try {
      json = JSON.parse(new TextDecoder().decode(read.body));
    } catch {
      return problem({ code: 'invalid-request', detail: 'the body must be JSON: {"route", "from", "to", "outcome": "released", "note"?, "dry_run"?}' });
    }
    const parsed = BulkBody.safeParse(json);
    if (!parsed.success)
      return problem({ code: 'invalid-request', detail: parsed.error.issues.map((i) => `${i.path.join('.') || '(body)'}: ${i.message}`).join('; ') });
    const b = parsed.data;
    const from = new Date(b.from);
    const to = new Date(b.to);

    const { records, more } = await candidates(store, b.route, from, to);
    const bulkId = crypto.randomUUID(); // Web Crypto: the same on Node and Workers
    if (b.dry_run) {
      return c.json({
        bulk_id: null,
        dry_run: true,
        matched: records.length,
        resolved: 0,
        skipped: 0,
        more,
        keys: records.slice(0, KEYS_SHOWN).map((r) => r.key),
      });
    }
    const note = `bulk ${bulkId}${b.note ? `: ${b.note}` : ''}`;
    const operator = c.get('caller')?.id ?? null;
    const keys: string[] = [];
    let resolved = 0;
    let skipped = 0;
    for (const r of records) {
      // `createdAt`: the attempt listed, in the window; a later one with the key is not this call's to release.
      const result = await store.resolveRecord({
        scope: r.scope,
        key: r.key,
        createdAt: r.createdAt,
        resolution: { outcome: 'released' },
        operator,
        note,
        requestId: newRequestId(),
      });
      if (result.ok) {
        resolved++;
        if (keys.length < KEYS_SHOWN) keys.push(r.key);
      } else skipped++;
    }
    return c.json({ bulk_id: bulkId, dry_run: false, matched: records.length, resolved, skipped, more, keys });
  });
}

/** The route's outcome_unknown records created in [from, to), at most BULK_RESOLVE_MAX, and whether more match. */
async function candidates(store: GatewayStore, route: string, from: Date, to: Date): Promise<{ records: RecordInfo[]; more: boolean }> {
  const records: RecordInfo[] = [];
  let cursor: string | undefined;
  for (;;) {
    const page = await store.listRecords({ state: 'outcome_unknown', limit: PAGE, ...(cursor ? { cursor } : {}) });
    for (const r of page.items) {
      // Newest first: past `from`, nothing older can be in the window.
      if (r.createdAt < from) return { records, more: false };
      if (r.createdAt >= to || r.scope.split('\u0000')[0] !== route) continue;
      if (records.length === BULK_RESOLVE_MAX) return { records, more: true };
      records.push(r);
    }
    if (page.nextCursor === null) return { records, more: false };
    cursor = page.nextCursor;
  }
}
