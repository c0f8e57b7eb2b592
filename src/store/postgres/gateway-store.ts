import { createHash } from 'node:crypto';
import pg from 'pg';
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
  type RecordState,
  type RejectionInput,
  type RejectionPage,
  type RejectionQuery,
  type RejectionRow,
  type SweepOptions,
  type SweepResult,
} from '../types.js';
import { boundRejectionText, type RejectionText } from '../bounds.js';
import { sweepInBatches, type SweepStep } from '../sweep.js';
import { createPostgresAudit } from './audit.js';
import { PgListener } from './listener.js';
import { decodeNullable, decodeText, encodeNullable, encodeText, quoteIdent } from './text.js';
import type { PoolLike } from './types.js';

/**
 * How waiters learn that a topic changed (DESIGN §3.5 e/h across replicas).
 *
 * Choice: LISTEN/NOTIFY with a bounded poll as the safety net. Every finish
 * calls pg_notify(channel, md5(topic)) inside its own transaction, so every
 * replica's listener hears it at commit; a local finish also wakes local
 * waiters at once. A waiter re-runs the admission when woken, and at least
 * every `pollMs` anyway (a lost notification, a listener reconnecting, a lock
 * that expired because its gateway died: none of these notify).
 *
 * Measured with bench/postgres-wait.mjs (2 cores shared with other test
 * suites, load average 6–11; PostgreSQL 15 on loopback; two stores on one
 * schema = two replicas; the waiter loops admit → entity-busy →
 * waitForChange as the gateway does; 200 rounds; time from the holder's
 * finish to the waiter's `forward`; range over three runs):
 *   LISTEN/NOTIFY        p50 1.5–4.5 ms, p99 8–37 ms
 *   polling every 50 ms  p50 26–34 ms,   p99 53–98 ms
 *   polling every 250 ms p50 231–237 ms, p99 295–324 ms
 * Polling also costs 1000/pollMs admissions (write transactions) per second
 * per waiter: 20/s at 50 ms, so 100 callers queued on a hot entity would run
 * ~2,000 idle transactions per second; LISTEN runs none while waiting.
 * The NOTIFY's own cost on a finish (sequential admit+finish pairs with vs
 * without it) was lost in the noise of the shared box: ratios 1.51, 0.90,
 * 0.99, 0.85 and 1.18 over five runs.
 * So LISTEN/NOTIFY is on by default, polling is the fallback.
 */
export const DEFAULT_POLL_MS_LISTENING = 500;
/** Without a listener, waiters poll as often as the SQLite store's do. */
export const DEFAULT_POLL_MS_POLLING = 50;

export interface PostgresStoreOptions {
  /** `postgres://…`. Either this or `pool`. */
  connectionString?: string;
  /**
   * Bring your own pool (`pg.Pool` or compatible). The store never ends it.
   * LISTEN needs a dedicated connection: with a `pg.Pool` the store opens one
   * with the pool's settings; with another pool it falls back to polling.
   */
  pool?: PoolLike;
  /** Connections in the store's own pool (the LISTEN connection comes on top). Default 10. */
  poolSize?: number;
  /**
   * Schema that holds the tables (created and migrated if missing). Default:
   * the connection's search_path. Statements name it explicitly, so a shared
   * pool with another search_path works too.
   */
  schema?: string;
  /** Apply pending migrations on open. Default true. */
  migrate?: boolean;
  /** LISTEN/NOTIFY for cross-replica wake-ups. Default true. */
  listen?: boolean;
  /** Poll fallback for waiters. Default 500 ms with LISTEN, 50 ms without. */
  pollMs?: number;
  /** A store call fails (→ 503 store-unavailable) after this long without a connection. Default 5000 ms. */
  connectionTimeoutMs?: number;
  /** Server-side statement_timeout for the store's own connections. Default 10000 ms. */
  statementTimeoutMs?: number;
  /** Shown in pg_stat_activity. Default `fencegate`. */
  applicationName?: string;
  /**
   * Connection faults seen while no call was running (an idle pooled
   * connection dropped, the listener lost): the pool and the listener
   * recover by themselves, this is for logs. Default: ignored.
   */
  onError?: (err: Error, source: 'pool' | 'listener') => void;
}

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
 * The PostgreSQL gateway store, for several gateway replicas on one
 * database. Every decision is one statement calling a function whose current
 * definition is in ./sql (fencegate_admit in admit.sql, fencegate_finish in
 * finish.sql), so it is one transaction and one round trip; a
 * dropped connection rolls it back whole. Semantics are the SQLite store's,
 * held to it by test/store/conformance.ts.
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
  private readonly notifier: LocalNotifier;
  private readonly listener: PgListener | null;
  private readonly sql: ReturnType<typeof statements>;
  private closing: Promise<void> | null = null;
  /** Topic hashes someone waits on, with how many waiters. */
  private readonly waiting = new Map<string, number>();
  private readonly audit: AuditStore;

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
    onError?: (err: Error, source: 'pool' | 'listener') => void;
  }) {
    this.pool = init.pool;
    this.ownsPool = init.ownsPool;
    this.sql = statements(init.schema === null ? '' : `${quoteIdent(init.schema)}.`);
    // Channel names are identifiers (≤ 63 bytes): derive one per schema, so
    // replicas of one deployment hear each other and nobody else.
    this.channel = `fencegate_${createHash('sha1').update(init.resolvedSchema).digest('hex').slice(0, 20)}`;
    const listening = init.makeListenClient !== null;
    this.notifier = new LocalNotifier(init.pollMs ?? (listening ? DEFAULT_POLL_MS_LISTENING : DEFAULT_POLL_MS_POLLING));
    const onError = init.onError ?? (() => {});
    this.listener = listening
      ? new PgListener({
          makeClient: init.makeListenClient!,
          channel: this.channel,
          onNotify: (payload) => this.notifier.notify(payload),
          onListening: () => this.wakeAll(),
          onError: (err) => onError(err, 'listener'),
        })
      : null;
    this.audit = createPostgresAudit({ query: (text, values) => this.query(text, values), table: this.sql.t });
  }

  // The audit methods (fence history, operator resolution) live in ./audit.ts.
  getFenceHistory: AuditStore['getFenceHistory'] = (entity, page) => this.audit.getFenceHistory(entity, page);
  listRecords: AuditStore['listRecords'] = (query) => this.audit.listRecords(query);
  resolveRecord: AuditStore['resolveRecord'] = (input) => this.audit.resolveRecord(input);
  listOperatorActions: AuditStore['listOperatorActions'] = (page) => this.audit.listOperatorActions(page);
  auditStats: AuditStore['auditStats'] = () => this.audit.auditStats();

  /** Starts the listener (resolves even if it could not connect yet: it retries). */
  async start(): Promise<void> {
    await this.listener?.start();
  }

  /** True when cross-replica wake-ups are live (for health checks and tests). */
  get listening(): boolean {
    return this.listener?.listening ?? false;
  }

  async admit(input: AdmitInput): Promise<Admission> {
    const a = logText({ entity: input.entity, idempotencyKey: input.key, audit: input.audit });
    const { rows } = await this.query<AdmitRow>(this.sql.admit, [
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
    ]);
    const row = rows[0]!;
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

  async finish(input: FinishInput): Promise<FinishResult> {
    const a = logText({ entity: input.entity, idempotencyKey: input.key, audit: input.audit });
    const eTopic = input.entity === null ? null : topicHash(entityTopic(input.entity));
    const kTopic = input.key === null ? null : topicHash(recordTopic(input.scope, input.key));
    const completed = input.outcome === 'completed' ? input : null;
    const { rows } = await this.query<{ recorded: boolean }>(this.sql.finish, [
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
      this.listener === null ? null : this.channel,
      eTopic,
      kTopic,
      a.clientRequestId,
      a.entity,
      a.idempotencyKey,
    ]);
    // Local waiters need not wait for the NOTIFY round trip.
    if (eTopic !== null) this.notifier.notify(eTopic);
    if (kTopic !== null) this.notifier.notify(kTopic);
    return { recorded: rows[0]!.recorded };
  }

  async recordRejection(r: RejectionInput): Promise<void> {
    const a = logText(r);
    await this.query(this.sql.reject, [
      r.reason,
      a.entity,
      r.presentedFence?.toString() ?? null,
      r.currentFence?.toString() ?? null,
      a.idempotencyKey,
      a.caller,
      a.method,
      a.path,
      a.payloadSha256,
      a.requestId,
      a.detail,
      a.clientRequestId,
    ]);
  }

  waitForChange(topic: string, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    const hash = topicHash(topic);
    this.waiting.set(hash, (this.waiting.get(hash) ?? 0) + 1);
    return this.notifier.wait(hash, timeoutMs, signal).finally(() => {
      const n = (this.waiting.get(hash) ?? 1) - 1;
      if (n <= 0) this.waiting.delete(hash);
      else this.waiting.set(hash, n);
    });
  }

  async listRejections(query: RejectionQuery): Promise<RejectionPage> {
    const where: string[] = [];
    const values: unknown[] = [];
    const add = (cond: (n: string) => string, value: unknown) => {
      values.push(value);
      where.push(cond(`$${values.length}`));
    };
    if (query.entity !== undefined) add((n) => `entity = ${n}`, encodeText(query.entity));
    if (query.reason !== undefined) add((n) => `reason = ${n}`, query.reason);
    if (query.caller !== undefined) add((n) => `caller = ${n}`, encodeText(query.caller));
    if (query.since !== undefined) add((n) => `at >= ${n}`, query.since);
    if (query.until !== undefined) add((n) => `at < ${n}`, query.until);
    if (query.cursor !== undefined) {
      if (!/^\d{1,19}$/.test(query.cursor)) throw new Error(`invalid rejection cursor: ${JSON.stringify(query.cursor)}`);
      add((n) => `id < ${n}`, query.cursor);
    }
    values.push(query.limit + 1);
    const text = `SELECT * FROM ${this.sql.t('rejections')} ${where.length > 0 ? `WHERE ${where.join(' AND ')}` : ''}
      ORDER BY id DESC LIMIT $${values.length}`;
    const { rows } = await this.query<Record<string, unknown>>(text, values, false);
    const items = rows.slice(0, query.limit).map(toRejection);
    const more = rows.length > query.limit;
    return { items, nextCursor: more ? items[items.length - 1]!.id : null };
  }

  async getEntity(entity: string): Promise<EntityInfo | null> {
    const { rows } = await this.query<{ entity: string; fence: string | null; accepted_at: Date; inflight_until: Date | null; live: boolean | null }>(
      this.sql.entityInfo,
      [encodeText(entity)],
    );
    const row = rows[0];
    if (row === undefined) return null;
    return {
      entity: decodeText(row.entity),
      fence: row.fence,
      acceptedAt: row.accepted_at,
      inflight: row.live === true && row.inflight_until !== null ? { until: row.inflight_until } : null,
    };
  }

  async getRecords(key: string): Promise<RecordInfo[]> {
    const { rows } = await this.query<Record<string, any>>(this.sql.recordsByKey, [encodeText(key)]);
    return rows
      .map((r) => ({
        scope: decodeText(r.scope),
        key: decodeText(r.key),
        state: r.state as RecordState,
        fingerprint: decodeText(r.fingerprint),
        entity: decodeNullable(r.entity),
        fence: r.fence as string | null,
        status: r.status as number | null,
        lockedUntil: r.locked_until as Date | null,
        createdAt: r.created_at as Date,
        expiresAt: r.expires_at as Date,
      }))
      .sort((x, y) => (x.scope < y.scope ? -1 : x.scope > y.scope ? 1 : 0));
  }

  /**
   * Batches (../sweep.ts), each ONE statement (its own transaction) over at
   * most `batch` rows taken `FOR UPDATE SKIP LOCKED`: a row an admission or
   * a finish holds is left for the next batch, and two replicas sweeping at
   * once neither wait for nor deadlock with each other. The retention is
   * applied with the database clock, in SQL.
   */
  async sweep(options: SweepOptions): Promise<SweepResult> {
    const retention = (ms: number) => Math.max(0, Math.floor(ms));
    const step = (run: string, count: string, params: unknown[]): SweepStep => ({
      run: async (batch) => Number((await this.query<{ n: string }>(run, [batch, ...params])).rows[0]!.n),
      count: async (cap) => Number((await this.query<{ n: string }>(count, [cap, ...params])).rows[0]!.n),
    });
    const S = this.sql.sweep;
    const steps: Partial<Record<keyof SweepResult['backlog'], SweepStep>> = {
      expiredRecords: step(S.expired, S.countExpired, []),
      unknownRecords: step(S.dead, S.countDead, []),
      oldRejections: step(S.rejections, S.countRejections, [retention(options.rejectionRetentionMs)]),
    };
    if (options.entityRetentionMs !== undefined) {
      const p = [retention(options.entityRetentionMs)];
      steps.oldEntities = step(S.entities, S.countEntities, p);
      steps.oldFenceHistory = step(S.history, S.countHistory, p);
    }
    if (options.operatorActionRetentionMs !== undefined) {
      steps.oldOperatorActions = step(S.actions, S.countActions, [retention(options.operatorActionRetentionMs)]);
    }
    return sweepInBatches(steps, options, { stopped: () => this.closing !== null });
  }

  /** Idempotent: wakes every waiter, stops the listener, ends the pool if the store opened it. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      this.notifier.close();
      await this.listener?.close();
      if (this.ownsPool) await this.pool.end();
    })();
    return this.closing;
  }

  /** After a (re)connect of the listener: notifications sent while it was away are lost. */
  private wakeAll(): void {
    for (const hash of [...this.waiting.keys()]) this.notifier.notify(hash);
  }

  /**
   * One statement. Hot-path statements are named, so each connection parses
   * and plans them once; the name carries a hash of the text, so two stores
   * on different schemas can share a pool.
   */
  private query<R>(text: string, values: unknown[], prepared = true) {
    if (this.closing !== null) return Promise.reject(new Error('the PostgreSQL gateway store is closed'));
    if (!prepared) return this.pool.query<R>(text, values);
    const named = { name: statementName(text), text, values };
    return (this.pool as unknown as { query(q: typeof named): Promise<{ rows: R[] }> }).query(named);
  }
}

const statementNames = new Map<string, string>();
function statementName(text: string): string {
  let name = statementNames.get(text);
  if (name === undefined) statementNames.set(text, (name = `fencegate_${createHash('sha1').update(text).digest('hex').slice(0, 16)}`));
  return name;
}

/**
 * The rejection row's text, bounded (../bounds.ts) BEFORE it is escaped and
 * passed in: the functions (./sql) write these values as they are
 * (`p_log_entity` and `p_log_key` beside the whole `p_entity` and `p_key`
 * the decision uses), so the bound is the same in every store.
 */
function logText(r: Parameters<typeof boundRejectionText>[0]): RejectionText {
  const t = boundRejectionText(r);
  return {
    entity: encodeNullable(t.entity),
    idempotencyKey: encodeNullable(t.idempotencyKey),
    caller: encodeNullable(t.caller),
    method: encodeText(t.method),
    path: encodeText(t.path),
    payloadSha256: encodeNullable(t.payloadSha256),
    requestId: encodeText(t.requestId),
    clientRequestId: encodeNullable(t.clientRequestId),
    detail: encodeNullable(t.detail),
  };
}

/** A topic as a NOTIFY payload and a local waiter key: topics may hold U+0000 and any length. */
function topicHash(topic: string): string {
  return createHash('md5').update(topic).digest('hex');
}

function bytes(b: Buffer | null): Uint8Array {
  if (b === null) return new Uint8Array(0);
  return new Uint8Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
}

function toRejection(r: Record<string, unknown>): RejectionRow {
  const str = (v: unknown) => (v === null || v === undefined ? null : String(v));
  return {
    id: String(r.id),
    at: r.at as Date,
    reason: String(r.reason),
    entity: decodeNullable(r.entity as string | null),
    presentedFence: str(r.presented_fence),
    currentFence: str(r.current_fence),
    idempotencyKey: decodeNullable(r.idempotency_key as string | null),
    caller: decodeNullable(r.caller as string | null),
    method: decodeNullable(r.method as string | null),
    path: decodeNullable(r.path as string | null),
    payloadSha256: decodeNullable(r.payload_sha256 as string | null),
    requestId: decodeNullable(r.request_id as string | null),
    clientRequestId: decodeNullable(r.client_request_id as string | null),
    detail: decodeNullable(r.detail as string | null),
  };
}

/** Every statement of the store, with table and function names qualified by `prefix` (`"schema".` or empty). */
function statements(prefix: string) {
  const t = (name: string) => `${prefix}${name}`;
  return {
    t,
    // $1 scope $2 key $3 entity $4 fence $5 fingerprint $6 serial $7 owner $8 lock_ms
    // $9 retention_ms $10 retry_unknown $11 caller $12 method $13 path $14 payload_sha256 $15 request_id
    // $16 client_request_id $17 log_entity $18 log_key ($11–$18: the bounded rejection text)
    admit: `SELECT * FROM ${t('fencegate_admit')}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)`,
    // $1 scope $2 key $3 entity $4 owner $5 outcome $6 status $7 headers $8 body $9 retention_ms
    // $10 caller $11 method $12 path $13 payload_sha256 $14 request_id $15 channel $16 entity topic $17 record topic
    // $18 client_request_id $19 log_entity $20 log_key
    finish: `SELECT recorded FROM ${t('fencegate_finish')}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)`,
    // $1 reason $2 entity $3 presented $4 current $5 key $6 caller $7 method $8 path $9 payload_sha256 $10 request_id
    // $11 detail $12 client_request_id
    reject: `INSERT INTO ${t('rejections')}
      (at, reason, entity, presented_fence, current_fence, idempotency_key, caller, method, path, payload_sha256, request_id, detail, client_request_id)
      VALUES (now(), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
    // $1 entity
    entityInfo: `SELECT entity, fence, accepted_at, inflight_until, inflight_until > now() AS live
      FROM ${t('fence_entities')} WHERE entity = $1`,
    // $1 key
    recordsByKey: `SELECT scope, key, state, fingerprint, entity, fence, status, locked_until, created_at, expires_at
      FROM ${t('idempotency_records')} WHERE key = $1`,
    // The sweeper's batches: $1 batch, $2 retention ms where one applies.
    // Counts: $1 cap, $2 retention ms. See sweep() for SKIP LOCKED.
    sweep: {
      expired: `WITH d AS (
          DELETE FROM ${t('idempotency_records')} r
          WHERE (r.scope, r.key) IN (
            SELECT scope, key FROM ${t('idempotency_records')}
            WHERE state = 'completed' AND expires_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED)
          RETURNING 1)
        SELECT count(*) AS n FROM d`,
      dead: `WITH d AS (
          UPDATE ${t('idempotency_records')} r SET state = 'outcome_unknown', locked_until = NULL
          WHERE (r.scope, r.key) IN (
            SELECT scope, key FROM ${t('idempotency_records')}
            WHERE state = 'in_progress' AND locked_until <= now() LIMIT $1 FOR UPDATE SKIP LOCKED)
          RETURNING 1)
        SELECT count(*) AS n FROM d`,
      rejections: `WITH d AS (
          DELETE FROM ${t('rejections')}
          WHERE id IN (
            SELECT id FROM ${t('rejections')}
            WHERE at < now() - $2 * interval '1 millisecond' LIMIT $1 FOR UPDATE SKIP LOCKED)
          RETURNING 1)
        SELECT count(*) AS n FROM d`,
      // entityRetention, never an entity whose serial slot is live (README:
      // the safety condition). Index fence_entities_accepted (0006).
      entities: `WITH d AS (
          DELETE FROM ${t('fence_entities')}
          WHERE entity IN (
            SELECT entity FROM ${t('fence_entities')}
            WHERE accepted_at < now() - $2 * interval '1 millisecond'
              AND (inflight_owner IS NULL OR inflight_until <= now())
            LIMIT $1 FOR UPDATE SKIP LOCKED)
          RETURNING 1)
        SELECT count(*) AS n FROM d`,
      history: `WITH d AS (
          DELETE FROM ${t('fence_history')}
          WHERE id IN (
            SELECT id FROM ${t('fence_history')}
            WHERE at < now() - $2 * interval '1 millisecond' LIMIT $1 FOR UPDATE SKIP LOCKED)
          RETURNING 1)
        SELECT count(*) AS n FROM d`,
      actions: `WITH d AS (
          DELETE FROM ${t('operator_actions')}
          WHERE id IN (
            SELECT id FROM ${t('operator_actions')}
            WHERE at < now() - $2 * interval '1 millisecond' LIMIT $1 FOR UPDATE SKIP LOCKED)
          RETURNING 1)
        SELECT count(*) AS n FROM d`,
      countExpired: `SELECT count(*) AS n FROM (SELECT 1 FROM ${t('idempotency_records')}
        WHERE state = 'completed' AND expires_at <= now() LIMIT $1) x`,
      countDead: `SELECT count(*) AS n FROM (SELECT 1 FROM ${t('idempotency_records')}
        WHERE state = 'in_progress' AND locked_until <= now() LIMIT $1) x`,
      countRejections: `SELECT count(*) AS n FROM (SELECT 1 FROM ${t('rejections')}
        WHERE at < now() - $2 * interval '1 millisecond' LIMIT $1) x`,
      countEntities: `SELECT count(*) AS n FROM (SELECT 1 FROM ${t('fence_entities')}
        WHERE accepted_at < now() - $2 * interval '1 millisecond' AND (inflight_owner IS NULL OR inflight_until <= now()) LIMIT $1) x`,
      countHistory: `SELECT count(*) AS n FROM (SELECT 1 FROM ${t('fence_history')}
        WHERE at < now() - $2 * interval '1 millisecond' LIMIT $1) x`,
      countActions: `SELECT count(*) AS n FROM (SELECT 1 FROM ${t('operator_actions')}
        WHERE at < now() - $2 * interval '1 millisecond' LIMIT $1) x`,
    },
  };
}
