import type { Admission, AdmitInput } from '../types.js';
import type { PgContext } from './query.js';
import { logText } from './rejections.js';
import { decodeText, encodeNullable, encodeText } from './text.js';

interface AdmitRow {
  outcome: Admission['outcome'];
  current_fence: string | null;
  retry_after_ms: string | null;
  takeover: boolean | null;
  status: number | null;
  headers: [string, string][] | null;
  body: Buffer | null;
}

/**
 * The admission (DESIGN §3.5): ONE statement calling fencegate_admit
 * (./sql/admit.sql), so the decision, its record and any refusal's rejection
 * row are one transaction and one round trip, and a dropped connection rolls
 * it back whole.
 */
export function createAdmit(ctx: PgContext): (input: AdmitInput) => Promise<Admission> {
  // $1 scope $2 key $3 entity $4 fence $5 fingerprint $6 serial $7 owner $8 lock_ms
  // $9 retention_ms $10 retry_unknown $11 caller $12 method $13 path $14 payload_sha256 $15 request_id
  // $16 client_request_id $17 log_entity $18 log_key $19 tool ($11–$19: the bounded rejection text)
  const text = `SELECT * FROM ${ctx.table('fencegate_admit')}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)`;

  return async (input) => {
    const a = logText({ entity: input.entity, idempotencyKey: input.key, audit: input.audit });
    const { rows } = await ctx.query<AdmitRow>(text, [
      encodeText(input.scope),
      encodeNullable(input.key),
      encodeNullable(input.entity),
      input.fence === null ? null : input.fence.toString(),
      encodeText(input.fingerprint),
      input.mode === 'serial',
      encodeText(input.ownerToken),
      Math.ceil(input.lockMs),
      Math.ceil(input.retentionMs),
      input.onUnknown === 'retry',
      a.caller,
      a.method,
      a.path,
      a.payloadSha256,
      a.requestId,
      a.clientRequestId,
      a.entity,
      a.idempotencyKey,
      a.tool,
    ]);
    return toAdmission(rows[0]!);
  };
}

function toAdmission(row: AdmitRow): Admission {
  switch (row.outcome) {
    case 'forward':
      return { outcome: 'forward', takeover: row.takeover === true };
    case 'stale-fence':
      return { outcome: 'stale-fence', currentFence: BigInt(row.current_fence!) };
    case 'replay':
      return {
        outcome: 'replay',
        response: {
          status: row.status ?? 200,
          headers: (row.headers ?? []).map(([n, v]) => [decodeText(n), decodeText(v)] as [string, string]),
          body: bytes(row.body),
        },
      };
    case 'idempotency-key-reused':
    case 'outcome-unknown':
      return { outcome: row.outcome };
    case 'idempotency-in-progress':
    case 'entity-busy':
      return { outcome: row.outcome, retryAfterMs: Number(row.retry_after_ms ?? 0) };
    default:
      throw new Error(`fencegate_admit returned an unknown outcome: ${String(row.outcome)}`);
  }
}

/** An exact-size copy: a Buffer from pg may be a view into a larger, shared ArrayBuffer. */
function bytes(b: Buffer | null): Uint8Array {
  if (b === null) return new Uint8Array(0);
  return new Uint8Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
}
