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
  'detail',
] as const satisfies readonly (keyof RejectionJson)[];

export const CSV_HEADER = CSV_COLUMNS.join(',') + '\r\n';

/**
 * One RFC 4180 line (CRLF). Entities, keys and paths come from callers, so a
 * cell that a spreadsheet would run as a formula (`=`, `+`, `-`, `@`, tab,
 * CR first) is prefixed with `'` (OWASP CSV injection advice).
 */
export function csvLine(row: RejectionJson): string {
  return CSV_COLUMNS.map((c) => csvCell(row[c])).join(',') + '\r\n';
}

function csvCell(v: string | null): string {
  if (v === null) return '';
  let s = v;
  if (/^[=+\-@\t\r]/.test(s)) s = `'${s}`;
  return /[",\r\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

export function ndjsonLine(row: RejectionJson): string {
  return JSON.stringify(row) + '\n';
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
  ['path', 28],
];

/** A fixed-width text table, one line per row, so it streams too. Long cells end in `…`. */
export function tableHeader(): string {
  return TABLE.map(([c, w]) => pad(c, w)).join(' ').trimEnd() + '\n';
}

export function tableLine(row: RejectionJson): string {
  return TABLE.map(([c, w]) => pad(row[c] ?? '-', w)).join(' ').trimEnd() + '\n';
}

function pad(s: string, w: number): string {
  const clean = s.replace(/[\x00-\x1f\x7f]/g, '?');
  return clean.length > w ? clean.slice(0, w - 1) + '…' : clean.padEnd(w);
}
