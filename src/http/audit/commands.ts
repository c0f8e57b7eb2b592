import type { Hono } from 'hono';
import type { Refusal } from '../../protocol/problem.js';
import type { CommandQuery, CommandRow, GatewayStore } from '../../store/types.js';
import { parseLogQuery } from './time.js';
import { EXPORT_MEDIA_TYPES, exportFormatOf, type ExportFormat } from './export.js';
import { csvCell, ndjsonLine, pad } from './format.js';

/**
 * The command log's audit API (DESIGN §4.1 `commands`): `GET
 * <adminPrefix>/v1/commands`, JSON pages or an NDJSON / CSV export, behind
 * the same guard (audit scope) as the rejection log; its rows as JSON, CSV
 * and the CLI's table (src/entry/cli-audit.ts `fencegate audit commands`).
 */

/** A command-log row as the audit API shows it (JSON, NDJSON, CSV columns in this order). */
export function commandJson(r: CommandRow) {
  return {
    id: r.id,
    at: r.at.toISOString(),
    route: r.route,
    method: r.method,
    path: r.path,
    entity: r.entity,
    fence: r.fence,
    idempotency_key: r.idempotencyKey,
    scope: r.scope,
    caller: r.caller,
    tool: r.tool,
    outcome: r.outcome,
    decision: r.decision,
    status: r.status,
    upstream_ms: r.upstreamMs,
    request_id: r.requestId,
    client_request_id: r.clientRequestId,
    payload_sha256: r.payloadSha256,
  };
}

export type CommandJson = ReturnType<typeof commandJson>;

export const COMMAND_CSV_COLUMNS = Object.keys(commandJson({ at: new Date(0) } as CommandRow)) as (keyof CommandJson)[];
export const COMMAND_CSV_HEADER = COMMAND_CSV_COLUMNS.join(',') + '\r\n';

const cell = (v: string | number | null | undefined): string | null => (v === null || v === undefined ? null : String(v));

/** One RFC 4180 line, control characters made visible and formula starters quoted (./format.ts csvCell). */
export function commandCsvLine(row: CommandJson): string {
  return COMMAND_CSV_COLUMNS.map((c) => csvCell(cell(row[c]))).join(',') + '\r\n';
}

export const commandNdjsonLine = (row: CommandJson): string => ndjsonLine(row);

const TABLE: [keyof CommandJson, number][] = [
  ['id', 8],
  ['at', 24],
  ['route', 14],
  ['entity', 24],
  ['fence', 19],
  ['idempotency_key', 24],
  ['caller', 16],
  ['outcome', 23],
  ['status', 6],
  ['upstream_ms', 11],
  ['method', 7],
  ['path', 40],
];

/** A fixed-width text table, one line per row. Long cells end in `…`; control characters become `?`. */
export function commandTableHeader(): string {
  return (
    TABLE.map(([c, w]) => pad(c, w))
      .join(' ')
      .trimEnd() + '\n'
  );
}

export function commandTableLine(row: CommandJson): string {
  return (
    TABLE.map(([c, w]) => pad(cell(row[c]) ?? '-', w))
      .join(' ')
      .trimEnd() + '\n'
  );
}

/**
 * `entity`, `key` (the idempotency key), `route`, `caller`; `since` /
 * `until` as ISO 8601 or a duration back from now (`2h`); `limit` 1–1000
 * (default 100); `cursor`. Returns the query, or a message naming the bad parameter.
 */
export function parseCommandQuery(params: URLSearchParams, now = Date.now()): CommandQuery | string {
  return parseLogQuery(params, ['entity', 'key', 'route', 'caller'], now);
}

/** Rows per store round trip of an export. */
const PAGE = 1000;

/** The matching rows, page by page (keyset on id, newest first), stopping after `max` rows. */
export async function* commandPages(store: GatewayStore, query: Omit<CommandQuery, 'limit'>, max = Infinity): AsyncGenerator<CommandRow[], void, undefined> {
  let cursor = query.cursor;
  let sent = 0;
  while (sent < max) {
    const page = await store.listCommands({ ...query, limit: Math.min(PAGE, max - sent), ...(cursor === undefined ? {} : { cursor }) });
    if (page.items.length > 0) yield page.items;
    sent += page.items.length;
    if (page.nextCursor === null) return;
    cursor = page.nextCursor;
  }
}

/** An export of any size as a byte stream, one page in memory at a time (as ./export.ts rejectionExport). */
export function commandExport(store: GatewayStore, query: Omit<CommandQuery, 'limit'>, format: ExportFormat, max = Infinity): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  const pages = commandPages(store, query, max);
  let header = format === 'csv';
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        let text = header ? COMMAND_CSV_HEADER : '';
        header = false;
        const next = await pages.next();
        if (!next.done) for (const row of next.value) text += format === 'csv' ? commandCsvLine(commandJson(row)) : commandNdjsonLine(commandJson(row));
        if (text !== '') controller.enqueue(encoder.encode(text));
        if (next.done) controller.close();
      },
      async cancel() {
        await pages.return(undefined);
      },
    },
    { highWaterMark: 0 },
  );
}

export function registerCommandRoutes(app: Hono, options: { store: GatewayStore; problem: (refusal: Refusal) => Response }): void {
  const { store, problem } = options;
  app.get('/v1/commands', async (c) => {
    const params = new URL(c.req.url).searchParams;
    const parsed = parseCommandQuery(params);
    if (typeof parsed === 'string') return problem({ code: 'invalid-request', detail: parsed });
    const format = exportFormatOf(c.req.header('accept'), params.get('format'));
    if (format === null) return problem({ code: 'invalid-request', detail: 'format: expected json, ndjson or csv' });
    if (format !== 'json') {
      const { limit, ...filters } = parsed;
      const stream = commandExport(store, filters, format, params.has('limit') ? limit : Infinity);
      return new Response(stream, { headers: { 'content-type': EXPORT_MEDIA_TYPES[format], 'cache-control': 'no-store' } });
    }
    const page = await store.listCommands(parsed);
    return c.json({ items: page.items.map(commandJson), next_cursor: page.nextCursor });
  });
}
