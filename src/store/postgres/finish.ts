import type { FinishInput, FinishResult, StoredResponse } from '../types.js';
import { RoundTripGroup, type GroupLimits, type Settled } from './finish-group.js';
import { unsentFault } from './health.js';
import type { PgContext } from './query.js';
import { logText } from './rejections.js';
import { encodeNullable, encodeText } from './text.js';
import { decisionTopics, wakeLocal, type PgWakeups } from './wakeups.js';
import { commandValues, finishManyWithCommands, finishOneWithCommand, finishWithRows } from './commands.js';

/** The channel's place among fencegate_finish's parameters: one value for a whole group. */
const CHANNEL = 14;
/** How many parameters fencegate_finish takes (`finishParams`); the command row's follow them. */
const FINISH_PARAMS = 20;
/** SQLSTATE deadlock_detected. */
const DEADLOCK = '40P01';
/**
 * A group's bodies go as one `bytea[]` parameter, which node-postgres sends
 * as a hex text literal (twice the bytes) built in one string: a group stays
 * far below V8's longest string (about 512 Mi characters). A larger body goes
 * alone, as a single Buffer, which the driver sends in binary.
 */
const MAX_GROUP_BYTES = 8 * 1024 * 1024;
const ALONE_ABOVE_BYTES = 1024 * 1024;

/**
 * The finish (DESIGN §3.7): fencegate_finish (./sql/finish.sql) settles the
 * record, frees the entity's slot, logs a late finish and NOTIFYs the
 * entity's and the record's topics, all in one transaction: a replica that
 * wakes on the notification sees the committed state.
 *
 * Grouped (./finish-group.ts): the finishes that arrive while one is on its
 * way go together as ONE statement, fencegate_finish_many
 * (./sql/group_finish.sql), which runs each in a subtransaction of its own:
 * a faulty element fails only its caller, the others commit in the group's
 * one transaction. Every caller is answered after that COMMIT, and only
 * then are this replica's waiters woken, per entity and per record, as the
 * NOTIFYs of the committed elements wake the other replicas'. A group is
 * bounded by its bytes as well as its count (above); one that the driver
 * could not serialise, so never sent, goes again one element at a time.
 */
export function createFinish(
  ctx: PgContext,
  wakeups: Pick<PgWakeups, 'notifyChannel' | 'notify'>,
  options: { maxGroup?: number; maxGroupBytes?: number; aloneAboveBytes?: number; unsent?: GroupLimits<FinishInput>['unsent'] } = {},
): ((input: FinishInput) => Promise<FinishResult>) & { group: RoundTripGroup<FinishInput, boolean> } {
  // $1 scope $2 key $3 entity $4 owner $5 outcome $6 status $7 headers $8 body $9 retention_ms
  // $10 caller $11 method $12 path $13 payload_sha256 $14 request_id $15 channel $16 entity topic $17 record topic
  // $18 client_request_id $19 log_entity $20 log_key
  const lone = `SELECT recorded FROM ${ctx.table('fencegate_finish')}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)`;
  // The same twenty, each an array with one element per finish, but $15 (the channel).
  const grouped =
    `SELECT ord, recorded, err_code, err_message FROM ${ctx.table('fencegate_finish_many')}(` +
    `$1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::integer[], $7::jsonb[], $8::bytea[], $9::bigint[], ` +
    `$10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text, $16::text[], $17::text[], ` +
    `$18::text[], $19::text[], $20::text[]) ORDER BY ord`;
  // Each with its command-log row (./commands.ts), after the finish's own parameters.
  const one = finishOneWithCommand(ctx, lone, FINISH_PARAMS);
  const many = finishManyWithCommands(ctx, grouped, FINISH_PARAMS);

  const group = new RoundTripGroup<FinishInput, boolean>(
    {
      async one(input) {
        const query = (text: string, values: unknown[]) => ctx.query<{ recorded: boolean }>(text, values);
        const { rows } = await finishWithRows(query, one, lone, finishParams(input, wakeups.notifyChannel), FINISH_PARAMS);
        return rows[0]!.recorded;
      },
      async many(inputs) {
        const params = inputs.map((input) => finishParams(input, wakeups.notifyChannel));
        const columns = params[0]!.map((_, c) => (c === CHANNEL ? wakeups.notifyChannel : params.map((p) => p[c])));
        const query = (text: string, values: unknown[]) =>
          ctx.query<{ recorded: boolean | null; err_code: string | null; err_message: string | null }>(text, values);
        const { rows } = await finishWithRows(query, many, grouped, columns, FINISH_PARAMS);
        return Promise.all(
          rows.map(async (r, i): Promise<Settled<boolean>> => {
            if (r.err_code === null) return { ok: true, value: r.recorded! };
            // A group holds the rows of its earlier elements until it commits,
            // which a lone finish never did: an admission holding a later
            // element's entity and waiting for an earlier one's record (a key
            // reused with another entity) closes a cycle. The element the
            // deadlock detector chose runs again alone, after the group
            // committed and let go of its rows.
            if (r.err_code === DEADLOCK)
              return this.one(inputs[i]!).then(
                (value) => ({ ok: true, value }),
                (error: Error) => ({ ok: false, error }),
              );
            return { ok: false, error: Object.assign(new Error(r.err_message ?? 'fencegate_finish failed'), { code: r.err_code }) };
          }),
        );
      },
    },
    {
      maxGroup: options.maxGroup,
      weigh: finishBytes,
      maxWeight: options.maxGroupBytes ?? MAX_GROUP_BYTES,
      aloneAbove: options.aloneAboveBytes ?? ALONE_ABOVE_BYTES,
      unsent: options.unsent ?? unsentFault,
    },
  );

  const finish = async (input: FinishInput): Promise<FinishResult> => {
    const recorded = await group.run(input);
    // Local waiters need not wait for the NOTIFY round trip.
    wakeLocal(wakeups, decisionTopics(input));
    return { recorded };
  };
  return Object.assign(finish, { group });
}

/** The answer a finish stores: a completed one's, or an unknown one's interim answer (DESIGN §3.7). */
function storedOf(input: FinishInput): { response: StoredResponse; retentionMs: number | null } | null {
  if (input.outcome === 'completed') return { response: input.response, retentionMs: input.retentionMs };
  if (input.outcome === 'unknown' && input.interim !== undefined) return { response: input.interim, retentionMs: input.interimRetentionMs ?? null };
  return null;
}

/** The bytes a finish adds to its group's text parameters: its body (twice, in hex) dominates; its headers too. */
function finishBytes(input: FinishInput): number {
  const stored = storedOf(input);
  if (stored === null) return 0;
  let n = stored.response.body.byteLength;
  for (const [name, value] of stored.response.headers) n += name.length + value.length;
  return n;
}

/** fencegate_finish's twenty parameters for one finish, in order. */
function finishParams(input: FinishInput, channel: string | null): unknown[] {
  const a = logText({ entity: input.entity, idempotencyKey: input.key, audit: input.audit });
  const topics = decisionTopics(input);
  // A completed answer, or an unknown finish's interim answer (its retention: NULL keeps the admission's).
  const stored = storedOf(input);
  return [
    encodeText(input.scope),
    encodeNullable(input.key),
    encodeNullable(input.entity),
    encodeText(input.ownerToken),
    input.outcome,
    stored?.response.status ?? null,
    stored === null ? null : JSON.stringify(stored.response.headers.map(([n, v]) => [encodeText(n), encodeText(v)])),
    stored === null ? null : stored.response.body,
    stored === null || stored.retentionMs === null ? null : Math.ceil(stored.retentionMs),
    a.caller,
    a.method,
    a.path,
    a.payloadSha256,
    a.requestId,
    channel,
    topics.entity,
    topics.record,
    a.clientRequestId,
    a.entity,
    a.idempotencyKey,
    ...commandValues(input.command),
  ];
}
