/**
 * The PostgreSQL store through a real PgBouncer (Debian's, stock settings;
 * docs/deploy-postgres.md "Through PgBouncer"), in session and in
 * transaction pooling, in front of the test server. The gateway
 * (startGateway, as `fencegate serve` runs it) admits, replays and refuses
 * stale fences through it with zero store errors, the store's
 * statement_timeout is in force on its connections (PgBouncer refuses it as
 * a startup parameter, so the store SETs it: per connection in session
 * mode, SET LOCAL per transaction in transaction mode), and LISTEN works
 * where it can (session mode, or `listenConnectionString` beside a
 * transaction pooler) and is said to be missing where it cannot. The
 * control: a store not told about the transaction pooler uses named
 * prepared statements, which that pooler breaks (store errors, 503s).
 */
import { existsSync } from 'node:fs';
import pg from 'pg';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openJobStore } from '../../src/lease/open.js';
import { createPostgresStore, type PostgresGatewayStore, type PostgresStoreOptions } from '../../src/store/postgres/index.js';
import { CLI, runNode, startGatewayChild, writeJson } from '../helpers/child.js';
import { command, expectProblem, paymentsRoute, tempDir, until } from '../helpers/gateway.js';
import { startLoggedPgGateway, type LoggedPgGateway } from '../helpers/pg-gateway.js';
import { PGBOUNCER_BIN, startPgbouncer, type PrivatePgbouncer } from '../helpers/pgbouncer.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

const HAVE_PGBOUNCER = existsSync(PGBOUNCER_BIN);
const IN_CI = !!process.env.CI;
if (!HAVE_PGBOUNCER && !IN_CI) {
  console.warn(`[fencegate] ${PGBOUNCER_BIN} not found (Debian: apt-get install pgbouncer; or set FENCEGATE_PGBOUNCER): the PgBouncer tests are SKIPPED.`);
}

// CI installs pgbouncer (.ci/run): there, a missing binary is a failure, not a skip.
describe.runIf(IN_CI)('PgBouncer in CI', () => {
  it('is installed', () => {
    expect(existsSync(PGBOUNCER_BIN), `${PGBOUNCER_BIN} is missing: .ci/run installs it (apt-get install pgbouncer)`).toBe(true);
  });
});

type Gw = LoggedPgGateway;

/** Drops a role of the shared server (after the schema its tables were in). */
async function dropRole(role: string): Promise<void> {
  const c = new pg.Client({ connectionString: POSTGRES_URL });
  await c.connect();
  try {
    await c.query(`DROP ROLE IF EXISTS ${role}`);
  } finally {
    await c.end();
  }
}

const errorsOf = (text: string, op: string) => Number(new RegExp(`^fencegate_store_errors_total\\{op="${op}"\\} (\\S+)$`, 'm').exec(text)?.[1]);

for (const mode of ['session', 'transaction'] as const) {
  describe.skipIf(!POSTGRES_URL || !HAVE_PGBOUNCER)(`through PgBouncer, pool_mode = ${mode}`, () => {
    let bouncer: PrivatePgbouncer;
    let schema: TestSchema;
    let up: FakeUpstream;
    let leaseSchema: TestSchema | null = null;
    let leaseRole: string | null = null;
    const gateways: Gw[] = [];
    const stores: PostgresGatewayStore[] = [];
    /** The store as a user behind this pooler configures it. */
    const storeOptions = (): PostgresStoreOptions => ({
      connectionString: bouncer.url,
      schema: schema.schema,
      poolSize: 6,
      statementTimeoutMs: 7_000,
      ...(mode === 'transaction' ? { pooler: 'transaction' as const } : {}),
    });
    async function open(options: PostgresStoreOptions): Promise<PostgresGatewayStore> {
      const s = await createPostgresStore({ replicationCheckMs: false, ...options });
      stores.push(s);
      return s;
    }
    async function gateway(options: PostgresStoreOptions): Promise<Gw> {
      const gw = await startLoggedPgGateway(await open(options), bouncer.url, [paymentsRoute(up.url)]);
      gateways.push(gw);
      return gw;
    }
    const metrics = async (gw: Gw) => (await fetch(`${gw.url}/_fencegate/metrics`)).text();

    beforeAll(async () => {
      schema = await createTestSchema(`fg_pgb_${mode[0]}`, 1);
      // Transaction pooling: two server connections for six store connections, so it mixes them.
      // Session pooling pins a client connection to a server connection: room for every store here.
      // The lease store has no schema option: a role of its own whose search_path is the test schema
      // (ALTER ROLE … SET survives the pooler's DISCARD ALL, a connect_query would not).
      leaseSchema = await createTestSchema(`fg_pgb_lease_${mode[0]}`, 1);
      leaseRole = leaseSchema.schema;
      await leaseSchema.pool.query(
        `CREATE ROLE ${leaseRole} LOGIN; ALTER SCHEMA ${leaseRole} OWNER TO ${leaseRole}; ALTER ROLE ${leaseRole} SET search_path = ${leaseRole}`,
      );
      bouncer = await startPgbouncer({ server: POSTGRES_URL!, mode, poolSize: mode === 'transaction' ? 2 : 30, users: ['postgres', leaseRole] });
      up = await startUpstream();
    }, 60_000);

    afterAll(async () => {
      for (const gw of gateways) await gw.running.close().catch(() => {});
      for (const s of stores) await s.close().catch(() => {});
      await up?.close();
      await bouncer?.stop();
      await schema?.drop();
      await leaseSchema?.drop();
      if (leaseRole !== null) await dropRole(leaseRole);
    }, 60_000);

    it("the statement timeout is in force on the store's connections, and ends a statement that runs past it", async () => {
      const store = await open(storeOptions());
      const shown = await Promise.all(Array.from({ length: 12 }, () => store.pool.query<{ statement_timeout: string }>('SHOW statement_timeout')));
      expect(shown.map((r) => r.rows[0]!.statement_timeout)).toEqual(Array(12).fill('7s'));
      const short = await open({ ...storeOptions(), statementTimeoutMs: 200 });
      await expect(short.pool.query('SELECT pg_sleep(5)')).rejects.toMatchObject({ code: '57014' });
    });

    it('admits, replays and refuses stale fences under concurrency with zero store errors', async () => {
      const gw = await gateway({ ...storeOptions(), ...(mode === 'transaction' ? { listenConnectionString: POSTGRES_URL! } : {}) });
      const before = up.effects;
      const N = 40;
      const first = await Promise.all(
        Array.from({ length: N }, (_, i) => command(gw.url, '/payments/charges', { fence: 5, entity: `pgb-${i % 10}-${i}`, key: `pgb-${mode}-${i}` })),
      );
      expect(first.map((r) => r.status)).toEqual(Array(N).fill(201));
      await Promise.all(first.map((r) => r.arrayBuffer()));
      const replays = await Promise.all(
        Array.from({ length: N }, (_, i) => command(gw.url, '/payments/charges', { fence: 5, entity: `pgb-${i % 10}-${i}`, key: `pgb-${mode}-${i}` })),
      );
      expect(replays.map((r) => `${r.status} ${r.headers.get('idempotent-replayed')}`)).toEqual(Array(N).fill('201 true'));
      await Promise.all(replays.map((r) => r.arrayBuffer()));
      const stale = await Promise.all(
        Array.from({ length: N }, (_, i) => command(gw.url, '/payments/charges', { fence: 4, entity: `pgb-${i % 10}-${i}`, key: `pgb-${mode}-stale-${i}` })),
      );
      for (const r of stale) await expectProblem(r, 409, 'stale-fence');
      expect(up.effects - before).toBe(N);
      const text = await metrics(gw);
      expect([errorsOf(text, 'admit'), errorsOf(text, 'finish')]).toEqual([0, 0]);
      // Cross-replica wake-ups: LISTEN through a session pooler, or on the direct URL beside a transaction pooler.
      await until(() => gw.store.listening || null, 'the LISTEN connection');
      expect(gw.lines.filter((l) => l.level !== 'info' && l.msg !== 'global-keys' && l.msg !== 'credential-hash-unkeyed')).toEqual([]);
    });

    for (const statementTimeoutMs of [5_000, undefined]) {
      it(`the lease store, opened as the heartbeat thread opens it (openJobStore, statement timeout ${statementTimeoutMs ?? "the server's"}), migrates, claims, extends and completes through it`, async () => {
        const jobs = await openJobStore(
          { postgres: bouncer.url.replace('postgres@', `${leaseRole}@`), ...(mode === 'transaction' ? { pooler: 'transaction' as const } : {}) },
          statementTimeoutMs === undefined ? {} : { statementTimeoutMs },
        );
        const kind = `pgb-${statementTimeoutMs ?? 'none'}`;
        try {
          const N = 20;
          await Promise.all(Array.from({ length: N }, (_, i) => jobs.enqueue({ kind, idempotencyKey: `${kind}-${i}`, payload: { i } })));
          const leases = await Promise.all(Array.from({ length: N }, (_, i) => jobs.claim({ workerId: `w${i}`, kinds: [kind], leaseMs: 60_000 })));
          const held = leases.map((c) => c.lease).filter((l) => l !== null);
          expect(held).toHaveLength(N);
          expect((await Promise.all(held.map((l) => jobs.extend(l)))).every((r) => r.ok)).toBe(true);
          expect((await Promise.all(held.map((l) => jobs.complete(l, { done: true })))).every((r) => r.ok)).toBe(true);
          expect((await jobs.counts()).filter((c) => c.kind === kind)).toEqual([{ state: 'succeeded', kind, count: N }]);
        } finally {
          await jobs.close();
        }
      });
    }

    if (mode === 'transaction') {
      it('`fencegate migrate` and `fencegate serve` with store.schema, store.pooler and store.listenUrl from the config file', async () => {
        const tmp = tempDir('fencegate-pgb-cli-');
        try {
          const cliSchema = `${schema.schema}_cli`;
          const config = writeJson(join(tmp.dir, 'config.json'), {
            listen: { host: '127.0.0.1', port: 0 },
            store: { postgres: bouncer.url, poolSize: 4, schema: cliSchema, pooler: 'transaction', listenUrl: POSTGRES_URL },
            routes: [paymentsRoute(up.url)],
          });
          const migrated = await runNode([CLI, 'migrate', '--config', config]);
          expect(migrated.code, migrated.stderr).toBe(0);
          const child = await startGatewayChild([CLI, 'serve', '--config', config]);
          const first = await command(child.url, '/payments/charges', { fence: 3, entity: 'pgb-cli', key: 'pgb-cli-1' });
          expect(first.status).toBe(201);
          const replay = await command(child.url, '/payments/charges', { fence: 3, entity: 'pgb-cli', key: 'pgb-cli-1' });
          expect(replay.headers.get('idempotent-replayed')).toBe('true');
          await expectProblem(await command(child.url, '/payments/charges', { fence: 2, entity: 'pgb-cli', key: 'pgb-cli-2' }), 409, 'stale-fence');
          expect(child.lines.filter((l) => l.msg === 'listen-unavailable')).toEqual([]);
          await child.kill();
          const rows = await schema.pool.query(`SELECT count(*)::int AS n FROM ${cliSchema}.idempotency_records`);
          expect(rows.rows[0].n).toBe(1);
          await schema.pool.query(`DROP SCHEMA ${cliSchema} CASCADE`);
        } finally {
          tmp.cleanup();
        }
      });

      it('without a LISTEN URL: polling, and the log says so once at start', async () => {
        const gw = await gateway(storeOptions());
        expect(gw.store.listening).toBe(false);
        expect(gw.lines.filter((l) => l.msg === 'listen-unavailable')).toHaveLength(1);
        const res = await command(gw.url, '/payments/charges', { fence: 1, entity: 'pgb-poll', key: 'pgb-poll' });
        expect(res.status).toBe(201);
      });

      it('named prepared statements through it: parallel reads fail on a store not told about the pooler (the control), none on one told', async () => {
        // Six connections of the store parse the same statement name; the pooler has two server
        // connections, and a name parsed twice on one is refused (42P05), one parsed elsewhere is unknown (26000).
        const reads = (store: PostgresGatewayStore) => Promise.allSettled(Array.from({ length: 12 }, (_, i) => store.getEntity(`pgb-read-${i}`)));
        const { pooler: _, ...plain } = storeOptions();
        const broken = (await reads(await open(plain))).filter((r) => r.status === 'rejected');
        expect(broken.length).toBeGreaterThan(0);
        for (const r of broken) expect(['42P05', '26000']).toContain((r as PromiseRejectedResult).reason.code);
        const told = await reads(await open(storeOptions()));
        expect(told.filter((r) => r.status === 'rejected')).toEqual([]);
      });
    }
  });
}
