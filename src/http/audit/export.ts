import type { GatewayStore, RejectionQuery } from '../../store/types.js';
import { CSV_HEADER, csvLine, ndjsonLine, rejectionJson } from './format.js';

export type ExportFormat = 'ndjson' | 'csv';

export const EXPORT_MEDIA_TYPES: Record<ExportFormat, string> = {
  ndjson: 'application/x-ndjson',
  csv: 'text/csv; charset=utf-8',
};

/** Rows per store round trip: big enough to amortise the query, small enough to keep memory flat. */
const PAGE = 1000;

/**
 * A rejection-log export of any size as a byte stream: keyset pages are
 * pulled from the store one at a time, only when the consumer is ready for
 * more (the HTTP response's backpressure), so memory holds about one page
 * whatever the size of the log. Newest first, like the JSON pages; rows
 * logged after the export started are not included (ids only go down).
 *
 * @param max  stop after this many rows (default: all that match)
 */
export function rejectionExport(store: GatewayStore, query: Omit<RejectionQuery, 'limit'>, format: ExportFormat, max = Infinity): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  let cursor = query.cursor;
  let sent = 0;
  let started = false;
  let cancelled = false;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        let text = '';
        if (!started && format === 'csv') text += CSV_HEADER;
        started = true;
        const limit = Math.min(PAGE, max - sent);
        if (limit > 0 && !cancelled) {
          const page = await store.listRejections({ ...query, limit, ...(cursor === undefined ? {} : { cursor }) });
          for (const row of page.items) text += format === 'csv' ? csvLine(rejectionJson(row)) : ndjsonLine(rejectionJson(row));
          sent += page.items.length;
          cursor = page.nextCursor ?? undefined;
          if (text !== '') controller.enqueue(encoder.encode(text));
          if (page.nextCursor === null || sent >= max) controller.close();
        } else {
          if (text !== '') controller.enqueue(encoder.encode(text));
          controller.close();
        }
      },
      cancel() {
        cancelled = true;
      },
    },
    { highWaterMark: 0 },
  );
}

/** `?format=` wins over `Accept`; JSON pages otherwise. */
export function exportFormatOf(accept: string | undefined, format: string | null): ExportFormat | 'json' | null {
  if (format !== null && format !== '') return format === 'ndjson' || format === 'csv' || format === 'json' ? format : null;
  const a = (accept ?? '').toLowerCase();
  if (a.includes('application/x-ndjson')) return 'ndjson';
  if (a.includes('text/csv')) return 'csv';
  return 'json';
}
