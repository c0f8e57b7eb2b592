import { entityTopic, recordTopic, type FinishInput, type FinishResult } from '../types.js';
import type { PgContext } from './query.js';
import { logText } from './rejections.js';
import { encodeNullable, encodeText } from './text.js';
import { topicHash, type PgWakeups } from './wakeups.js';

/**
 * The finish (DESIGN §3.7): ONE statement calling fencegate_finish
 * (./sql/finish.sql), which settles the record, frees the entity's slot,
 * logs a late finish and NOTIFYs the entity's and the record's topics, all
 * in one transaction: a replica that wakes on the notification sees the
 * committed state.
 */
export function createFinish(ctx: PgContext, wakeups: Pick<PgWakeups, 'notifyChannel' | 'notify'>): (input: FinishInput) => Promise<FinishResult> {
  // $1 scope $2 key $3 entity $4 owner $5 outcome $6 status $7 headers $8 body $9 retention_ms
  // $10 caller $11 method $12 path $13 payload_sha256 $14 request_id $15 channel $16 entity topic $17 record topic
  // $18 client_request_id $19 log_entity $20 log_key
  const text = `SELECT recorded FROM ${ctx.table('fencegate_finish')}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)`;

  return async (input) => {
    const a = logText({ entity: input.entity, idempotencyKey: input.key, audit: input.audit });
    const eTopic = input.entity === null ? null : topicHash(entityTopic(input.entity));
    const kTopic = input.key === null ? null : topicHash(recordTopic(input.scope, input.key));
    const completed = input.outcome === 'completed' ? input : null;
    const { rows } = await ctx.query<{ recorded: boolean }>(text, [
      encodeText(input.scope),
      encodeNullable(input.key),
      encodeNullable(input.entity),
      encodeText(input.ownerToken),
      input.outcome,
      completed?.response.status ?? null,
      completed === null ? null : JSON.stringify(completed.response.headers.map(([n, v]) => [encodeText(n), encodeText(v)])),
      completed === null ? null : completed.response.body,
      completed === null ? null : Math.ceil(completed.retentionMs),
      a.caller,
      a.method,
      a.path,
      a.payloadSha256,
      a.requestId,
      wakeups.notifyChannel,
      eTopic,
      kTopic,
      a.clientRequestId,
      a.entity,
      a.idempotencyKey,
    ]);
    // Local waiters need not wait for the NOTIFY round trip.
    if (eTopic !== null) wakeups.notify(eTopic);
    if (kTopic !== null) wakeups.notify(kTopic);
    return { recorded: rows[0]!.recorded };
  };
}
