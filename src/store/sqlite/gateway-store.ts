import { resolve } from 'node:path';
import type { Statement } from 'better-sqlite3';
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
  type SweepOptions,
  type SweepResult,
} from '../types.js';
import { createSqliteAudit } from './audit.js';
import { GroupCommit, walSyncer } from './group-commit.js';
import { WriteLock } from './write-lock.js';
import { migrateSqlite } from './migrate.js';
import { openSqlite, type OpenSqliteOptions, type SqliteDatabase } from './open.js';
import { NOW_MS, toRecord, toRejection } from '../dialect-rows.js';
import { boundRejectionText } from '../bounds.js';
import { decide, finish } from '../../core/admission.js';
import { admissionRows, type AdmissionRows } from './admission-rows.js';
import { sweepInBatches, type SweepStep } from '../sweep.js';

export interface SqliteStoreOptions extends OpenSqliteOptions {
  /** Path of the database file (created if missing), or `:memory:`. */
  path: string;
  /**
   * How often a waiter re-checks the database when the change it waits for
   * may come from another process on the same file. Default 50 ms.
   * Changes made by this process wake waiters at once.
   */
  pollMs?: number;
  /** Apply pending migrations on open. Default true. */
  migrate?: boolean;
  /**
   * Commit the decisions that arrive together in one transaction, one fsync
   * for the group, each caller answered after the group is durable (see
   * ./group-commit.ts). Default true; false gives one transaction per decision.
   */
  groupCommit?: boolean;
  /**
   * With group commit at `synchronous=FULL`: sync the WAL on libuv's thread
   * pool after each group's COMMIT instead of inside it, so the event loop
   * runs while the disk works; callers are still answered only once their
   * group is on disk (./group-commit.ts). Default true.
   */
  backgroundSync?: boolean;
  /**
   * How much of the wait for another process's write lock (`busyTimeoutMs`
   * in all) SQLite may spend inside one call, sleeping the thread and so the
   * event loop; the rest is waited between attempts with the loop free
   * (./write-lock.ts). Default 5 ms.
   */
  blockingWaitMs?: number;
}


/**
 * The embedded default store: one SQLite file in WAL mode. Every decision is
 * one `BEGIN IMMEDIATE` transaction, so several gateway processes on the same
 * file serialise on SQLite's write lock and keep every guarantee.
 *
 * better-sqlite3 is synchronous; the async interface is kept so that the
 * gateway treats every backend alike.
 */
export class SqliteGatewayStore implements GatewayStore {
  readonly kind = 'sqlite';
  readonly db: SqliteDatabase;
  private readonly notifier: LocalNotifier;
  private closed = false;
  private readonly q: ReturnType<typeof prepare>;
  /** The two rows of a decision, read and written for the pure rules (./admission-rows.ts). */
  private readonly rows: AdmissionRows;
  private readonly admitTx: (input: AdmitInput) => Admission | Promise<Admission>;
  private readonly finishTx: (input: FinishInput) => FinishResult | Promise<FinishResult>;
  private readonly rejectTx: (input: RejectionInput) => void | Promise<void>;
  /** The database clock (ms) read at the start of the current write transaction. */
  private txNow = 0;
  /** The group committer, when `groupCommit` is on. */
  group: GroupCommit | null = null;
  /** The WAL's background sync, when `backgroundSync` is on. */
  readonly syncer: ReturnType<typeof walSyncer> | null = null;
  private readonly audit: AuditStore;
  /** Every write transaction begins here: waits for another process's lock leave the event loop free. */
  readonly lock: WriteLock;

  constructor(options: SqliteStoreOptions) {
    this.db = openSqlite(options.path, options);
    if (options.migrate !== false) migrateSqlite(this.db);
    // The migrations may wait the whole busy_timeout (nothing is served yet);
    // from here on SQLite waits only blockingWaitMs inside a call.
    this.lock = new WriteLock(this.db, { timeoutMs: options.busyTimeoutMs, blockingMs: options.blockingWaitMs ?? 5 });
    this.notifier = new LocalNotifier(options.pollMs ?? 50);
    this.q = prepare(this.db);
    this.rows = admissionRows(this.db);
    // The database clock is read once per transaction: every decision of a
    // transaction (of a group) happens at the same database time.
    const begin = () => {
      this.txNow = this.now();
    };
    if (options.groupCommit ?? true) {
      // A file database only ('' and ':memory:' have no WAL); the path made
      // absolute now, as SQLite opened it, whatever the working directory later.
      const file = options.path !== ':memory:' && options.path !== '';
      const durable = file && (options.synchronous ?? 'FULL') === 'FULL' && (options.backgroundSync ?? true);
      this.syncer = durable ? walSyncer(`${resolve(options.path)}-wal`) : null;
      const group = (this.group = new GroupCommit(this.db, { onBegin: begin, sync: this.syncer ?? undefined, lock: this.lock }));
      this.admitTx = (input) => group.run(() => this.admitIn(input));
      this.finishTx = (input) => group.run(() => this.finishIn(input));
      this.rejectTx = (input) => group.run(() => this.reject(input, this.txNow));
    } else {
      // One BEGIN IMMEDIATE transaction each (./write-lock.ts).
      const inTx = <I, O>(fn: (input: I) => O) => (input: I) => this.lock.transaction(() => (begin(), fn(input)));
      this.admitTx = inTx((input: AdmitInput) => this.admitIn(input));
      this.finishTx = inTx((input: FinishInput) => this.finishIn(input));
      this.rejectTx = inTx((input: RejectionInput) => this.reject(input, this.txNow));
    }
    this.audit = createSqliteAudit(this.db, this.lock);
  }

  // The audit methods (fence history, operator resolution) live in ./audit.ts.
  getFenceHistory: AuditStore['getFenceHistory'] = (entity, page) => this.audit.getFenceHistory(entity, page);
  listRecords: AuditStore['listRecords'] = (query) => this.audit.listRecords(query);
  resolveRecord: AuditStore['resolveRecord'] = (input) => this.audit.resolveRecord(input);
  listOperatorActions: AuditStore['listOperatorActions'] = (page) => this.audit.listOperatorActions(page);
  auditStats: AuditStore['auditStats'] = () => this.audit.auditStats();

  async admit(input: AdmitInput): Promise<Admission> {
    return this.admitTx(input);
  }

  async finish(input: FinishInput): Promise<FinishResult> {
    // Waiters are woken only once the finish is committed.
    const result = await this.finishTx(input);
    if (input.entity !== null) this.notifier.notify(entityTopic(input.entity));
    if (input.key !== null) this.notifier.notify(recordTopic(input.scope, input.key));
    return result;
  }

  async recordRejection(input: RejectionInput): Promise<void> {
    await this.rejectTx(input);
  }

  waitForChange(topic: string, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    return this.notifier.wait(topic, timeoutMs, signal);
  }

  /**
   * DESIGN §3.5 a–h, inside the immediate transaction: read the two rows the
   * decision touches, decide (../../core/admission.ts), write what changed.
   * Nothing else writes while this transaction holds the write lock, so the
   * rows written are the rows read (each write still checks it: ./admission-rows.ts).
   */
  private admitIn(input: AdmitInput): Admission {
    const now = this.txNow;
    const { scope, key, entity } = input;
    const state = this.rows.read(scope, key, entity);
    const d = decide(state, input, now);
    this.rows.apply(scope, key, entity, state, d.next);
    if (d.acceptedFence !== null) {
      // The entity's fence history: one row per accepted fence value (a no-op
      // when it stayed equal), with the caller and request id bounded as in
      // the rejection log (../bounds.ts), as the other stores write them.
      const text = boundRejectionText({ entity, idempotencyKey: key, audit: input.audit });
      this.q.fenceHistory.run({ entity, fence: d.acceptedFence, now, caller: text.caller, requestId: text.requestId });
    }
    if (d.rejection !== null) this.reject({ ...d.rejection, entity, idempotencyKey: key, audit: input.audit }, now);
    return d.admission;
  }

  /** DESIGN §3.7, inside the immediate transaction: read, `finish` (../../core/admission.ts), write. */
  private finishIn(input: FinishInput): FinishResult {
    const now = this.txNow;
    const state = this.rows.read(input.scope, input.key, input.entity);
    const f = finish(state, input, now);
    this.rows.apply(input.scope, input.key, input.entity, state, f.next);
    // Taken over by a newer owner (onUnknown: retry) or resolved by an
    // operator: this owner's outcome no longer decides anything.
    if (f.rejection !== null) this.reject({ ...f.rejection, entity: input.entity, idempotencyKey: input.key, audit: input.audit }, now);
    return { recorded: f.recorded };
  }

  async listRejections(query: RejectionQuery): Promise<RejectionPage> {
    const where: string[] = [];
    const params: Record<string, unknown> = { limit: query.limit + 1 };
    if (query.entity !== undefined) (where.push('entity = @entity'), (params.entity = query.entity));
    if (query.reason !== undefined) (where.push('reason = @reason'), (params.reason = query.reason));
    if (query.caller !== undefined) (where.push('caller = @caller'), (params.caller = query.caller));
    if (query.since !== undefined) (where.push('at >= @since'), (params.since = query.since.getTime()));
    if (query.until !== undefined) (where.push('at < @until'), (params.until = query.until.getTime()));
    if (query.cursor !== undefined) (where.push('id < @cursor'), (params.cursor = BigInt(query.cursor)));
    const sql = `SELECT * FROM rejections ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY id DESC LIMIT @limit`;
    const rows = this.db.prepare(sql).safeIntegers(true).all(params) as Record<string, unknown>[];
    const items = rows.slice(0, query.limit).map(toRejection);
    const more = rows.length > query.limit;
    return { items, nextCursor: more ? items[items.length - 1]!.id : null };
  }

  async getEntity(entity: string): Promise<EntityInfo | null> {
    const row = this.q.entityInfo.get({ entity }) as
      | { entity: string; fence: bigint | null; accepted_at: bigint; inflight_until: bigint | null; now: bigint }
      | undefined;
    if (row === undefined) return null;
    const live = row.inflight_until !== null && row.inflight_until > row.now;
    return {
      entity: row.entity,
      fence: row.fence === null ? null : row.fence.toString(),
      acceptedAt: new Date(Number(row.accepted_at)),
      inflight: live ? { until: new Date(Number(row.inflight_until)) } : null,
    };
  }

  async getRecords(key: string): Promise<RecordInfo[]> {
    return (this.q.recordsByKey.all(key) as Record<string, unknown>[]).map(toRecord);
  }

  /**
   * Batches (../sweep.ts), each one short write transaction: through the
   * group committer when it is on (a batch is one more decision of the next
   * group: no fsync on the event loop, and it waits for the lock the way
   * decisions do), else one `BEGIN IMMEDIATE` of its own. better-sqlite3 is
   * synchronous, so a batch blocks the event loop while it runs: each one
   * is kept short (`batch` rows) and the loop gets a turn between them.
   */
  async sweep(options: SweepOptions): Promise<SweepResult> {
    const { q } = this;
    const write = (fn: (now: number) => number): Promise<number> =>
      this.group !== null ? this.group.run(() => fn(this.txNow)) : this.lock.transaction(() => fn(this.now()));
    const count = (st: Statement, params: (now: number) => Record<string, number>) => async (cap: number) =>
      Number((st.get({ ...params(this.now()), cap }) as { n: number | bigint }).n);
    const step = (run: Statement, counter: Statement, params: (now: number) => Record<string, number>): SweepStep => ({
      run: (batch) => write((now) => run.run({ ...params(now), batch }).changes),
      count: count(counter, params),
    });
    const retention = (ms: number) => Math.max(0, Math.floor(ms));
    const steps: Partial<Record<keyof SweepResult['backlog'], SweepStep>> = {
      expiredRecords: step(q.sweepExpired, q.countExpired, (now) => ({ now })),
      unknownRecords: step(q.sweepLocked, q.countLocked, (now) => ({ now })),
      oldRejections: step(q.sweepRejections, q.countRejections, (now) => ({ before: now - retention(options.rejectionRetentionMs) })),
    };
    if (options.entityRetentionMs !== undefined) {
      const before = (now: number) => now - retention(options.entityRetentionMs!);
      steps.oldEntities = step(q.sweepEntities, q.countEntities, (now) => ({ now, before: before(now) }));
      steps.oldFenceHistory = step(q.sweepHistory, q.countHistory, (now) => ({ before: before(now) }));
    }
    if (options.operatorActionRetentionMs !== undefined) {
      const ms = retention(options.operatorActionRetentionMs);
      steps.oldOperatorActions = step(q.sweepActions, q.countActions, (now) => ({ before: now - ms }));
    }
    return sweepInBatches(steps, options, {
      yieldTurn: () => new Promise((resolve) => setImmediate(resolve)),
      stopped: () => this.closed,
    });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.group?.idle();
    this.syncer?.close();
    this.notifier.close();
    this.db.close();
  }

  private now(): number {
    return (this.q.now.get() as { now: number }).now;
  }

  /** Every rejection row of this store is written here, its text bounded (../bounds.ts). */
  private reject(r: RejectionInput, now: number): void {
    const text = boundRejectionText(r);
    this.q.insertRejection.run({
      at: now,
      reason: r.reason,
      entity: text.entity,
      presented: r.presentedFence,
      current: r.currentFence,
      key: text.idempotencyKey,
      caller: text.caller,
      method: text.method,
      path: text.path,
      sha: text.payloadSha256,
      requestId: text.requestId,
      clientRequestId: text.clientRequestId,
      detail: text.detail,
    });
  }
}

/** Every statement of the hot path, prepared once. Named parameters: see each. */
function prepare(db: SqliteDatabase) {
  const s = (sql: string, safe = false): Statement => {
    const st = db.prepare(sql);
    return safe ? st.safeIntegers(true) : st;
  };
  return {
    now: s(`SELECT ${NOW_MS} AS now`),
    entityInfo: s(`SELECT entity, fence, accepted_at, inflight_until, ${NOW_MS} AS now FROM fence_entities WHERE entity = @entity`, true),
    insertRejection: s(`INSERT INTO rejections
      (at, reason, entity, presented_fence, current_fence, idempotency_key, caller, method, path, payload_sha256, request_id, client_request_id, detail)
      VALUES (@at, @reason, @entity, @presented, @current, @key, @caller, @method, @path, @sha, @requestId, @clientRequestId, @detail)`),
    // @entity @fence @now @caller @requestId — fences only rise, so (entity, fence) is one rise.
    fenceHistory: s(`INSERT INTO fence_history (entity, fence, at, caller, request_id) VALUES (@entity, @fence, @now, @caller, @requestId)
      ON CONFLICT (entity, fence) DO NOTHING`),
    recordsByKey: s(`SELECT scope, key, state, fingerprint, entity, fence, status, locked_until, created_at, expires_at
      FROM idempotency_records WHERE key = ? ORDER BY scope`, true),
    sweepExpired: s(`DELETE FROM idempotency_records WHERE rowid IN (
      SELECT rowid FROM idempotency_records WHERE state = 'completed' AND expires_at <= @now LIMIT @batch)`),
    sweepLocked: s(`UPDATE idempotency_records SET state = 'outcome_unknown', locked_until = NULL WHERE rowid IN (
      SELECT rowid FROM idempotency_records WHERE state = 'in_progress' AND locked_until <= @now LIMIT @batch)`),
    // The sweeps name no ORDER BY: which rows past retention go first does
    // not matter, and with `ORDER BY id` SQLite walks the table by id, so the
    // last (short) batch of every sweep read every row; without it each batch
    // reads the index range of the rows it deletes (EXPLAIN QUERY PLAN).
    sweepRejections: s(`DELETE FROM rejections WHERE id IN (
      SELECT id FROM rejections WHERE at < @before LIMIT @batch)`),
    // @now @before @batch — entities whose last accepted fence is older than
    // entityRetention, unless a request holds their serial slot (README: the
    // safety condition of entityRetention). Index fence_entities_accepted (0006).
    sweepEntities: s(`DELETE FROM fence_entities WHERE entity IN (
      SELECT entity FROM fence_entities WHERE accepted_at < @before
        AND (inflight_owner IS NULL OR inflight_until <= @now) LIMIT @batch)`),
    // @before @batch — index fence_history_at (0006).
    sweepHistory: s(`DELETE FROM fence_history WHERE (entity, fence) IN (
      SELECT entity, fence FROM fence_history WHERE at < @before LIMIT @batch)`),
    // @before @batch — index operator_actions_at (0006).
    sweepActions: s(`DELETE FROM operator_actions WHERE id IN (
      SELECT id FROM operator_actions WHERE at < @before LIMIT @batch)`),
    // The backlog: what the statements above would still find, counted up to @cap.
    countExpired: s(`SELECT count(*) AS n FROM (SELECT 1 FROM idempotency_records WHERE state = 'completed' AND expires_at <= @now LIMIT @cap)`),
    countLocked: s(`SELECT count(*) AS n FROM (SELECT 1 FROM idempotency_records WHERE state = 'in_progress' AND locked_until <= @now LIMIT @cap)`),
    countRejections: s('SELECT count(*) AS n FROM (SELECT 1 FROM rejections WHERE at < @before LIMIT @cap)'),
    countEntities: s(`SELECT count(*) AS n FROM (SELECT 1 FROM fence_entities WHERE accepted_at < @before
      AND (inflight_owner IS NULL OR inflight_until <= @now) LIMIT @cap)`),
    countHistory: s('SELECT count(*) AS n FROM (SELECT 1 FROM fence_history WHERE at < @before LIMIT @cap)'),
    countActions: s('SELECT count(*) AS n FROM (SELECT 1 FROM operator_actions WHERE at < @before LIMIT @cap)'),
  };
}
