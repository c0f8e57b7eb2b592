import type pg from 'pg';
import type {
  Admission,
  AdmitInput,
  AttemptRef,
  AuditStore,
  CommandInput,
  CommandPage,
  CommandQuery,
  EntityInfo,
  ExtendLockInput,
  FinishInput,
  FinishResult,
  UnsentRelease,
  GatewayStore,
  RecordInfo,
  ReconcileNote,
  RejectionInput,
  RejectionPage,
  RejectionQuery,
  StoredResponse,
  SweepOptions,
  SweepResult,
} from '../types.js';
import { createAdmit } from './admit.js';
import { createRelease } from './release.js';
import { createPostgresAudit } from './audit.js';
import { createExtend } from './extend.js';
import { createFinish } from './finish.js';
import { RoundTripHealth } from './health.js';
import { poolQuery, qualifier, type PgContext } from './query.js';
import { createReads } from './reads.js';
import { createRejectionLog } from './rejections.js';
import { createCommandLog } from './commands.js';
import { createSweep } from './retention.js';
import type { PoolLike } from './types.js';
import { PgWakeups } from './wakeups.js';
import { ReplicationCheck } from './replication-check.js';

// Imported from here by ./index.ts; their homes are ./wakeups.ts and ./options.ts.
export { DEFAULT_POLL_MS_LISTENING, DEFAULT_POLL_MS_POLLING } from './wakeups.js';
export type { PgStoreNotice, PostgresStoreOptions } from './options.js';
import type { PgStoreNotice } from './options.js';

/**
 * The PostgreSQL gateway store, for several gateway replicas on one
 * database. Every decision is one call of a function whose current
 * definition is in ./sql (fencegate_admit in admit.sql, fencegate_finish in
 * finish.sql), in one statement: alone, or with the decisions that arrived
 * meanwhile in a group statement (group_admit.sql, group_finish.sql), each
 * in its own subtransaction; so a decision is all or nothing, and a
 * dropped connection rolls a statement back whole. Semantics are the SQLite store's,
 * held to it by test/store/conformance.ts.
 *
 * This class only wires the parts together: the admission (./admit.ts), the
 * finish (./finish.ts), the rejection log (./rejections.ts), the point reads
 * (./reads.ts), the audit half (./audit.ts), the sweep (./retention.ts) and
 * the waiters (./wakeups.ts), each over one query function (./query.ts).
 *
 * Text that PostgreSQL cannot hold (U+0000, e.g. in `route\0caller` scopes)
 * is escaped on the way in and decoded on the way out (./text.ts), so the
 * raw columns of such rows, fence_history.caller included, hold the escaped
 * form.
 *
 * Faults throw (the gateway answers 503 store-unavailable); the pool drops
 * broken connections and opens new ones, so the store recovers by itself
 * after `pg_terminate_backend` or a server restart. An admission is never
 * retried inside the store: a commit whose acknowledgement was lost would
 * otherwise meet its own record and answer `idempotency-in-progress`.
 */
export class PostgresGatewayStore implements GatewayStore {
  readonly kind = 'postgres';
  readonly pool: PoolLike;
  /** The NOTIFY channel of this schema (all replicas on the schema share it). */
  readonly channel: string;
  private readonly ownsPool: boolean;
  private readonly wakeups: PgWakeups;
  private readonly admission: ReturnType<typeof createAdmit>;
  /** Undoes what a failed admission may have committed (./release.ts). */
  readonly unsent: ReturnType<typeof createRelease>;
  private readonly finishing: ReturnType<typeof createFinish>;
  private readonly rejections: ReturnType<typeof createRejectionLog>;
  private readonly commands: ReturnType<typeof createCommandLog>;
  private readonly reads: ReturnType<typeof createReads>;
  private readonly extend: ReturnType<typeof createExtend>;
  private readonly sweeper: ReturnType<typeof createSweep>;
  private readonly audit: AuditStore;
  /** Whether a failover would keep acknowledged decisions (./replication-check.ts); null when switched off. */
  readonly replication: ReplicationCheck | null;
  private readonly notices: PgStoreNotice[];
  private readonly health: RoundTripHealth;
  private closing: Promise<void> | null = null;
  /** Set by close() once the finish group is idle: from then on finishes are refused too. */
  private refusing = false;

  /** Use `createPostgresStore`, which migrates and starts the listener. */
  constructor(init: {
    pool: PoolLike;
    ownsPool: boolean;
    /** Schema to qualify table names with, or null for the search_path. */
    schema: string | null;
    /** The schema the tables live in, for the channel name. */
    resolvedSchema: string;
    makeListenClient: (() => pg.Client) | null;
    pollMs?: number;
    /** Said once to whoever subscribes (./pool.ts openPool). */
    notices?: PgStoreNotice[];
    /** `false`: no replication check. Default 60000. */
    replicationCheckMs?: number | false;
    onError?: (err: Error, source: 'pool' | 'listener') => void;
    onHealth?: (healthy: boolean, err: Error | null) => void;
  }) {
    this.pool = init.pool;
    this.ownsPool = init.ownsPool;
    const onError = init.onError ?? (() => {});
    this.wakeups = new PgWakeups({
      resolvedSchema: init.resolvedSchema,
      makeListenClient: init.makeListenClient,
      pollMs: init.pollMs,
      onError: (err) => onError(err, 'listener'),
    });
    this.channel = this.wakeups.channel;
    this.health = new RoundTripHealth(init.onHealth);
    const ctx: PgContext = { query: poolQuery(this.pool, () => this.closing !== null, this.health), table: qualifier(init.schema) };
    this.admission = createAdmit(ctx);
    this.unsent = createRelease(ctx, this.wakeups, () => this.closing !== null);
    // Finishes are refused only once close() drained their group: a finish
    // settles a request that was admitted before (DESIGN §3.7).
    this.finishing = createFinish({ ...ctx, query: poolQuery(this.pool, () => this.refusing, this.health) }, this.wakeups);
    this.rejections = createRejectionLog(ctx);
    this.commands = createCommandLog(ctx);
    this.reads = createReads(ctx);
    this.extend = createExtend(ctx);
    this.sweeper = createSweep(ctx, () => this.closing !== null);
    this.audit = createPostgresAudit(ctx);
    this.notices = init.notices ?? [];
    this.replication = init.replicationCheckMs === false ? null : new ReplicationCheck(this.pool, init.replicationCheckMs ?? 60_000);
  }

  // The audit methods (fence history, operator resolution) live in ./audit.ts.
  getFenceHistory: AuditStore['getFenceHistory'] = (entity, page) => this.audit.getFenceHistory(entity, page);
  listRecords: AuditStore['listRecords'] = (query) => this.audit.listRecords(query);
  resolveRecord: AuditStore['resolveRecord'] = (input) => this.audit.resolveRecord(input);
  listOperatorActions: AuditStore['listOperatorActions'] = (page) => this.audit.listOperatorActions(page);
  auditStats: AuditStore['auditStats'] = () => this.audit.auditStats();

  /** Starts the listener (resolves even if it could not connect yet: it retries) and the replication check (its first reading never fails the start). */
  async start(): Promise<void> {
    await Promise.all([this.wakeups.start(), this.replication?.start()]);
  }

  /**
   * What the gateway's log should say about this store: its start-up notices
   * (./pool.ts) at once, then the replication check's lines (at once if it
   * has one, and on each change). Returns the unsubscribe.
   */
  subscribe(fn: (notice: PgStoreNotice) => void): () => void {
    for (const n of this.notices) fn(n);
    return this.replication?.subscribe(fn) ?? (() => {});
  }

  /**
   * False once a round trip went unanswered (past `queryTimeoutMs`, a lost
   * or refused connection), true again after the next answered one: the
   * admin API's `/health` reports it (`store`), docs/deploy-postgres.md.
   */
  get healthy(): boolean {
    return this.health.healthy;
  }

  /** True when cross-replica wake-ups are live (for health checks and tests). */
  get listening(): boolean {
    return this.wakeups.listening;
  }

  admit(input: AdmitInput): Promise<Admission> {
    // A failed admission is answered 503 and never forwarded, but it may
    // have committed before its answer was lost: release what it may hold
    // (not once the store is closing: its statements are refused then).
    return this.admission(input).catch((err: unknown) => {
      if (this.closing === null) this.unsent.release(input, err);
      throw err;
    });
  }

  finish(input: FinishInput): Promise<FinishResult> {
    return this.finishing(input);
  }

  /** One release of a lost admission now (GatewayStore.releaseUnsent); the background one after a failed admit() is ./release.ts. */
  releaseUnsent(input: AdmitInput): Promise<UnsentRelease> {
    return this.unsent.once(input);
  }

  extendLock(input: ExtendLockInput): Promise<boolean> {
    return this.extend(input);
  }

  getInterim(input: AttemptRef): Promise<StoredResponse | null> {
    return this.reads.getInterim(input);
  }

  noteReconcile(input: AttemptRef & { result: ReconcileNote }): Promise<void> {
    return this.reads.noteReconcile(input);
  }

  recordRejection(r: RejectionInput): Promise<void> {
    return this.rejections.record(r);
  }

  recordCommand(c: CommandInput): Promise<void> {
    return this.commands.record(c);
  }

  listCommands(query: CommandQuery): Promise<CommandPage> {
    return this.commands.list(query);
  }

  waitForChange(topic: string, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    return this.wakeups.wait(topic, timeoutMs, signal);
  }

  listRejections(query: RejectionQuery): Promise<RejectionPage> {
    return this.rejections.list(query);
  }

  getEntity(entity: string): Promise<EntityInfo | null> {
    return this.reads.getEntity(entity);
  }

  getRecords(key: string): Promise<RecordInfo[]> {
    return this.reads.getRecords(key);
  }

  /** Batches of one statement each, rows taken `FOR UPDATE SKIP LOCKED` (./retention.ts). */
  sweep(options: SweepOptions): Promise<SweepResult> {
    return this.sweeper(options);
  }

  /** Each admission or finish statement's size; no sync time (the COMMIT is inside the statement). */
  observeGroups(observer: (size: number, syncMs: number | null) => void): void {
    this.admission.group.observer = (size) => observer(size, null);
    this.finishing.group.observer = (size) => observer(size, null);
  }

  /**
   * Idempotent: refuses new admissions and reads at once (an admission still
   * queued in its group is refused when the group goes out: nothing of it is
   * written), waits for the admission group's round trip out and the
   * admissions it left to run alone to be answered, lets the finishes
   * already queued in their group go out and be answered (as the SQLite
   * store drains its group) before refusing finishes too, then wakes every
   * waiter, stops the listener, ends the pool if the store opened it.
   */
  close(): Promise<void> {
    this.closing ??= (async () => {
      await this.admission.group.idle();
      await this.finishing.group.idle();
      this.refusing = true;
      this.replication?.close();
      await this.wakeups.close();
      if (this.ownsPool) await this.pool.end();
    })();
    return this.closing;
  }
}
