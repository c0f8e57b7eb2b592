import type { GatewayStore, RejectionQuery, RejectionRow } from '../../store/types.js';
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
  const pages = rejectionPages(store, query, max);
  let header = format === 'csv';
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        let text = header ? CSV_HEADER : '';
        header = false;
        const next = await pages.next();
        if (!next.done) for (const row of next.value) text += format === 'csv' ? csvLine(rejectionJson(row)) : ndjsonLine(rejectionJson(row));
        if (text !== '') controller.enqueue(encoder.encode(text));
        if (next.done) controller.close();
      },
      async cancel() {
        await pages.return(undefined);
      },
    },
    // Nothing is fetched ahead of the consumer: one page in memory at a time.
    { highWaterMark: 0 },
  );
}

/**
 * The matching rows, page by page (keyset on id, newest first), stopping
 * after `max` rows. Each page is one store query; nothing is held between
 * pages but the cursor.
 */
export async function* rejectionPages(
  store: GatewayStore,
  query: Omit<RejectionQuery, 'limit'>,
  max = Infinity,
): AsyncGenerator<RejectionRow[], void, undefined> {
  let cursor = query.cursor;
  let sent = 0;
  while (sent < max) {
    const page = await store.listRejections({ ...query, limit: Math.min(PAGE, max - sent), ...(cursor === undefined ? {} : { cursor }) });
    if (page.items.length > 0) yield page.items;
    sent += page.items.length;
    if (page.nextCursor === null) return;
    cursor = page.nextCursor;
  }
}

/** `?format=` wins over `Accept`; JSON pages otherwise. */
export function exportFormatOf(accept: string | undefined, format: string | null): ExportFormat | 'json' | null {
  if (format !== null && format !== '') return format === 'ndjson' || format === 'csv' || format === 'json' ? format : null;
  const a = (accept ?? '').toLowerCase();
  if (a.includes('application/x-ndjson')) return 'ndjson';
  if (a.includes('text/csv')) return 'csv';
  return 'json';
}
