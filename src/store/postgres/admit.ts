import type { Admission, AdmitInput, StoredResponse } from '../types.js';
import { RoundTripGroup, type Settled } from './finish-group.js';
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

interface ManyRow extends AdmitRow {
  alone: boolean;
  err_code: string | null;
  err_message: string | null;
}

/**
 * How long a grouped element may wait for a row lock (another session's
 * admission or finish holds its entity or record) before it is left to run
 * alone, and how long a group may run before its remaining elements are: see
 * ./sql/group_admit.sql. Far below deadlock_timeout (1 s by default).
 */
const LOCK_TIMEOUT_MS = 5;
const BUDGET_MS = 25;

export interface AdmitGroupOptions {
  maxGroup?: number;
  /** 0: a grouped element waits for row locks as a lone call does (tests: the clock control). */
  lockTimeoutMs?: number;
  /** null: no group-wide budget (tests). */
  budgetMs?: number | null;
}

/**
 * The admission (DESIGN §3.5): fencegate_admit (./sql/admit.sql) makes the
 * decision, its record and any refusal's rejection row one transaction, and
 * a dropped connection rolls it back whole.
 *
 * Grouped (./finish-group.ts, DESIGN §8.2) as the finish is: the admissions
 * that arrive while one is on its way go together as ONE statement,
 * fencegate_admit_many (./sql/group_admit.sql), each element in its own
 * subtransaction (its rejection row in it too), so a faulty element fails
 * only its caller; every caller is answered after the group's COMMIT. A lone
 * admission is the plain fencegate_admit statement, whose signature stays
 * the previous release's. Elements of one entity or key are decided in
 * arrival order in the group's transaction, as sequential calls would be.
 *
 * An element decided in a group has its lock already partly spent when the
 * group commits, by the time the elements after it took: the group function
 * bounds that (a short lock_timeout, a time budget) and leaves an element
 * that would wait for another session's row lock, or come after the budget,
 * undecided (`alone`). Those run here again through the plain statement,
 * after the group returned, in arrival order per entity and per key.
 * Neither that nor the one-by-one re-run of a group the driver could not
 * send is a retry of something that may have committed (./gateway-store.ts
 * never retries an admission): the group's answer says the element's
 * subtransaction rolled back, or nothing was sent.
 */
export function createAdmit(
  ctx: PgContext,
  options: AdmitGroupOptions = {},
): ((input: AdmitInput) => Promise<Admission>) & { group: RoundTripGroup<AdmitInput, Admission> } {
  // $1 scope $2 key $3 entity $4 fence $5 fingerprint $6 serial $7 owner $8 lock_ms
  // $9 retention_ms $10 retry_unknown $11 caller $12 method $13 path $14 payload_sha256 $15 request_id
  // $16 client_request_id $17 log_entity $18 log_key $19 tool ($11–$19: the bounded rejection text)
  const one = `SELECT * FROM ${ctx.table('fencegate_admit')}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)`;
  // The same nineteen, each an array with one element per admission; $20 lock_timeout_ms, $21 budget_ms.
  const many =
    `SELECT * FROM ${ctx.table('fencegate_admit_many')}(` +
    `$1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::boolean[], $7::text[], $8::bigint[], $9::bigint[], $10::boolean[], ` +
    `$11::text[], $12::text[], $13::text[], $14::text[], $15::text[], $16::text[], $17::text[], $18::text[], $19::text[], ` +
    `$20::integer, $21::integer) ORDER BY ord`;
  const lockTimeoutMs = options.lockTimeoutMs ?? LOCK_TIMEOUT_MS;
  const budgetMs = options.budgetMs === undefined ? BUDGET_MS : options.budgetMs;

  const group = new RoundTripGroup<AdmitInput, Admission>(
    {
      async one(input) {
        const { rows } = await ctx.query<AdmitRow>(one, admitParams(input));
        return toAdmission(rows[0]!);
      },
      async many(inputs) {
        const params = inputs.map(admitParams);
        const columns = [...params[0]!.map((_, c) => params.map((p) => p[c])), lockTimeoutMs, budgetMs];
        const { rows } = await ctx.query<ManyRow>(many, columns);
        return rows.map((r): Settled<Admission> => {
          if (r.alone) return { alone: true };
          // The element's subtransaction rolled back: an ERROR, as a lone statement's would be (./release.ts reads it so).
          if (r.err_code !== null)
            return { ok: false, error: Object.assign(new Error(r.err_message ?? 'fencegate_admit failed'), { code: r.err_code, severity: 'ERROR' }) };
          try {
            return { ok: true, value: toAdmission(r) };
          } catch (error) {
            return { ok: false, error: error as Error };
          }
        });
      },
    },
    // No `unsent`: an admission group's parameters are small and bounded
    // (keys, entities and audit text are capped), so the driver cannot fail
    // to build them; and pg raises a fault in parsing a returned row only at
    // ReadyForQuery, after the COMMIT, where running committed admissions
    // again would find their own records. A group that failed as a whole is
    // every caller's fault (503), as a lost connection is.
    { maxGroup: options.maxGroup, chain: names },
  );

  return Object.assign((input: AdmitInput) => group.run(input), { group });
}

/** The names an `alone` admission is ordered by: its entity and its key. */
function names(input: AdmitInput): string[] {
  const n: string[] = [];
  if (input.entity !== null) n.push(`e\u0000${input.entity}`);
  if (input.key !== null) n.push(`k\u0000${input.scope.length}\u0000${input.scope}${input.key}`);
  return n;
}

/** fencegate_admit's nineteen parameters for one admission, in order. */
function admitParams(input: AdmitInput): unknown[] {
  const a = logText({ entity: input.entity, idempotencyKey: input.key, audit: input.audit });
  return [
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
  ];
}

function toAdmission(row: AdmitRow): Admission {
  switch (row.outcome) {
    case 'forward':
      return { outcome: 'forward', takeover: row.takeover === true };
    case 'stale-fence':
      return { outcome: 'stale-fence', currentFence: BigInt(row.current_fence!) };
    case 'replay':
      return { outcome: 'replay', response: storedResponse(row) };
    case 'outcome-unknown':
      // With the interim answer the record keeps, while its time lasts (DESIGN §3.7).
      return row.status === null ? { outcome: 'outcome-unknown' } : { outcome: 'outcome-unknown', interim: storedResponse(row) };
    case 'idempotency-key-reused':
      return { outcome: row.outcome };
    case 'idempotency-in-progress':
    case 'entity-busy':
      return { outcome: row.outcome, retryAfterMs: Number(row.retry_after_ms ?? 0) };
    default:
      throw new Error(`fencegate_admit returned an unknown outcome: ${String(row.outcome)}`);
  }
}

/** A stored answer as the functions and reads return it: headers escaped (./text.ts), the body a Buffer. */
export function storedResponse(row: { status: number | null; headers: [string, string][] | null; body: Buffer | null }): StoredResponse {
  return {
    status: row.status ?? 200,
    headers: (row.headers ?? []).map(([n, v]) => [decodeText(n), decodeText(v)] as [string, string]),
    body: bytes(row.body),
  };
}

/** An exact-size copy: a Buffer from pg may be a view into a larger, shared ArrayBuffer. */
function bytes(b: Buffer | null): Uint8Array {
  if (b === null) return new Uint8Array(0);
  return new Uint8Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
}
