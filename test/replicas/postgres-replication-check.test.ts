/**
 * The replication check (src/store/postgres/replication-check.ts; the rule
 * is in docs/deploy-postgres.md "Replication and failover"): a failover
 * keeps acknowledged fences and idempotency records (DESIGN §2 G1, G2) only
 * when the standby had every acknowledged commit, i.e. with synchronous
 * replication. Real streaming replication: a private primary (initdb) and a
 * standby made from it with `pg_basebackup -R`, each on its own free port.
 * The gateway (startGateway, as `fencegate serve` runs it) must log
 * `async-replication` and export fencegate_store_async_replication 1 with an
 * asynchronous standby, and neither with a synchronous one (the negative
 * control) nor with no standby at all; a role that cannot read
 * pg_stat_replication's sync_state starts normally and is told once that
 * the check could not tell. Last, a failover under synchronous replication
 * (the primary killed with `-m immediate`, the standby promoted) keeps
 * every acknowledged fence and key; and its control, a failover to an
 * asynchronous standby whose link (a FaultProxy) stalled, loses the fences
 * and keys acknowledged meanwhile.
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresStore, type PostgresStoreOptions } from '../../src/store/postgres/index.js';
import { FaultProxy } from '../faults/toolkit/tcp-proxy.js';
import { command, expectProblem, paymentsRoute, until } from '../helpers/gateway.js';
import { startLoggedPgGateway, type LoggedPgGateway } from '../helpers/pg-gateway.js';
import { findPostgresBin, startPrivatePostgres, type PrivatePostgres } from '../helpers/private-postgres.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

const BIN = findPostgresBin();
if (BIN === null) {
  console.warn(
    '[fencegate] initdb/pg_ctl/pg_basebackup not found (Debian: apt-get install postgresql; or set FENCEGATE_PG_BIN): the replication check test is SKIPPED.',
  );
}

type Gw = LoggedPgGateway;

/** What the check logs (src/store/postgres/replication-check.ts); other start-up warnings are not this test's. */
const REPLICATION_LINES = new Set(['async-replication', 'replication-unchecked', 'sync-standby-missing', 'replication-synchronous']);

const gaugeOf = (text: string): number | null => {
  const m = /^fencegate_store_async_replication (\S+)$/m.exec(text);
  return m === null ? null : Number(m[1]);
};

describe.skipIf(BIN === null)('the replication check, on real streaming replication', () => {
  let primary: PrivatePostgres;
  let standby: PrivatePostgres | null = null;
  let standby2: PrivatePostgres | null = null;
  let link: FaultProxy | null = null;
  let up: FakeUpstream;
  const gateways: Gw[] = [];
  const clients: pg.Client[] = [];

  const sql = async <R = Record<string, unknown>>(url: string, text: string): Promise<R[]> => {
    const c = new pg.Client({ connectionString: url });
    c.on('error', () => {});
    await c.connect();
    try {
      return (await c.query(text)).rows as R[];
    } finally {
      await c.end().catch(() => {});
    }
  };

  /** A gateway on `url`; its store checks only when the test asks (the timer is 10 min). */
  async function gateway(url: string, store: Partial<PostgresStoreOptions> = {}): Promise<Gw> {
    const s = await createPostgresStore({ connectionString: url, poolSize: 2, replicationCheckMs: 600_000, ...store });
    const gw = await startLoggedPgGateway(s, url, [paymentsRoute(up.url)]);
    gateways.push(gw);
    return gw;
  }
  async function stop(gw: Gw): Promise<void> {
    await gw.close();
    gateways.splice(gateways.indexOf(gw), 1);
  }
  const scrape = async (gw: Gw) => gaugeOf(await (await fetch(`${gw.url}/_fencegate/metrics`)).text());
  const warned = (gw: Gw, msg: string) => gw.lines.filter((l) => l.msg === msg);
  /** Waits until the primary reports a standby in that sync_state. */
  const standbyIs = (state: string) =>
    until(
      async () =>
        (await sql<{ sync_state: string }>(primary.url, "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'")).some(
          (r) => r.sync_state === state,
        ) || null,
      `a ${state} standby`,
      { timeoutMs: 60_000 },
    );

  beforeAll(async () => {
    primary = await startPrivatePostgres(BIN!, { name: 'primary' });
    up = await startUpstream();
  }, 120_000);

  afterAll(async () => {
    for (const gw of [...gateways]) await stop(gw).catch(() => {});
    for (const c of clients) await c.end().catch(() => {});
    await up?.close();
    await standby2?.destroy();
    await link?.close();
    await standby?.destroy();
    await primary?.destroy();
  }, 60_000);

  it('no standby: no warning, the gauge is 0', async () => {
    const gw = await gateway(primary.url);
    expect(gw.store.replication!.last).toMatchObject({ state: 'safe', standbys: [], commitsWait: false });
    expect(await scrape(gw)).toBe(0);
    expect(gw.lines.filter((l) => REPLICATION_LINES.has(l.msg))).toEqual([]);
    await stop(gw);
  });

  it('an asynchronous standby: async-replication at start-up and on the next check, the gauge is 1', async () => {
    const running = await gateway(primary.url);
    expect(await scrape(running)).toBe(0);
    standby = await startPrivatePostgres(BIN!, { standbyOf: primary, name: 'standby1' });
    await standbyIs('async');

    // A gateway already running learns it at its next check…
    await running.store.replication!.check();
    expect(warned(running, 'async-replication')).toHaveLength(1);
    expect(warned(running, 'async-replication')[0]!.fields).toMatchObject({
      synchronous_standby_names: '',
      standbys: [{ name: 'standby1', sync_state: 'async' }],
    });
    expect(await scrape(running)).toBe(1);
    // …and says it once: the same state at the next check adds no line.
    await running.store.replication!.check();
    expect(warned(running, 'async-replication')).toHaveLength(1);

    // A gateway that starts now says it at start-up.
    const fresh = await gateway(primary.url);
    expect(warned(fresh, 'async-replication')).toHaveLength(1);
    expect(await scrape(fresh)).toBe(1);
    await stop(fresh);
    await stop(running);
  }, 120_000);

  it('the negative control: with the standby synchronous, no warning and the gauge is 0; a running gateway says the risk is gone', async () => {
    const running = await gateway(primary.url);
    expect(warned(running, 'async-replication')).toHaveLength(1);
    await sql(primary.url, "ALTER SYSTEM SET synchronous_standby_names = 'standby1'");
    await sql(primary.url, 'SELECT pg_reload_conf()');
    await standbyIs('sync');

    await running.store.replication!.check();
    expect(running.lines.at(-1)).toMatchObject({ level: 'info', msg: 'replication-synchronous' });
    expect(await scrape(running)).toBe(0);

    const fresh = await gateway(primary.url);
    expect(fresh.store.replication!.last).toMatchObject({ state: 'safe', standbys: [{ name: 'standby1', syncState: 'sync' }] });
    expect(fresh.lines.filter((l) => REPLICATION_LINES.has(l.msg))).toEqual([]);
    expect(await scrape(fresh)).toBe(0);
    await stop(fresh);
    await stop(running);
  }, 120_000);

  it('synchronous_commit local with a synchronous standby: async-replication all the same', async () => {
    await sql(primary.url, "DROP ROLE IF EXISTS fg_local; CREATE ROLE fg_local LOGIN SUPERUSER; ALTER ROLE fg_local SET synchronous_commit = 'local'");
    const gw = await gateway(primary.url.replace('postgres@', 'fg_local@'));
    expect(warned(gw, 'async-replication')).toHaveLength(1);
    expect(warned(gw, 'async-replication')[0]!.fields).toMatchObject({ synchronous_commit: 'local' });
    expect(await scrape(gw)).toBe(1);
    await stop(gw);
  });

  it('a role that cannot read sync_state: start-up succeeds, "could not tell" is said once, no gauge', async () => {
    // The tables exist (the gateways above migrated public); this role only reads the settings.
    await sql(primary.url, 'DROP ROLE IF EXISTS fg_plain; CREATE ROLE fg_plain LOGIN');
    const gw = await gateway(primary.url.replace('postgres@', 'fg_plain@'), { migrate: false });
    await gw.store.replication!.check();
    await gw.store.replication!.check();
    expect(warned(gw, 'replication-unchecked')).toHaveLength(1);
    expect(warned(gw, 'replication-unchecked')[0]!.fields.reason).toMatch(/pg_monitor/);
    expect(warned(gw, 'async-replication')).toEqual([]);
    expect(await scrape(gw)).toBeNull();
    await stop(gw);
  });

  it('a failover with synchronous replication: the primary killed (-m immediate), the standby promoted; no acknowledged fence or key is lost', async () => {
    const gw = await gateway(primary.url);
    const acked: { fence: number; key: string }[] = [];
    for (let fence = 1; fence <= 40; fence++) {
      const key = `failover-${fence}`;
      const res = await command(gw.url, '/payments/charges', { fence, entity: 'failover', key });
      expect(res.status).toBe(201);
      await res.arrayBuffer();
      acked.push({ fence, key });
    }
    const effects = up.effects;
    await primary.stop('immediate');
    await stop(gw).catch(() => {});
    await standby!.promote();
    await until(async () => (await sql<{ r: boolean }>(standby!.url, 'SELECT pg_is_in_recovery() AS r'))[0]!.r === false || null, 'the promoted standby');

    const after = await gateway(standby!.url, { migrate: false });
    // The promoted server has no standby of its own and names none: not at risk, nothing waits.
    expect(after.store.replication!.last).toMatchObject({ state: 'safe', commitsWait: false });
    // Every acknowledged fence survived: the highest is still in force, a lower one is refused.
    const stale = await command(after.url, '/payments/charges', { fence: 39, entity: 'failover', key: 'failover-lower' });
    await expectProblem(stale, 409, 'stale-fence');
    // Every acknowledged key's record survived, completed (a lower fence is refused
    // before its replay, DESIGN §3 decision order, so the records are read) …
    for (const { key } of acked)
      expect(
        (await after.store.getRecords(key)).map((r) => r.state),
        key,
      ).toEqual(['completed']);
    // … and the last one is replayed, not executed again.
    const replay = await command(after.url, '/payments/charges', { fence: 40, entity: 'failover', key: 'failover-40' });
    expect(replay.status).toBe(201);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    await replay.arrayBuffer();
    expect(up.effects).toBe(effects);

    // The promotion pitfall: a new primary that names synchronous standbys none of which is connected.
    await sql(standby!.url, "ALTER SYSTEM SET synchronous_standby_names = 'nobody'");
    await sql(standby!.url, 'SELECT pg_reload_conf()');
    await until(
      async () => (await sql<{ s: string }>(standby!.url, "SELECT current_setting('synchronous_standby_names') AS s"))[0]!.s === 'nobody' || null,
      'the reload',
    );
    await after.store.replication!.check();
    expect(warned(after, 'sync-standby-missing')).toHaveLength(1);
    expect(warned(after, 'sync-standby-missing')[0]!.fields.reason).toMatch(/every commit waits/);
    expect(await scrape(after)).toBe(0);
    await stop(after);
  }, 120_000);

  it('the control: asynchronous replication, the link stalled, a failover: acknowledged fences and keys are lost, as the warning said they could be', async () => {
    // The promoted server is the primary now; a second standby streams from it, asynchronously, through a proxy.
    const p2 = standby!;
    await sql(p2.url, "ALTER SYSTEM SET synchronous_standby_names = ''");
    await sql(p2.url, 'SELECT pg_reload_conf()');
    await until(async () => (await sql<{ s: string }>(p2.url, "SELECT current_setting('synchronous_standby_names') AS s"))[0]!.s === '' || null, 'the reload');
    link = await FaultProxy.start({ target: { host: '127.0.0.1', port: p2.port }, name: 'replication' });
    standby2 = await startPrivatePostgres(BIN!, { standbyOf: { port: link.port }, name: 'standby2' });
    await until(
      async () =>
        (await sql<{ sync_state: string }>(p2.url, "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'")).some(
          (r) => r.sync_state === 'async',
        ) || null,
      'an async standby',
      { timeoutMs: 60_000 },
    );

    const gw = await gateway(p2.url, { migrate: false });
    expect(warned(gw, 'async-replication')).toHaveLength(1);
    const send = async (fence: number, key: string) => {
      const res = await command(gw.url, '/payments/charges', { fence, entity: 'failover', key });
      expect(res.status, key).toBe(201);
      await res.arrayBuffer();
    };
    for (let fence = 41; fence <= 45; fence++) await send(fence, `failover-${fence}`);
    // 41…45 are on the standby (its replay reached the primary's WAL position); then the link stalls.
    const { lsn } = (await sql<{ lsn: string }>(p2.url, 'SELECT pg_current_wal_lsn()::text AS lsn'))[0]!;
    await until(
      async () => (await sql<{ ok: boolean }>(standby2!.url, `SELECT pg_last_wal_replay_lsn() >= '${lsn}'::pg_lsn AS ok`))[0]!.ok || null,
      'the standby caught up',
    );
    link.blackhole(true);
    // Acknowledged all the same: an asynchronous commit waits for no standby.
    for (let fence = 46; fence <= 55; fence++) await send(fence, `failover-${fence}`);
    await p2.stop('immediate');
    await stop(gw).catch(() => {});
    await standby2.promote();
    await until(async () => (await sql<{ r: boolean }>(standby2!.url, 'SELECT pg_is_in_recovery() AS r'))[0]!.r === false || null, 'the promoted standby');

    const after = await gateway(standby2.url, { migrate: false });
    for (let fence = 41; fence <= 45; fence++) expect((await after.store.getRecords(`failover-${fence}`)).map((r) => r.state)).toEqual(['completed']);
    // Lost: 46…55 were acknowledged, yet their records are gone and fence 50, lower than 55, is accepted.
    for (let fence = 46; fence <= 55; fence++) expect(await after.store.getRecords(`failover-${fence}`), `failover-${fence}`).toEqual([]);
    const lower = await command(after.url, '/payments/charges', { fence: 50, entity: 'failover', key: 'failover-after-loss' });
    expect(lower.status).toBe(201);
    await lower.arrayBuffer();
    await stop(after);
  }, 120_000);
});
