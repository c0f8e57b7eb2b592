import { LocalNotifier } from '../notifier.js';
import {
  entityTopic,
  recordTopic,
  type Admission,
  type AdmitInput,
  type AuditStore,
  type EntityInfo,
  type FinishInput,
  type FinishResult,
  type GatewayStore,
  type RecordInfo,
  type RejectionInput,
  type RejectionPage,
  type RejectionQuery,
  type StoredResponse,
  type SweepOptions,
  type SweepResult,
} from '../types.js';
import { createD1Audit } from './audit.js';
import { NOW_MS, toRecord, toRejection } from '../dialect-rows.js';
import { boundRejectionText } from '../bounds.js';
import { sweepInBatches, type SweepStep } from '../sweep.js';

/**
 * The part of a D1 binding this store uses, typed structurally so that the
 * package depends neither on `@cloudflare/workers-types` nor on a runtime:
 * a real `D1Database` fits, and so does a test double.
 */
export interface D1ResultLike<T = Record<string, unknown>> {
  results?: T[];
  meta?: { changes?: number };
}
export interface D1PreparedStatementLike {
  bind(...values: unknown[]): D1PreparedStatementLike;
  all<T = Record<string, unknown>>(): Promise<D1ResultLike<T>>;
  run(): Promise<D1ResultLike>;
}
export interface D1DatabaseLike {
  prepare(query: string): D1PreparedStatementLike;
  /** Runs the statements in order as ONE transaction; any failure rolls back all of them. */
  batch(statements: D1PreparedStatementLike[]): Promise<D1ResultLike<any>[]>;
}

export interface D1StoreOptions {
  /** The D1 binding, e.g. `env.DB`, migrated with `migrations/gateway/sqlite`. */
  db: D1DatabaseLike;
  /**
   * How often a waiter (serial slot, `Prefer: wait`) re-runs the admission.
   * Default 100 ms. Each poll is one D1 batch, so lower costs more queries.
   */
  pollMs?: number;
}


/** Admission decisions that go to the rejection log (DESIGN §2 G5). */
const LOGGED = "('stale-fence', 'idempotency-key-reused', 'outcome-unknown')";

/**
 * The gateway store on Cloudflare D1 (`fencegate/d1`).
 *
 * ## Why one `batch()` with a scratch row (and not a Durable Object)
 *
 * D1 offers no interactive transaction: no `BEGIN`, no read-then-decide in
 * JavaScript. What it does offer is `batch()`, a list of statements that D1
 * runs in order as ONE SQLite transaction on the database's single primary,
 * rolled back entirely if any statement fails. D1 runs one transaction at a
 * time per database, so a batch is serialisable against every other batch and
 * every other query, from every isolate and every colo: exactly the property
 * the SQLite store gets from `BEGIN IMMEDIATE`.
 *
 * The admission of DESIGN §3.5 branches (a stale fence stops everything; a
 * completed record is replayed; …), and a batch cannot branch. So the branch
 * state lives in the database: each admission inserts a row into
 * `admission_scratch` (migration 0003) under a fresh id, holding the database
 * clock read once; every following statement is conditional on that row
 * (`… AND (SELECT decision FROM admission_scratch WHERE id = ?) IS NULL`)
 * and the statements that decide write the decision into it. The last SELECT
 * returns the decision (with the stored response for a replay), and the last
 * statement deletes the row. Each step below is the SQLite store's step,
 * with its own condition, in the same order:
 *
 *  a. fence check first: mark `stale-fence` if the entity's fence is higher,
 *     else raise it (equal is fine) and append the rise to `fence_history`;
 *  b–g. forget an expired completed record; load the record into the row;
 *     decide reused (fingerprint) / replay / in-progress (lock alive) /
 *     outcome-unknown (onUnknown: reject) or note the owner to take over;
 *     an in_progress record with an expired lock becomes `outcome_unknown`
 *     whatever follows (its gateway died);
 *  h. serial mode: take the entity's slot (free or expired) BEFORE the
 *     record is written; no slot means `entity-busy` and no record;
 *  then write the record (insert, or take over the `outcome_unknown` one),
 *  and log the refusals of G5 in the same batch.
 *
 * Consistency: nothing runs between the statements of a batch, so the
 * decision is taken on one snapshot and its writes land with it or not at
 * all; no other admission can interleave (G1–G3). A failed batch (an error,
 * the D1 size limits) leaves no trace, the scratch row included, and the
 * gateway answers 503 store-unavailable without forwarding. State is changed
 * exactly as the SQLite store changes it, including on refusals (a raised
 * fence and an `outcome_unknown` mark persist when the answer is
 * entity-busy), so one conformance suite holds for both.
 *
 * A Durable Object per entity would also serialise admissions, but the
 * idempotency record is keyed by (scope, key), not by entity, and a key
 * without an entity would need a second object and a two-object protocol;
 * the single D1 transaction keeps one authority and the same tables and
 * migrations as SQLite (DESIGN §4, §8).
 *
 * The audit methods (./audit.ts) follow the same rule: `resolveRecord` is one
 * batch whose every write is conditional on `state = 'outcome_unknown'`.
 *
 * Finish is one batch too: the `late-finish` rejection is inserted under
 * `NOT EXISTS (the owned record)`, then the owner-conditional write runs
 * with the same condition; its row count is the answer.
 *
 * ## Limits
 *
 * - Fences are 64-bit; D1 binds no BigInt and returns integers as doubles,
 *   so fences travel as decimal text and are CAST in SQL, both ways.
 * - D1 caps a row (and a bound BLOB) near 2 MB: a stored response larger
 *   than that fails the finish, the record stays `in_progress` until its lock
 *   expires and then reads `outcome_unknown`. Keep replayed bodies small.
 * - Use the binding itself, not a `withSession()` read-replica session, for
 *   the admission: a batch with writes runs on the primary either way, but a
 *   replica could serve a stale `getEntity` / `listRejections` (admin only).
 * - `waitForChange` polls: Workers isolates share no memory, so a finish in
 *   another isolate cannot wake a waiter here. A finish in this isolate wakes
 *   its waiters at once; otherwise they re-check every `pollMs`. The
 *   gateway re-runs the admission after every wake-up, so a spurious or
 *   late wake-up costs latency and D1 reads, never safety.
 */
export class D1GatewayStore implements GatewayStore {
  readonly kind = 'd1';
  readonly db: D1DatabaseLike;
  private readonly notifier: LocalNotifier;
  private readonly statements = new Map<string, { stmt: D1PreparedStatementLike; names: string[] }>();
  private readonly audit: AuditStore;
  private closed = false;

  constructor(options: D1StoreOptions) {
    this.db = options.db;
    this.notifier = new LocalNotifier(options.pollMs ?? 100);
    this.audit = createD1Audit(this.db);
  }

  // The audit methods (fence history, operator resolution) live in ./audit.ts.
  getFenceHistory: AuditStore['getFenceHistory'] = (entity, page) => this.audit.getFenceHistory(entity, page);
  listRecords: AuditStore['listRecords'] = (query) => this.audit.listRecords(query);
  resolveRecord: AuditStore['resolveRecord'] = (input) => this.audit.resolveRecord(input);
  listOperatorActions: AuditStore['listOperatorActions'] = (page) => this.audit.listOperatorActions(page);
  auditStats: AuditStore['auditStats'] = () => this.audit.auditStats();

  async admit(input: AdmitInput): Promise<Admission> {
    const { scope, key, entity, fence, ownerToken: owner } = input;
    const p = {
      id: crypto.randomUUID(),
      scope,
      key,
      entity,
      fence,
      owner,
      fingerprint: input.fingerprint,
      lock_ms: input.lockMs,
      retention_ms: input.retentionMs,
      on_unknown: input.onUnknown,
      ...auditParams(input),
    };
    const steps: D1PreparedStatementLike[] = [this.st(Q.begin, p)];
    if (entity !== null && fence !== null) steps.push(this.st(Q.staleFence, p), this.st(Q.raiseFence, p), this.st(Q.fenceHistory, p));
    if (key !== null) steps.push(this.st(Q.forgetExpired, p), this.st(Q.loadRecord, p), this.st(Q.decideRecord, p), this.st(Q.markUnknown, p));
    if (input.mode === 'serial' && entity !== null) {
      if (fence === null) steps.push(this.st(Q.ensureEntity, p));
      steps.push(this.st(Q.takeSlot, p), this.st(Q.entityBusy, p));
    }
    if (key !== null) steps.push(this.st(Q.takeOver, p), this.st(Q.insertRecord, p));
    steps.push(this.st(Q.logRefusal, p));
    const resultAt = steps.length;
    steps.push(this.st(Q.decision, p), this.st(Q.end, p));

    const results = await this.db.batch(steps);
    const row = results[resultAt]?.results?.[0] as DecisionRow | undefined;
    if (row === undefined) throw new Error('d1 admission batch returned no decision row');
    return toAdmission(row);
  }

  async finish(input: FinishInput): Promise<FinishResult> {
    const p = {
      scope: input.scope,
      key: input.key,
      entity: input.entity,
      owner: input.ownerToken,
      ...auditParams(input),
    };
    const steps: D1PreparedStatementLike[] = [];
    if (input.key !== null) {
      // Logged first, under the negation of the write's own condition: in one
      // transaction, exactly one of the two takes effect.
      steps.push(this.st(Q.logLateFinish, p));
      switch (input.outcome) {
        case 'completed': {
          const r = input.response;
          steps.push(this.st(Q.complete, { ...p, status: r.status, headers: JSON.stringify(r.headers), body: r.body, retention_ms: input.retentionMs }));
          break;
        }
        case 'released':
          steps.push(this.st(Q.deleteOwned, p));
          break;
        case 'unknown':
          steps.push(this.st(Q.markUnknownOwned, p));
          break;
      }
    }
    if (input.entity !== null) steps.push(this.st(Q.freeSlot, p));
    let recorded = true;
    if (steps.length > 0) {
      const results = await this.db.batch(steps);
      if (input.key !== null) recorded = results[1]?.meta?.changes === 1;
    }
    if (input.entity !== null) this.notifier.notify(entityTopic(input.entity));
    if (input.key !== null) this.notifier.notify(recordTopic(input.scope, input.key));
    return { recorded };
  }

  async recordRejection(input: RejectionInput): Promise<void> {
    await this.st(Q.insertRejection, {
      reason: input.reason,
      presented: input.presentedFence,
      current: input.currentFence,
      ...auditParams(input),
    }).run();
  }

  waitForChange(topic: string, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    return this.notifier.wait(topic, timeoutMs, signal);
  }

  async listRejections(query: RejectionQuery): Promise<RejectionPage> {
    const where: string[] = [];
    const values: unknown[] = [];
    const add = (cond: string, value: unknown) => (where.push(cond), values.push(value));
    if (query.entity !== undefined) add('entity = ?', query.entity);
    if (query.reason !== undefined) add('reason = ?', query.reason);
    if (query.caller !== undefined) add('caller = ?', query.caller);
    if (query.since !== undefined) add('at >= ?', query.since.getTime());
    if (query.until !== undefined) add('at < ?', query.until.getTime());
    if (query.cursor !== undefined) add('id < CAST(? AS INTEGER)', query.cursor);
    values.push(query.limit + 1);
    const sql = `SELECT CAST(id AS TEXT) AS id, at, reason, entity, CAST(presented_fence AS TEXT) AS presented_fence,
      CAST(current_fence AS TEXT) AS current_fence, idempotency_key, caller, method, path, payload_sha256, request_id, client_request_id, detail
      FROM rejections ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY id DESC LIMIT CAST(? AS INTEGER)`;
    const rows = (await this.db.prepare(sql).bind(...values).all()).results ?? [];
    const items = rows.slice(0, query.limit).map(toRejection);
    const more = rows.length > query.limit;
    return { items, nextCursor: more ? items[items.length - 1]!.id : null };
  }

  async getEntity(entity: string): Promise<EntityInfo | null> {
    const rows = (await this.st(Q.entityInfo, { entity }).all()).results ?? [];
    const row = rows[0] as { entity: string; fence: string | null; accepted_at: number; inflight_until: number | null; now: number } | undefined;
    if (row === undefined) return null;
    const live = row.inflight_until !== null && row.inflight_until > row.now;
    return {
      entity: row.entity,
      fence: row.fence,
      acceptedAt: new Date(row.accepted_at),
      inflight: live ? { until: new Date(row.inflight_until!) } : null,
    };
  }

  async getRecords(key: string): Promise<RecordInfo[]> {
    const rows = (await this.st(Q.recordsByKey, { key }).all()).results ?? [];
    return rows.map(toRecord);
  }

  /**
   * Batches (../sweep.ts): each one statement, so one D1 transaction that
   * holds the database only for its `batch` rows; other queries run between
   * them. The retention is applied with the database clock, in SQL.
   */
  async sweep(options: SweepOptions): Promise<SweepResult> {
    const retention = (ms: number) => Math.max(0, Math.floor(ms));
    const step = (run: string, count: string, params: Record<string, unknown>): SweepStep => ({
      run: async (batch) => (await this.st(run, { ...params, batch }).run()).meta?.changes ?? 0,
      count: async (cap) => Number(((await this.st(count, { ...params, cap }).all<{ n: number }>()).results ?? [])[0]?.n ?? 0),
    });
    const steps: Partial<Record<keyof SweepResult['backlog'], SweepStep>> = {
      expiredRecords: step(Q.sweepExpired, Q.countExpired, {}),
      unknownRecords: step(Q.sweepLocked, Q.countLocked, {}),
      oldRejections: step(Q.sweepRejections, Q.countRejections, { retention_ms: retention(options.rejectionRetentionMs) }),
    };
    if (options.entityRetentionMs !== undefined) {
      const p = { retention_ms: retention(options.entityRetentionMs) };
      steps.oldEntities = step(Q.sweepEntities, Q.countEntities, p);
      steps.oldFenceHistory = step(Q.sweepHistory, Q.countHistory, p);
    }
    if (options.operatorActionRetentionMs !== undefined) {
      steps.oldOperatorActions = step(Q.sweepActions, Q.countActions, { retention_ms: retention(options.operatorActionRetentionMs) });
    }
    return sweepInBatches(steps, options, { stopped: () => this.closed });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.notifier.close();
  }

  /** Binds `@name` parameters (see `Q`) to a statement prepared once per store. */
  private st(sql: string, params: Record<string, unknown>): D1PreparedStatementLike {
    let prepared = this.statements.get(sql);
    if (prepared === undefined) {
      const names: string[] = [];
      const text = sql.replace(/@([a-z_]+)/g, (_m, name: string) => {
        let i = names.indexOf(name);
        if (i < 0) i = names.push(name) - 1;
        return `?${i + 1}`;
      });
      prepared = { stmt: this.db.prepare(text), names };
      this.statements.set(sql, prepared);
    }
    return prepared.stmt.bind(
      ...prepared.names.map((name) => {
        const v = params[name];
        if (v === undefined) throw new Error(`d1 store: parameter @${name} not given`);
        // D1 binds no BigInt: fences go as decimal text and are CAST in SQL.
        return typeof v === 'bigint' ? v.toString() : v;
      }),
    );
  }
}

interface DecisionRow {
  decision: string | null;
  current_fence: string | null;
  wait_ms: number | null;
  takeover: number;
  status: number | null;
  headers: string | null;
  body: unknown;
}

function toAdmission(row: DecisionRow): Admission {
  switch (row.decision) {
    case null:
      return { outcome: 'forward', takeover: row.takeover === 1 };
    case 'stale-fence':
      return { outcome: 'stale-fence', currentFence: BigInt(row.current_fence ?? '0') };
    case 'replay':
      return { outcome: 'replay', response: toResponse(row) };
    case 'idempotency-key-reused':
      return { outcome: 'idempotency-key-reused' };
    case 'idempotency-in-progress':
      return { outcome: 'idempotency-in-progress', retryAfterMs: Math.max(0, row.wait_ms ?? 0) };
    case 'outcome-unknown':
      return { outcome: 'outcome-unknown' };
    case 'entity-busy':
      return { outcome: 'entity-busy', retryAfterMs: Math.max(0, row.wait_ms ?? 0) };
    default:
      throw new Error(`d1 admission: unexpected decision ${row.decision}`);
  }
}

function toResponse(row: DecisionRow): StoredResponse {
  return {
    status: row.status ?? 200,
    headers: JSON.parse(row.headers ?? '[]') as [string, string][],
    body: toBytes(row.body),
  };
}

/** D1 returns a BLOB as an array of numbers (or, in some versions, an ArrayBuffer). */
function toBytes(v: unknown): Uint8Array {
  if (v === null || v === undefined) return new Uint8Array(0);
  if (v instanceof Uint8Array) return v;
  if (v instanceof ArrayBuffer) return new Uint8Array(v);
  if (ArrayBuffer.isView(v)) return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
  if (Array.isArray(v)) return Uint8Array.from(v as number[]);
  throw new Error(`d1 store: unexpected BLOB value of type ${typeof v}`);
}

/**
 * The bounded text of the rejection row a statement may write (../bounds.ts),
 * as bound parameters: `@log_entity` and `@log_key` for the row, while the
 * decision itself uses the whole `@entity` and `@key`. The fence history
 * takes the same bounded caller and request id.
 */
function auditParams(r: { entity: string | null; key?: string | null; idempotencyKey?: string | null; audit: RejectionInput['audit']; detail?: string | null }) {
  const text = boundRejectionText({ entity: r.entity, idempotencyKey: r.idempotencyKey ?? r.key ?? null, audit: r.audit, detail: r.detail ?? null });
  return {
    log_entity: text.entity,
    log_key: text.idempotencyKey,
    caller: text.caller,
    method: text.method,
    path: text.path,
    sha: text.payloadSha256,
    request_id: text.requestId,
    client_request_id: text.clientRequestId,
    detail: text.detail,
  };
}


/** This admission's scratch row, and the guard "no decision taken yet". */
const NOW = '(SELECT now FROM admission_scratch WHERE id = @id)';
const UNDECIDED = '(SELECT decision FROM admission_scratch WHERE id = @id) IS NULL';
const FENCE = 'CAST(@fence AS INTEGER)';
const LOCK_UNTIL = `${NOW} + CAST(@lock_ms AS INTEGER)`;
/** A record still owned by @owner: the condition of every finish (DESIGN §3.7). */
const OWNED = "scope = @scope AND key = @key AND owner_token = @owner AND state IN ('in_progress', 'outcome_unknown')";
const REJECTION_COLUMNS = '(at, reason, entity, presented_fence, current_fence, idempotency_key, caller, method, path, payload_sha256, request_id, client_request_id)';

/**
 * Every statement, one constant each, with its named parameters. `@name`
 * becomes `?N` when prepared (D1 has no named parameters).
 */
const Q = {
  // @id — the scratch row, with the database clock read once for the batch.
  begin: `INSERT INTO admission_scratch (id, now) VALUES (@id, ${NOW_MS})`,
  // a. @id @entity @fence — stale iff the entity already holds a higher fence.
  staleFence: `UPDATE admission_scratch SET decision = 'stale-fence',
      current_fence = (SELECT fence FROM fence_entities WHERE entity = @entity)
    WHERE id = @id AND EXISTS (SELECT 1 FROM fence_entities WHERE entity = @entity AND fence > ${FENCE})`,
  // a. @id @entity @fence — raise (or create) the fence; equal is fine.
  raiseFence: `INSERT INTO fence_entities (entity, fence, accepted_at)
    SELECT @entity, ${FENCE}, now FROM admission_scratch WHERE id = @id AND decision IS NULL
    ON CONFLICT (entity) DO UPDATE SET fence = excluded.fence, accepted_at = excluded.accepted_at
      WHERE fence_entities.fence IS NULL OR excluded.fence >= fence_entities.fence`,
  // a. @id @entity @fence @caller @request_id — the entity's fence history: one row per
  //    accepted fence value (a no-op when it stayed equal), only when not stale.
  fenceHistory: `INSERT INTO fence_history (entity, fence, at, caller, request_id)
    SELECT @entity, ${FENCE}, now, @caller, @request_id FROM admission_scratch WHERE id = @id AND decision IS NULL
    ON CONFLICT (entity, fence) DO NOTHING`,
  // @id @scope @key — past retention: forgotten, as if the sweeper had already run.
  forgetExpired: `DELETE FROM idempotency_records
    WHERE scope = @scope AND key = @key AND state = 'completed' AND expires_at <= ${NOW} AND ${UNDECIDED}`,
  // @id @scope @key — the record as seen now (all NULL when there is none).
  loadRecord: `UPDATE admission_scratch SET (rec_state, rec_fingerprint, rec_owner, rec_locked_until) =
      (SELECT state, fingerprint, owner_token, locked_until FROM idempotency_records WHERE scope = @scope AND key = @key)
    WHERE id = @id AND decision IS NULL`,
  // b–g. @id @fingerprint @on_unknown — all SET expressions read the row as
  // it was before this statement, so the flags below see the loaded record.
  decideRecord: `UPDATE admission_scratch SET
      decision = CASE
        WHEN rec_fingerprint <> @fingerprint THEN 'idempotency-key-reused'
        WHEN rec_state = 'completed' THEN 'replay'
        WHEN rec_state = 'in_progress' AND rec_locked_until > now THEN 'idempotency-in-progress'
        WHEN @on_unknown = 'reject' THEN 'outcome-unknown'
      END,
      busy_until = CASE WHEN rec_fingerprint = @fingerprint AND rec_state = 'in_progress' AND rec_locked_until > now THEN rec_locked_until END,
      mark_unknown = (rec_fingerprint = @fingerprint AND rec_state = 'in_progress' AND (rec_locked_until IS NULL OR rec_locked_until <= now)),
      takeover_from = CASE WHEN @on_unknown = 'retry' AND rec_fingerprint = @fingerprint
        AND (rec_state = 'outcome_unknown' OR (rec_state = 'in_progress' AND (rec_locked_until IS NULL OR rec_locked_until <= now)))
        THEN rec_owner END
    WHERE id = @id AND decision IS NULL AND rec_state IS NOT NULL`,
  // f. @id @scope @key — the gateway holding the lock died mid-request: the
  //    request may have reached the upstream. Persists whatever the decision.
  markUnknown: `UPDATE idempotency_records SET state = 'outcome_unknown', locked_until = NULL
    WHERE scope = @scope AND key = @key AND state = 'in_progress'
      AND owner_token = (SELECT rec_owner FROM admission_scratch WHERE id = @id AND mark_unknown = 1)`,
  // h. @id @entity — the row that holds the serial slot of an entity without fences.
  ensureEntity: `INSERT INTO fence_entities (entity, fence, accepted_at)
    SELECT @entity, NULL, now FROM admission_scratch WHERE id = @id AND decision IS NULL
    ON CONFLICT (entity) DO NOTHING`,
  // h. @id @entity @owner @lock_ms — take the slot if free or expired (a dead gateway's).
  takeSlot: `UPDATE fence_entities SET inflight_owner = @owner, inflight_until = ${LOCK_UNTIL}
    WHERE entity = @entity AND (inflight_owner IS NULL OR inflight_until <= ${NOW}) AND ${UNDECIDED}`,
  // h. @id @entity @owner — no slot: busy, before any record is written.
  entityBusy: `UPDATE admission_scratch SET decision = 'entity-busy',
      busy_until = (SELECT inflight_until FROM fence_entities WHERE entity = @entity)
    WHERE id = @id AND decision IS NULL
      AND NOT EXISTS (SELECT 1 FROM fence_entities WHERE entity = @entity AND inflight_owner = @owner)`,
  // g. @id @scope @key @owner @lock_ms @entity @fence — onUnknown: retry takes the record over.
  takeOver: `UPDATE idempotency_records SET owner_token = @owner, state = 'in_progress', locked_until = ${LOCK_UNTIL},
      entity = @entity, fence = ${FENCE}
    WHERE scope = @scope AND key = @key AND state = 'outcome_unknown' AND ${UNDECIDED}
      AND owner_token = (SELECT takeover_from FROM admission_scratch WHERE id = @id)`,
  // b. @id @scope @key @fingerprint @entity @fence @owner @lock_ms @retention_ms
  insertRecord: `INSERT INTO idempotency_records
      (scope, key, fingerprint, entity, fence, state, owner_token, locked_until, created_at, expires_at)
    SELECT @scope, @key, @fingerprint, @entity, ${FENCE}, 'in_progress', @owner, ${LOCK_UNTIL}, now,
      now + CAST(@retention_ms AS INTEGER)
    FROM admission_scratch WHERE id = @id AND decision IS NULL AND takeover_from IS NULL`,
  // G5. @id @log_entity @fence @log_key @caller @method @path @sha @request_id @client_request_id
  // — in the decision's transaction; the text bounded by auditParams.
  logRefusal: `INSERT INTO rejections ${REJECTION_COLUMNS}
    SELECT now, decision, @log_entity, ${FENCE}, current_fence, @log_key, @caller, @method, @path, @sha, @request_id, @client_request_id
    FROM admission_scratch WHERE id = @id AND decision IN ${LOGGED}`,
  // @id @scope @key — the answer; the stored response only for a replay.
  decision: `SELECT s.decision, CAST(s.current_fence AS TEXT) AS current_fence, s.busy_until - s.now AS wait_ms,
      s.takeover_from IS NOT NULL AS takeover, r.status, r.headers, r.body
    FROM admission_scratch s
    LEFT JOIN idempotency_records r ON s.decision = 'replay' AND r.scope = @scope AND r.key = @key
    WHERE s.id = @id`,
  end: 'DELETE FROM admission_scratch WHERE id = @id',

  // Finish. @scope @key @owner @log_entity @log_key @caller @method @path @sha @request_id @client_request_id
  logLateFinish: `INSERT INTO rejections ${REJECTION_COLUMNS}
    SELECT ${NOW_MS}, 'late-finish', @log_entity, NULL, NULL, @log_key, @caller, @method, @path, @sha, @request_id, @client_request_id
    WHERE NOT EXISTS (SELECT 1 FROM idempotency_records WHERE ${OWNED})`,
  // @scope @key @owner @status @headers @body @retention_ms — a record only
  // marked outcome_unknown (nobody took it over) still belongs to its owner.
  complete: `UPDATE idempotency_records SET state = 'completed', status = @status, headers = @headers, body = @body,
      locked_until = NULL, expires_at = ${NOW_MS} + CAST(@retention_ms AS INTEGER)
    WHERE ${OWNED}`,
  deleteOwned: `DELETE FROM idempotency_records WHERE ${OWNED}`,
  markUnknownOwned: `UPDATE idempotency_records SET state = 'outcome_unknown', locked_until = NULL WHERE ${OWNED}`,
  // @entity @owner — free the slot only if this owner still holds it.
  freeSlot: 'UPDATE fence_entities SET inflight_owner = NULL, inflight_until = NULL WHERE entity = @entity AND inflight_owner = @owner',

  // @reason @log_entity @presented @current @log_key @caller @method @path @sha @request_id @client_request_id @detail
  insertRejection: `INSERT INTO rejections (at, reason, entity, presented_fence, current_fence, idempotency_key, caller, method, path, payload_sha256, request_id, client_request_id, detail)
    VALUES (${NOW_MS}, @reason, @log_entity, CAST(@presented AS INTEGER), CAST(@current AS INTEGER), @log_key, @caller, @method, @path, @sha, @request_id, @client_request_id, @detail)`,
  // @entity
  entityInfo: `SELECT entity, CAST(fence AS TEXT) AS fence, accepted_at, inflight_until, ${NOW_MS} AS now
    FROM fence_entities WHERE entity = @entity`,
  // @key
  recordsByKey: `SELECT scope, key, state, fingerprint, entity, CAST(fence AS TEXT) AS fence, status, locked_until, created_at, expires_at
    FROM idempotency_records WHERE key = @key ORDER BY scope`,
  // @batch
  sweepExpired: `DELETE FROM idempotency_records WHERE rowid IN (
    SELECT rowid FROM idempotency_records WHERE state = 'completed' AND expires_at <= ${NOW_MS} LIMIT CAST(@batch AS INTEGER))`,
  sweepLocked: `UPDATE idempotency_records SET state = 'outcome_unknown', locked_until = NULL WHERE rowid IN (
    SELECT rowid FROM idempotency_records WHERE state = 'in_progress' AND locked_until <= ${NOW_MS} LIMIT CAST(@batch AS INTEGER))`,
  // @batch @retention_ms
  sweepRejections: `DELETE FROM rejections WHERE id IN (
    SELECT id FROM rejections WHERE at < ${NOW_MS} - CAST(@retention_ms AS INTEGER) LIMIT CAST(@batch AS INTEGER))`,
  // @batch @retention_ms — entityRetention, never an entity whose serial slot is live (see the SQLite store).
  sweepEntities: `DELETE FROM fence_entities WHERE entity IN (
    SELECT entity FROM fence_entities WHERE accepted_at < ${NOW_MS} - CAST(@retention_ms AS INTEGER)
      AND (inflight_owner IS NULL OR inflight_until <= ${NOW_MS}) LIMIT CAST(@batch AS INTEGER))`,
  sweepHistory: `DELETE FROM fence_history WHERE (entity, fence) IN (
    SELECT entity, fence FROM fence_history WHERE at < ${NOW_MS} - CAST(@retention_ms AS INTEGER) LIMIT CAST(@batch AS INTEGER))`,
  sweepActions: `DELETE FROM operator_actions WHERE id IN (
    SELECT id FROM operator_actions WHERE at < ${NOW_MS} - CAST(@retention_ms AS INTEGER) LIMIT CAST(@batch AS INTEGER))`,
  // The backlog, counted up to @cap.
  countExpired: `SELECT count(*) AS n FROM (SELECT 1 FROM idempotency_records
    WHERE state = 'completed' AND expires_at <= ${NOW_MS} LIMIT CAST(@cap AS INTEGER))`,
  countLocked: `SELECT count(*) AS n FROM (SELECT 1 FROM idempotency_records
    WHERE state = 'in_progress' AND locked_until <= ${NOW_MS} LIMIT CAST(@cap AS INTEGER))`,
  countRejections: `SELECT count(*) AS n FROM (SELECT 1 FROM rejections
    WHERE at < ${NOW_MS} - CAST(@retention_ms AS INTEGER) LIMIT CAST(@cap AS INTEGER))`,
  countEntities: `SELECT count(*) AS n FROM (SELECT 1 FROM fence_entities WHERE accepted_at < ${NOW_MS} - CAST(@retention_ms AS INTEGER)
    AND (inflight_owner IS NULL OR inflight_until <= ${NOW_MS}) LIMIT CAST(@cap AS INTEGER))`,
  countHistory: `SELECT count(*) AS n FROM (SELECT 1 FROM fence_history
    WHERE at < ${NOW_MS} - CAST(@retention_ms AS INTEGER) LIMIT CAST(@cap AS INTEGER))`,
  countActions: `SELECT count(*) AS n FROM (SELECT 1 FROM operator_actions
    WHERE at < ${NOW_MS} - CAST(@retention_ms AS INTEGER) LIMIT CAST(@cap AS INTEGER))`,
} as const;
