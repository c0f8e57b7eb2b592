import { LEASE_LOST, toJson } from '../store-common.js';
import type { CompleteResult, LeaseRef } from '../types.js';
import { firstStatement, MAX_GROUP, RunAlone, StatementGroup } from './group.js';
import { owned, type Prepared } from './prepared.js';
import * as q from './queries.js';

type Item = { lease: LeaseRef; json: string };

/**
 * Completes concurrent complete() calls: one COMPLETE when alone, else
 * COMPLETE_MANY; each lease is ok only if its own row matched the full
 * ownership condition. A lease given twice in one group (never by the
 * runner) makes the group go one statement at a time (`RunAlone`), so the
 * second sees the first.
 */
async function completeFor(prepared: Prepared, items: Item[]): Promise<CompleteResult[]> {
  const one = async ({ lease, json }: Item): Promise<CompleteResult> => {
    const { rows } = await prepared(q.COMPLETE, [...owned(lease), json]);
    return rows.length === 1 ? { ok: true } : LEASE_LOST;
  };
  if (items.length === 1) return [await one(items[0]!)];
  if (new Set(items.map((i) => i.lease.id)).size < items.length) throw new RunAlone();
  const { rows } = await firstStatement(() =>
    prepared<{ id: string }>(q.COMPLETE_MANY, [
      items.map((i) => i.lease.id),
      items.map((i) => i.lease.ownerId),
      items.map((i) => i.lease.fencingToken),
      items.map((i) => i.json),
    ]),
  );
  const done = new Set(rows.map((r) => Number(r.id)));
  return items.map((i) => (done.has(Number(i.lease.id)) ? { ok: true } : LEASE_LOST));
}

/** The store's complete(): calls that arrive while one is in flight share a statement (./group.ts). */
export function completer(prepared: Prepared): (lease: LeaseRef, result: unknown) => Promise<CompleteResult> {
  const group = new StatementGroup((items: Item[]) => completeFor(prepared, items), MAX_GROUP);
  return async (lease, result) => group.submit({ lease, json: toJson(result) });
}
