import { AuditDelegate } from '../audit-delegate.js';
import { LocalNotifier } from '../notifier.js';
import type {
  AdmitInput,
  AttemptRef,
  AuditStore,
  ExtendLockInput,
  CommandInput,
  CommandQuery,
  FinishInput,
  GatewayStore,
  RejectionInput,
  ReconcileNote,
  RejectionQuery,
  StoredResponse,
  SweepOptions,
} from '../types.js';
import { createD1Audit } from './audit.js';
import { admissionBatch, toAdmission, type DecisionRow } from './admission.js';
import { d1Binder, type D1Bind, type D1DatabaseLike } from './binding.js';
import { extendBatch, finishBatch } from './finish.js';
import { toEntity, toPage, toRecord, toRejection, toStoredResponse } from '../sqlite-dialect/rows.js';
import {
  D1,
  ENTITY_INFO,
  insertRejection,
  interimOf,
  noteReconcile,
  RECORDS_BY_KEY,
  rejectionParams,
  rejectionsPage,
  sweepStatements,
} from '../sqlite-dialect/statements.js';
import { sweepInBatches, sweepSteps } from '../sweep.js';
import { commandParams, commandsPage, insertCommand, toCommand } from '../sqlite-dialect/commands.js';

export type { D1DatabaseLike, D1PreparedStatementLike, D1ResultLike } from './binding.js';

export interface D1StoreOptions {
  /** The D1 binding, e.g. `env.DB`, migrated with `migrations/gateway/sqlite`. */
  db: D1DatabaseLike;
  /**
   * How often a waiter (serial slot, `Prefer: wait`) re-runs the admission.
   * Default 100 ms. Each poll is one D1 batch, so lower costs more queries.
   * Every wait is a poll: a finish wakes no waiter early (`waitForChange`).
   * The interval grows with the time a request has waited, up to 1 s (or `pollMs` if longer).
   */
  pollMs?: number;
  /**
   * Most polls one request makes, all its waits together (default 40): D1
   * allows 50 queries per Worker invocation on the Free plan (1000 on
   * Paid), and past them every query of the request fails, its finish
   * included, after the upstream call. The polls of a long wait are spread
   * over it so that the last comes at its end.
   */
  maxPolls?: number;
}

/** The longest interval between two polls of one request, however long it has waited (unless `maxPolls` spreads them wider). */
const MAX_POLL_INTERVAL_MS = 1000;

const SWEEP = sweepStatements(D1);
const INSERT_REJECTION = insertRejection(D1);
const INTERIM_OF = interimOf(D1);
const INSERT_COMMAND = insertCommand(D1);
const NOTE_RECONCILE = noteReconcile(D1);

/**
 * The gateway store on Cloudflare D1 (`fencegate/d1`): every decision is one
 * `batch()`, one SQLite transaction on the database's primary, serialisable
 * against every other batch from every isolate and colo (why, and why not a
 * Durable Object: docs/design.md §8.3). The admission program:
 * ./admission.ts; the finish: ./finish.ts; the audit methods: ./audit.ts
 * (`resolveRecord` is one batch whose every write is conditional on
 * `state = 'outcome_unknown'`); the statements shared with the SQLite store:
 * ../sqlite-dialect/.
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
 * - `waitForChange` only polls (`pollInterval`), on a timer of the waiting
 *   request's own: isolates share no memory, so a finish in another isolate
 *   cannot wake a waiter, and a finish in this isolate must not (see
 *   `waitForChange`). The gateway re-runs the admission after every
 *   wake-up, so a late one costs latency and D1 reads, never safety.
 */
export class D1GatewayStore extends AuditDelegate implements GatewayStore {
  readonly kind = 'd1';
  readonly db: D1DatabaseLike;
  /** Only its timers: nothing calls `notify` (see `waitForChange`). */
  private readonly notifier: LocalNotifier;
  private readonly pollMs: number;
  private readonly maxPolls: number;
  /** Per request (its AbortSignal), when it first polled and how often: no promise, nothing another request could resolve. */
  private readonly waits = new WeakMap<AbortSignal, { since: number; polls: number }>();
  /** Binds `@name` parameters to statements prepared once per store (./binding.ts). */
  private readonly st: D1Bind;
  /** The audit methods' half (./audit.ts). */
  protected readonly audit: AuditStore;
  private closed = false;

  constructor(options: D1StoreOptions) {
    super();
    this.db = options.db;
    this.pollMs = options.pollMs ?? 100;
    this.maxPolls = options.maxPolls ?? 40;
    // Its timers only, each as long as `pollInterval` says.
    this.notifier = new LocalNotifier(Number.POSITIVE_INFINITY);
    this.st = d1Binder(this.db);
    this.audit = createD1Audit(this.db);
  }

  async admit(input: AdmitInput) {
    const { steps, decisionAt } = admissionBatch(this.st, input, crypto.randomUUID());
    const results = await this.db.batch(steps);
    const row = results[decisionAt]?.results?.[0] as DecisionRow | undefined;
    if (row === undefined) throw new Error('d1 admission batch returned no decision row');
    return toAdmission(row);
  }

  async finish(input: FinishInput): Promise<{ recorded: boolean }> {
    try {
      return await this.finishOnce(input);
    } catch (err) {
      // A database the Worker reached before `wrangler d1 migrations apply`
      // created the command log (0011): the batch rolled back whole, so the
      // finish goes again without its row rather than fail (a failed finish
      // leaves its record to become outcome_unknown although the upstream answered).
      if (input.command === undefined || !/no such table: commands/.test(String((err as Error)?.message))) throw err;
      return this.finishOnce({ ...input, command: undefined });
    }
  }

  private async finishOnce(input: FinishInput) {
    const { steps, recordedAt } = finishBatch(this.st, input);
    let recorded = true;
    if (steps.length > 0) {
      const results = await this.db.batch(steps);
      if (recordedAt !== null) recorded = results[recordedAt]?.meta?.changes === 1;
    }
    return { recorded };
  }

  async extendLock(input: ExtendLockInput): Promise<boolean> {
    const { steps, answerAt } = extendBatch(this.st, input);
    if (answerAt === null) return false;
    const results = await this.db.batch(steps);
    return results[answerAt]?.meta?.changes === 1;
  }

  async getInterim(input: AttemptRef): Promise<StoredResponse | null> {
    const row = ((await this.st(INTERIM_OF, { scope: input.scope, key: input.key, created_at: input.createdAt.getTime() }).all()).results ?? [])[0];
    return row === undefined ? null : toStoredResponse(row);
  }

  async noteReconcile(input: AttemptRef & { result: ReconcileNote }): Promise<void> {
    await this.st(NOTE_RECONCILE, { scope: input.scope, key: input.key, created_at: input.createdAt.getTime(), result: input.result }).run();
  }

  async recordRejection(input: RejectionInput): Promise<void> {
    await this.st(INSERT_REJECTION, { reason: input.reason, presented: input.presentedFence, current: input.currentFence, ...rejectionParams(input) }).run();
  }

  async recordCommand(input: CommandInput): Promise<void> {
    await this.st(INSERT_COMMAND, commandParams(input)).run();
  }

  async listCommands(query: CommandQuery) {
    const { sql, params } = commandsPage(D1, query);
    return toPage((await this.st(sql, params).all()).results ?? [], query.limit, toCommand);
  }

  /**
   * One poll interval (or less: `timeoutMs`, an abort), whatever the topic.
   * A finish does not wake the waiters of this isolate, on purpose: it runs
   * in another request, and a promise that request resolves is no pending
   * I/O of the waiting one. workerd cancels a request whose pending work
   * all belongs to other requests as hung (a 500 "your Worker's code had
   * hung" the gateway never wrote; seen under `wrangler dev --local` with
   * waiters on one serial entity, test/workers/wrangler-dev.test.ts). The
   * timer set here belongs to the waiting request, and the runtime counts
   * it as pending (DESIGN §8.3).
   */
  waitForChange(topic: string, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    return this.notifier.wait(topic, this.pollInterval(timeoutMs, signal), signal);
  }

  /**
   * How long this poll of the request behind `signal` sleeps: `pollMs`, then
   * a quarter of the time it has waited, at most MAX_POLL_INTERVAL_MS, and
   * at least its `timeoutMs` shared among the polls `maxPolls` leaves it;
   * its last poll sleeps the whole `timeoutMs`. Each poll is one admission
   * batch, so a request makes at most `maxPolls` + 1 of them, however long
   * its `Prefer: wait` or `serialWaitMs`, and a waiter that has waited
   * seconds polls once a second, not ten times.
   */
  private pollInterval(timeoutMs: number, signal: AbortSignal | undefined): number {
    if (signal === undefined) return Math.min(timeoutMs, this.pollMs);
    let wait = this.waits.get(signal);
    if (wait === undefined) this.waits.set(signal, (wait = { since: Date.now(), polls: 0 }));
    const left = this.maxPolls - ++wait.polls;
    if (left <= 0) return timeoutMs;
    const grown = Math.max(this.pollMs, Math.min(MAX_POLL_INTERVAL_MS, (Date.now() - wait.since) / 4));
    return Math.min(timeoutMs, Math.max(grown, timeoutMs / (left + 1)));
  }

  async listRejections(query: RejectionQuery) {
    const { sql, params } = rejectionsPage(D1, query);
    return toPage((await this.st(sql, params).all()).results ?? [], query.limit, toRejection);
  }

  async getEntity(entity: string) {
    const row = ((await this.st(ENTITY_INFO, { entity }).all()).results ?? [])[0];
    return row === undefined ? null : toEntity(row);
  }

  async getRecords(key: string) {
    return ((await this.st(RECORDS_BY_KEY, { key }).all()).results ?? []).map(toRecord);
  }

  /**
   * Batches (../sweep.ts): each one statement, so one D1 transaction that
   * holds the database only for its `batch` rows; other queries run between
   * them. The retention is applied with the database clock, in SQL.
   */
  async sweep(options: SweepOptions) {
    const steps = sweepSteps(options, (kind, retention_ms) => ({
      run: async (batch) => (await this.st(SWEEP[kind].run, { retention_ms, batch }).run()).meta?.changes ?? 0,
      count: async (cap) => Number(((await this.st(SWEEP[kind].count, { retention_ms, cap }).all<{ n: number }>()).results ?? [])[0]?.n ?? 0),
    }));
    return sweepInBatches(steps, options, { stopped: () => this.closed });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.notifier.close();
  }
}
