import { parseDuration } from '../../core/duration.js';

/** An audit filter's time: ISO 8601, or a duration back from `now` (`2h`); null when it is neither. */
export function parseTime(v: string, now: number): Date | null {
  const ago = parseDuration(v);
  if (ago !== null) return new Date(now - ago);
  if (!/^\d{4}-\d{2}-\d{2}/.test(v)) return null;
  const d = new Date(v);
  return Number.isNaN(d.getTime()) ? null : d;
}

/** What every audit log's listing takes besides its own text filters (DESIGN §4.1 rejections, commands). */
export interface LogQueryBase {
  since?: Date;
  until?: Date;
  /** 1…1000. */
  limit: number;
  /** Opaque keyset cursor from a previous page (`nextCursor`). */
  cursor?: string;
}

/**
 * A log listing's query string: the text filters `fields` (empty is absent);
 * `since` / `until` as ISO 8601 or a duration back from now (`2h`); `limit`
 * 1–1000 (default 100); `cursor`. The query, or a message naming the bad
 * parameter. One reading for the rejection log and the command log.
 */
export function parseLogQuery<F extends string>(
  params: URLSearchParams,
  fields: readonly F[],
  now = Date.now(),
): (LogQueryBase & Partial<Record<F, string>>) | string {
  const q: LogQueryBase & Partial<Record<F, string>> = { limit: 100 } as LogQueryBase & Partial<Record<F, string>>;
  for (const name of fields) {
    const v = params.get(name);
    if (v !== null && v !== '') (q as Partial<Record<F, string>>)[name] = v;
  }
  for (const name of ['since', 'until'] as const) {
    const v = params.get(name);
    if (v === null || v === '') continue;
    const d = parseTime(v, now);
    if (d === null) return `${name}: expected an ISO 8601 time or a duration such as "2h"`;
    q[name] = d;
  }
  const limit = params.get('limit');
  if (limit !== null) {
    if (!/^\d{1,4}$/.test(limit) || Number(limit) < 1 || Number(limit) > 1000) return 'limit: expected an integer from 1 to 1000';
    q.limit = Number(limit);
  }
  const cursor = params.get('cursor');
  if (cursor !== null && cursor !== '') {
    if (!/^\d{1,19}$/.test(cursor)) return 'cursor: not a cursor from next_cursor';
    q.cursor = cursor;
  }
  return q;
}
