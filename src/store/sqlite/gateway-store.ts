import { resolve } from 'node:path';
import type { Statement } from 'better-sqlite3';
import { AuditDelegate } from '../audit-delegate.js';
import { LocalNotifier } from '../notifier.js';
import {
  entityTopic,
  recordTopic,
  type Admission,
  type AdmitInput,
  type AttemptRef,
  type AuditStore,
  type ExtendLockInput,
  type CommandInput,
  type CommandQuery,
  type FinishInput,
  type FinishResult,
  type GatewayStore,
  type RejectionInput,
  type RejectionQuery,
  type ReconcileNote,
  type StoredResponse,
  type SweepKind,
  type SweepOptions,
  type UnsentRelease,
} from '../types.js';
import { createSqliteAudit } from './audit.js';
import { GroupCommit } from './group-commit.js';
import { Checkpointer, type CheckpointOptions } from './checkpoint.js';
import { walSyncer } from './wal-sync.js';
import { WriteLock } from './write-lock.js';
import { migrateSqlite } from './migrate.js';
import { openSqlite, type OpenSqliteOptions, type SqliteDatabase } from '../../db/sqlite-open.js';
import { toEntity, toPage, toRecord, toRejection, toStoredResponse } from '../sqlite-dialect/rows.js';
import {
  ENTITY_INFO,
  insertFenceHistory,
  insertRejection,
  interimOf,
  noteReconcile,
  NOW_MS,
  RECORDS_BY_KEY,
  rejectionParams,
  rejectionsPage,
  SQLITE,
  sweepStatements,
} from '../sqlite-dialect/statements.js';
import { decide, extendLock, finish, releaseUnsent } from '../../core/admission.js';
import { admissionRows, type AdmissionRows } from './admission-rows.js';
import { sweepInBatches, sweepSteps } from '../sweep.js';
import { finishedOutcome } from '../commands.js';
import { boundAuditIds } from '../bounds.js';
import { commandsPage, commandValues, INSERT_COMMAND_POSITIONAL, toCommand } from '../sqlite-dialect/commands.js';

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
   * group is on disk (./wal-sync.ts). Default true.
   */
  backgroundSync?: boolean;
  /**
   * How much of the wait for another process's write lock (`busyTimeoutMs`
   * in all) SQLite may spend inside one call, sleeping the thread and so the
   * event loop; the rest is waited between attempts with the loop free
   * (./write-lock.ts). Default 5 ms.
   */
  blockingWaitMs?: number;
  /** WAL checkpoints from a worker thread instead of inside a COMMIT on the event loop (./checkpoint.ts). Default true for a file; false keeps SQLite's `wal_autocheckpoint`. */
  backgroundCheckpoint?: boolean | CheckpointOptions;
}

/**
 * The embedded default store: one SQLite file in WAL mode. Every decision is
 * one `BEGIN IMMEDIATE` transaction, so several gateway processes on the same
 * file serialise on SQLite's write lock and keep every guarantee.
 *
 * better-sqlite3 is synchronous; the async interface is kept so that the
 * gateway treats every backend alike.
 */
export class SqliteGatewayStore extends AuditDelegate implements GatewayStore {
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
  private readonly commandTx: (input: CommandInput) => void | Promise<void>;
  private readonly releaseTx: (input: AdmitInput) => UnsentRelease | Promise<UnsentRelease>;
  private readonly extendTx: (input: ExtendLockInput) => boolean | Promise<boolean>;
  /** The database clock (ms) read at the start of the current write transaction. */
  private txNow = 0;
  /** The group committer, when `groupCommit` is on. */
  group: GroupCommit | null = null;
  /** The WAL's background sync, when `backgroundSync` is on. */
  readonly syncer: ReturnType<typeof walSyncer> | null = null;
  /** The audit methods' half (./audit.ts). */
  protected readonly audit: AuditStore;
  /** Every write transaction begins here: waits for another process's lock leave the event loop free. */
  readonly lock: WriteLock;
  /** The WAL's background checkpointer (./checkpoint.ts), for a file database. */
  readonly checkpointer: Checkpointer | null = null;

  constructor(options: SqliteStoreOptions) {
    super();
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
      this.commandTx = (input) => group.run(() => this.logCommand(input, input.outcome, this.txNow));
      this.releaseTx = (input) => group.run(() => this.releaseIn(input));
      this.extendTx = (input) => group.run(() => this.extendIn(input));
    } else {
      // One BEGIN IMMEDIATE transaction each (./write-lock.ts).
      const inTx =
        <I, O>(fn: (input: I) => O) =>
        (input: I) =>
          this.lock.transaction(() => (begin(), fn(input)));
      this.admitTx = inTx((input: AdmitInput) => this.admitIn(input));
      this.finishTx = inTx((input: FinishInput) => this.finishIn(input));
      this.rejectTx = inTx((input: RejectionInput) => this.reject(input, this.txNow));
      this.commandTx = inTx((input: CommandInput) => this.logCommand(input, input.outcome, this.txNow));
      this.releaseTx = inTx((input: AdmitInput) => this.releaseIn(input));
      this.extendTx = inTx((input: ExtendLockInput) => this.extendIn(input));
    }
    this.audit = createSqliteAudit(this.db, this.lock);
    const ckpt = options.backgroundCheckpoint ?? true;
    if (ckpt !== false && options.path !== ':memory:' && options.path !== '') {
      this.checkpointer = new Checkpointer(
        this.db,
        resolve(options.path),
        options.synchronous ?? 'FULL',
        this.group && (() => this.group!.hold()),
        ckpt === true ? {} : ckpt,
      );
    }
  }

  async admit(input: AdmitInput) {
    return this.admitTx(input);
  }

  async finish(input: FinishInput) {
    // Waiters are woken only once the finish is committed.
    const result = await this.finishTx(input);
    if (input.entity !== null) this.notifier.notify(entityTopic(input.entity));
    if (input.key !== null) this.notifier.notify(recordTopic(input.scope, input.key));
    return result;
  }

  /**
   * DESIGN §8.2, the release of an admission whose answer was lost. This
   * store's answers are not lost (the decision runs in this process, and a
   * failed WAL sync stops the store), so the gateway never calls it here; it
   * applies the same rule as PostgreSQL's fencegate_release_unsent, and the
   * admission conformance property holds both to it.
   */
  async releaseUnsent(input: AdmitInput): Promise<UnsentRelease> {
    const result = await this.releaseTx(input);
    if (result.slot && input.entity !== null) this.notifier.notify(entityTopic(input.entity));
    if (result.record && input.key !== null) this.notifier.notify(recordTopic(input.scope, input.key));
    return result;
  }

  async extendLock(input: ExtendLockInput): Promise<boolean> {
    return this.extendTx(input);
  }

  async getInterim(input: AttemptRef): Promise<StoredResponse | null> {
    const row = this.q.interimOf.get({ scope: input.scope, key: input.key, created_at: BigInt(input.createdAt.getTime()) }) as
      | Record<string, unknown>
      | undefined;
    return row === undefined ? null : toStoredResponse(row);
  }

  async noteReconcile(input: AttemptRef & { result: ReconcileNote }): Promise<void> {
    const params = { scope: input.scope, key: input.key, created_at: BigInt(input.createdAt.getTime()), result: input.result };
    const run = () => void this.q.noteReconcile.run(params);
    await (this.group !== null ? this.group.run(run) : this.lock.transaction(run));
  }

  async recordRejection(input: RejectionInput): Promise<void> {
    await this.rejectTx(input);
  }

  async recordCommand(input: CommandInput): Promise<void> {
    await this.commandTx(input);
  }

  async listCommands(query: CommandQuery) {
    const { sql, params } = commandsPage(SQLITE, query);
    if (query.cursor !== undefined) params.cursor = BigInt(query.cursor);
    return toPage(this.db.prepare(sql).safeIntegers(true).all(params) as Record<string, unknown>[], query.limit, toCommand);
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
      // the rejection log (../bounds.ts boundAuditIds), as the other stores write them.
      const { caller, requestId } = boundAuditIds(input.audit);
      this.q.fenceHistory.run(entity, d.acceptedFence, now, caller, requestId);
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
    // The command log's row of this outcome, in the same transaction (DESIGN §4.1 `commands`).
    if (input.command !== undefined) this.logCommand(input.command, finishedOutcome(input.command.outcome, f.recorded), now);
    return { recorded: f.recorded };
  }

  /** `releaseUnsent` (../../core/admission.ts) inside the immediate transaction: read, release, write. Nothing is logged. */
  private releaseIn(input: AdmitInput): UnsentRelease {
    const state = this.rows.read(input.scope, input.key, input.entity);
    const r = releaseUnsent(state, input);
    this.rows.apply(input.scope, input.key, input.entity, state, r.next);
    return { slot: r.slot, record: r.record };
  }

  /** `extendLock` (../../core/admission.ts) inside the immediate transaction: read, extend, write. */
  private extendIn(input: ExtendLockInput): boolean {
    const entity = input.entity ?? null;
    const state = this.rows.read(input.scope, input.key, entity);
    const x = extendLock(state, input, this.txNow);
    this.rows.apply(input.scope, input.key, entity, state, x.next);
    return x.extended;
  }

  async listRejections(query: RejectionQuery) {
    const { sql, params } = rejectionsPage(SQLITE, query);
    if (query.cursor !== undefined) params.cursor = BigInt(query.cursor);
    return toPage(this.db.prepare(sql).safeIntegers(true).all(params) as Record<string, unknown>[], query.limit, toRejection);
  }

  async getEntity(entity: string) {
    const row = this.q.entityInfo.get({ entity }) as Record<string, unknown> | undefined;
    return row === undefined ? null : toEntity(row);
  }

  async getRecords(key: string) {
    return (this.q.recordsByKey.all({ key }) as Record<string, unknown>[]).map(toRecord);
  }

  /**
   * Batches (../sweep.ts), each one short write transaction: through the
   * group committer when it is on (a batch is one more decision of the next
   * group: no fsync on the event loop, and it waits for the lock the way
   * decisions do), else one `BEGIN IMMEDIATE` of its own. better-sqlite3 is
   * synchronous, so a batch blocks the event loop while it runs: each one
   * is kept short (`batch` rows) and the loop gets a turn between them.
   */
  async sweep(options: SweepOptions) {
    const write = (fn: (now: number) => number): Promise<number> =>
      this.group !== null ? this.group.run(() => fn(this.txNow)) : this.lock.transaction(() => fn(this.now()));
    const steps = sweepSteps(options, (kind, retention_ms) => {
      const { run, count } = this.q.sweep[kind];
      return {
        run: (batch) => write((now) => run.run({ now, retention_ms, batch }).changes),
        count: async (cap) => Number((count.get({ now: this.now(), retention_ms, cap }) as { n: number | bigint }).n),
      };
    });
    return sweepInBatches(steps, options, {
      yieldTurn: () => new Promise((resolve) => setImmediate(resolve)),
      stopped: () => this.closed,
    });
  }

  observeGroups(observer: (size: number, syncMs: number | null) => void): void {
    if (this.group !== null) this.group.observer = observer;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.group?.idle();
    await this.checkpointer?.close();
    this.syncer?.close();
    this.notifier.close();
    this.db.close();
  }

  private now(): number {
    return (this.q.now.get() as { now: number }).now;
  }

  /** Every command-log row of this store is written here, its text bounded (../commands.ts). */
  private logCommand(c: CommandInput, outcome: CommandInput['outcome'], now: number): void {
    this.q.insertCommand.run(commandValues(c, outcome, now));
  }

  /** Every rejection row of this store is written here, its text bounded (../bounds.ts). */
  private reject(r: RejectionInput, now: number): void {
    this.q.insertRejection.run({ now, reason: r.reason, presented: r.presentedFence, current: r.currentFence, ...rejectionParams(r) });
  }
}

/** Every statement of the hot path, prepared once; their text and parameters: ../sqlite-dialect/statements.ts. */
function prepare(db: SqliteDatabase) {
  const s = (sql: string, safe = false): Statement => {
    const st = db.prepare(sql);
    return safe ? st.safeIntegers(true) : st;
  };
  const sweep = Object.entries(sweepStatements(SQLITE)).map(([kind, st]) => [kind, { run: s(st.run), count: s(st.count) }]);
  return {
    now: s(`SELECT ${NOW_MS} AS now`),
    entityInfo: s(ENTITY_INFO, true),
    insertRejection: s(insertRejection(SQLITE)),
    insertCommand: s(INSERT_COMMAND_POSITIONAL),
    // @entity @fence @now @caller @request_id
    // entity, fence, now, caller, request id: positional (bound faster than named; ./admission-rows.ts).
    fenceHistory: s(insertFenceHistory('VALUES (?, ?, ?, ?, ?)')),
    recordsByKey: s(RECORDS_BY_KEY, true),
    interimOf: s(interimOf(SQLITE)),
    noteReconcile: s(noteReconcile(SQLITE)),
    sweep: Object.fromEntries(sweep) as Record<SweepKind, { run: Statement; count: Statement }>,
  };
}
