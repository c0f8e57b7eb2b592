import type { RejectionRow } from '../../store/types.js';

/** A rejection as the audit API shows it (JSON, NDJSON, CSV columns in this order). */
export function rejectionJson(r: RejectionRow) {
  return {
    id: r.id,
    at: r.at.toISOString(),
    reason: r.reason,
    entity: r.entity,
    presented_fence: r.presentedFence,
    current_fence: r.currentFence,
    idempotency_key: r.idempotencyKey,
    caller: r.caller,
    method: r.method,
    path: r.path,
    payload_sha256: r.payloadSha256,
    request_id: r.requestId,
    /** The caller's X-Request-Id; `request_id` is always the gateway's own. */
    client_request_id: r.clientRequestId ?? null,
    /** The MCP tool of a refused tools/call; null for a plain route. */
    tool: r.tool ?? null,
    detail: r.detail ?? null,
  };
}

export type RejectionJson = ReturnType<typeof rejectionJson>;

export const CSV_COLUMNS = [
  'id',
  'at',
  'reason',
  'entity',
  'presented_fence',
  'current_fence',
  'idempotency_key',
  'caller',
  'method',
  'path',
  'payload_sha256',
  'request_id',
  'client_request_id',
  'tool',
  'detail',
] as const satisfies readonly (keyof RejectionJson)[];

export const CSV_HEADER = CSV_COLUMNS.join(',') + '\r\n';

/**
 * Characters that drive a terminal or reorder what it shows, never text an
 * auditor needs to see as such: C0 (ESC starts ANSI sequences; CR and BS
 * overwrite what was printed), DEL, C1 (U+009B is a one-character CSI, so
 * `\u009b2J` clears the screen of a terminal that honours C1), the bidi
 * controls that make a terminal or spreadsheet show text in another order
 * than it is stored, and the Unicode line and paragraph separators.
 * Entities, keys, paths and callers all come from the requests being refused.
 */
const CONTROL = /[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

const escapeControl = (ch: string) => `\\u${ch.charCodeAt(0).toString(16).padStart(4, '0')}`;

/**
 * `s` with every control character of `CONTROL` written as a visible
 * `\uXXXX`, for text shown on a terminal or in a spreadsheet. A display form:
 * a literal backslash is left as it is, so the exact value is the JSON one.
 */
export function visibleText(s: string): string {
  return s.replace(CONTROL, escapeControl);
}

/**
 * One RFC 4180 line (CRLF). Entities, keys and paths come from callers, so
 * control characters are made visible first (the export is opened in
 * spreadsheets and printed to terminals, `curl … | less` or
 * `fencegate audit --format csv`), then a cell that a spreadsheet would run
 * as a formula (`=`, `+`, `-`, `@` first) is prefixed with `'` (OWASP CSV
 * injection advice).
 */
export function csvLine(row: RejectionJson): string {
  return CSV_COLUMNS.map((c) => csvCell(row[c])).join(',') + '\r\n';
}

export function csvCell(v: string | null | undefined): string {
  if (v === null || v === undefined) return '';
  let s = visibleText(v);
  // Tab and CR, formula starters too, are already `\u0009` / `\u000d` here.
  if (/^[=+\-@]/.test(s)) s = `'${s}`;
  return /[",\r\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

/**
 * One JSON object per line. JSON.stringify escapes C0 but writes DEL, C1 and
 * the bidi controls as they are; they are escaped here too (`\u009b`), which
 * is the same JSON value, so the line stays exact and cannot drive a
 * terminal it is printed to.
 */
export function ndjsonLine(row: object): string {
  return JSON.stringify(row).replace(CONTROL, escapeControl) + '\n';
}

const TABLE: [keyof RejectionJson, number][] = [
  ['id', 8],
  ['at', 24],
  ['reason', 23],
  ['entity', 24],
  ['presented_fence', 19],
  ['current_fence', 19],
  ['idempotency_key', 24],
  ['caller', 16],
  ['method', 7],
  ['path', 28],
  // Last: refusals before admission (401, 403, a bad signature) have no
  // entity, fence or key; the detail is what tells them apart.
  ['detail', 60],
];

/** A fixed-width text table, one line per row, so it streams too. Long cells end in `…`. */
export function tableHeader(): string {
  return (
    TABLE.map(([c, w]) => pad(c, w))
      .join(' ')
      .trimEnd() + '\n'
  );
}

export function tableLine(row: RejectionJson): string {
  return (
    TABLE.map(([c, w]) => pad(row[c] ?? '-', w))
      .join(' ')
      .trimEnd() + '\n'
  );
}

/** Control characters become `?` in the table: it is for eyes, the exact values are in JSON. */
export function pad(s: string, w: number): string {
  const clean = s.replace(CONTROL, '?');
  return clean.length > w ? clean.slice(0, w - 1) + '…' : clean.padEnd(w);
}
