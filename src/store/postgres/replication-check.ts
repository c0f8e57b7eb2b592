import type { PgStoreNotice } from './options.js';
import type { PoolLike } from './types.js';

/**
 * Whether an acknowledged decision survives a failover (DESIGN §8.2, §2 G1
 * and G2). The store's COMMIT acknowledgement is what the gateway acts on:
 * a raised fence refuses the lower ones after it, a recorded key is
 * replayed instead of forwarded. If the primary acknowledged a commit that
 * its standby did not have yet, promoting that standby forgets it: a lower
 * fence is accepted again, a key is forwarded a second time. Only
 * synchronous replication closes that window, so the store reads, at start
 * and every `intervalMs`, what the server says about it.
 */

/** `safe`: no standby, or every standby synchronous; `at-risk`: a failover may lose acknowledged decisions; `unknown`: the role cannot tell. */
export type ReplicationState = 'safe' | 'at-risk' | 'unknown';

export interface StandbyInfo {
  /** `application_name` of the walsender (the standby's `cluster_name`, or what its primary_conninfo names); null when the role may not see it. */
  name: string | null;
  /** `sync_state`: `sync`, `quorum`, `potential`, `async`; null when the role may not see it. */
  syncState: string | null;
}

export interface ReplicationReport {
  state: ReplicationState;
  /** One sentence for the log line. */
  reason: string;
  /** The setting in force for the store's own sessions. */
  synchronousCommit: string;
  synchronousStandbyNames: string;
  standbys: StandbyInfo[];
  /** The server has synchronous standbys named and none connected: every commit waits (the promotion pitfall, docs/deploy-postgres.md). */
  commitsWait: boolean;
}

/** What one round trip reads; exported for the rules' tests. */
export interface ReplicationRow {
  synchronous_commit: string;
  synchronous_standby_names: string;
  in_recovery: boolean;
  standbys: StandbyInfo[];
}

/**
 * pg_stat_replication lists one row per walsender to every role, but its
 * columns other than pid only to superusers and pg_read_all_stats (pg_monitor)
 * members: for anyone else `sync_state` is null, which reads as "cannot tell".
 */
export const REPLICATION_QUERY = `SELECT current_setting('synchronous_commit') AS synchronous_commit,
  current_setting('synchronous_standby_names') AS synchronous_standby_names,
  pg_is_in_recovery() AS in_recovery,
  coalesce((SELECT json_agg(json_build_object('name', application_name, 'syncState', sync_state) ORDER BY pid)
    FROM pg_stat_replication), '[]'::json) AS standbys`;

/** The rules of docs/deploy-postgres.md "Replication and failover", on one reading. */
export function assessReplication(row: ReplicationRow): ReplicationReport {
  const synchronousCommit = row.synchronous_commit;
  const synchronousStandbyNames = row.synchronous_standby_names.trim();
  const standbys = row.standbys;
  const base = { synchronousCommit, synchronousStandbyNames, standbys, commitsWait: false };
  // off and local acknowledge a commit before any standby has it, whatever synchronous_standby_names says.
  const localCommit = synchronousCommit === 'off' || synchronousCommit === 'local';
  if (row.in_recovery) {
    return { ...base, state: 'unknown', reason: 'the store is connected to a standby in recovery (its writes fail); point it at the primary' };
  }
  if (standbys.length === 0) {
    const commitsWait = synchronousStandbyNames !== '' && !localCommit;
    return {
      ...base,
      commitsWait,
      state: 'safe',
      reason: commitsWait
        ? `synchronous_standby_names is '${synchronousStandbyNames}' but no standby is connected: every commit waits until one is (a promoted standby inherits this setting)`
        : 'no standby replicates from this server',
    };
  }
  if (localCommit) {
    return {
      ...base,
      state: 'at-risk',
      reason: `synchronous_commit is '${synchronousCommit}' while ${standbys.length} standby(s) replicate: commits are acknowledged before any standby has them, so a failover can lose acknowledged fences and idempotency records`,
    };
  }
  if (standbys.some((s) => s.syncState === null)) {
    return {
      ...base,
      state: 'unknown',
      reason:
        "the store's role cannot read pg_stat_replication.sync_state (grant it pg_monitor or pg_read_all_stats): whether a failover keeps acknowledged decisions is not checked",
    };
  }
  const unsafe = standbys.filter((s) => s.syncState !== 'sync' && s.syncState !== 'quorum');
  if (unsafe.length > 0) {
    const names = unsafe.map((s) => `${s.name ?? '?'} (${s.syncState})`).join(', ');
    const none = unsafe.length === standbys.length ? 'no standby is synchronous' : 'not every standby is synchronous';
    return {
      ...base,
      state: 'at-risk',
      reason: `${none}: ${names}; promoting such a standby can lose acknowledged fences and idempotency records (set synchronous_standby_names, and synchronous_commit on or remote_apply)`,
    };
  }
  return { ...base, state: 'safe', reason: 'every standby is synchronous' };
}

/** A log line, for whoever holds the logger (the Node entry, src/entry/node.ts). */
export interface ReplicationLogLine extends PgStoreNotice {
  msg: 'async-replication' | 'replication-unchecked' | 'sync-standby-missing' | 'replication-synchronous';
}

/**
 * The store's replication check: one round trip at start, then one every
 * `intervalMs` (timer unref'd). A reading that fails (the database away) is
 * skipped: `fencegate_store_up` tells that story. Lines are emitted on a
 * change only, so a deployment that stays asynchronous is warned at start
 * and on each change, not every minute, and "cannot tell" is said once.
 */
export class ReplicationCheck {
  private report: ReplicationReport | null = null;
  private line: ReplicationLogLine | null = null;
  private readonly listeners = new Set<(line: ReplicationLogLine) => void>();
  private timer: NodeJS.Timeout | null = null;
  private running: Promise<ReplicationReport | null> | null = null;
  private closed = false;

  constructor(
    private readonly pool: PoolLike,
    private readonly intervalMs: number,
  ) {}

  /** The last reading, or null before the first. */
  get last(): ReplicationReport | null {
    return this.report;
  }

  /** `fencegate_store_async_replication`: 1 at risk, 0 safe, null (not exported) before a reading or when the role cannot tell. */
  get gauge(): number | null {
    if (this.report === null || this.report.state === 'unknown') return null;
    return this.report.state === 'at-risk' ? 1 : 0;
  }

  /** The first reading (never throws), then the timer. */
  async start(): Promise<void> {
    await this.check();
    if (this.closed) return;
    this.timer = setInterval(() => void this.check(), this.intervalMs);
    this.timer.unref();
  }

  /** One reading now; null when it failed. Concurrent calls share one round trip. */
  check(): Promise<ReplicationReport | null> {
    this.running ??= this.read().finally(() => (this.running = null));
    return this.running;
  }

  /** Called with the current line at once (if there is one), then with every change. */
  subscribe(fn: (line: ReplicationLogLine) => void): () => void {
    this.listeners.add(fn);
    if (this.line !== null) fn(this.line);
    return () => this.listeners.delete(fn);
  }

  close(): void {
    this.closed = true;
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  private async read(): Promise<ReplicationReport | null> {
    let row: ReplicationRow | undefined;
    try {
      row = (await this.pool.query<ReplicationRow>(REPLICATION_QUERY, [])).rows[0];
    } catch {
      return null;
    }
    if (row === undefined || this.closed) return null;
    const next = assessReplication(row);
    const previous = this.report;
    this.report = next;
    const line = lineOf(next, previous);
    if (line !== null && (this.line === null || this.line.msg !== line.msg || this.line.fields.reason !== line.fields.reason)) {
      this.line = line;
      for (const fn of this.listeners) fn(line);
    }
    return next;
  }
}

function lineOf(r: ReplicationReport, previous: ReplicationReport | null): ReplicationLogLine | null {
  const fields = {
    reason: r.reason,
    synchronous_commit: r.synchronousCommit,
    synchronous_standby_names: r.synchronousStandbyNames,
    standbys: r.standbys.map((s) => ({ name: s.name, sync_state: s.syncState })),
  };
  if (r.state === 'at-risk') return { level: 'warn', msg: 'async-replication', fields };
  if (r.state === 'unknown') return { level: 'warn', msg: 'replication-unchecked', fields };
  if (r.commitsWait) return { level: 'warn', msg: 'sync-standby-missing', fields };
  // Safe: said only when it follows a warning (the operator fixed it); a safe start is silent.
  if (previous !== null && (previous.state !== 'safe' || previous.commitsWait)) return { level: 'info', msg: 'replication-synchronous', fields };
  return null;
}
