/**
 * The gateway and the lease module each own their schema: their own folder
 * (migrations/gateway, migrations/lease) and their own ledger. A new
 * gateway database gets no job tables, a new worker database no gateway
 * tables. A database the last single-ledger release created (both parts in
 * `fencegate_migrations`) is upgraded in place by both sides: nothing lost,
 * nothing applied twice, and the result is the schema a fresh database of
 * both parts has.
 *
 * Negative control: the lease ledger without adoption of the old ledger's
 * rows runs 0002 and 0007 again (SQLite: duplicate column, PostgreSQL:
 * both re-applied).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { loadMigrations, LEDGERS } from '../../src/db/migrations.js';
import { applyPostgresMigrations } from '../../src/db/postgres-migrate.js';
import { applySqliteMigrations } from '../../src/db/sqlite-migrate.js';
import { migrateLeasePostgres, migrateLeaseSqlite } from '../../src/lease/migrate.js';
import { createPostgresJobStore } from '../../src/lease/postgres/store.js';
import { createSqliteJobStore } from '../../src/lease/sqlite/store.js';
import type { JobStore } from '../../src/lease/types.js';
import { createPostgresStore, migratePostgres } from '../../src/store/postgres/index.js';
import { FUNCTION_FILES } from '../../src/store/postgres/functions.js';
import { SqliteGatewayStore, migrateSqlite, openSqlite } from '../../src/store/sqlite/index.js';
import type { AdmitInput, GatewayStore } from '../../src/store/types.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { command, finishOf, response } from '../store/conformance.js';
import { gatewayMigrationsSince, migratePostgresAsReleased, migrateSqliteAsReleased, releasedMigrations, releasedPostgresAdmit } from './previous-release.js';
import { dumpPostgres, dumpSqlite } from './schema-dump.js';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const GATEWAY_TABLES = ['commands', 'fence_entities', 'fence_history', 'idempotency_records', 'operator_actions', 'rejections'];
const LEASE_TABLES = ['tool_job_store', 'tool_jobs'];
const LEASE_MIGRATIONS = ['0002_tool_jobs.sql', '0007_tool_job_store.sql'];

function tempFile(name: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-split-'));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return join(dir, name);
}

/** What the previous release's gateway and worker left in their shared database; checked again after the upgrade. */
interface Written {
  entity: string;
  doneKey: ReturnType<typeof command>;
  body: Uint8Array;
  storeId: string;
  jobId: number;
  lease: { id: number; ownerId: string; fencingToken: number; leaseMs: number };
}

/** `admit`: the previous release's admission (PostgreSQL: its own call of the function, see previous-release.ts). */
async function writeState(gateway: GatewayStore, jobs: JobStore, admit = async (c: AdmitInput) => (await gateway.admit(c)).outcome): Promise<Written> {
  const entity = 'acct:1';
  const body = new Uint8Array(3000).map((_, i) => i % 251);
  const first = command({ entity: 'acct:2', fence: 7n });
  expect(await admit(first)).toBe('forward');
  await gateway.finish(finishOf(first, 'completed', response({ body })));
  const inFlight = command({ entity, fence: 9n });
  expect(await admit(inFlight)).toBe('forward'); // holds the serial slot
  expect(await admit(command({ entity, fence: 3n }))).toBe('stale-fence');
  const enqueued = await jobs.enqueue({ kind: 'pay', idempotencyKey: 'order-1', payload: { amount: 1200 } });
  const claimed = await jobs.claim({ workerId: 'worker-a' });
  expect(claimed.lease).not.toBeNull();
  const l = claimed.lease!;
  return {
    entity,
    doneKey: first,
    body,
    storeId: jobs.storeId,
    jobId: enqueued.job.id,
    lease: { id: l.id, ownerId: l.ownerId, fencingToken: l.fencingToken, leaseMs: l.leaseMs },
  };
}

async function checkState(gateway: GatewayStore, jobs: JobStore, w: Written): Promise<void> {
  // The fence: 8 is stale against 9; the slot of the request in flight is still held.
  expect(await gateway.admit(command({ entity: w.entity, fence: 8n }))).toEqual({ outcome: 'stale-fence', currentFence: 9n });
  expect((await gateway.admit(command({ entity: w.entity, fence: 10n }))).outcome).toBe('entity-busy');
  // The stored response replays byte for byte.
  const again = await gateway.admit({ ...w.doneKey, ownerToken: 'after-upgrade' });
  expect(again.outcome).toBe('replay');
  expect(again.outcome === 'replay' && Buffer.from(again.response.body).equals(Buffer.from(w.body))).toBe(true);
  // The rejection log and the fence history.
  expect((await gateway.listRejections({ entity: w.entity, limit: 10 })).items.map((r) => r.reason)).toContain('stale-fence');
  // The job store: same identity, the claimed lease still owns its job.
  expect(jobs.storeId).toBe(w.storeId);
  expect(await jobs.get(w.jobId)).toMatchObject({ state: 'running', fencingToken: w.lease.fencingToken, ownerId: 'worker-a' });
  expect(await jobs.complete(w.lease, { paid: true })).toEqual({ ok: true });
}

describe('the gateway and the lease module each migrate their own schema (SQLite)', () => {
  const tables = (db: ReturnType<typeof openSqlite>) =>
    (db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name").all() as { name: string }[]).map(
      (r) => r.name,
    );

  it('a new gateway database has only gateway tables, a new worker database only job tables', () => {
    const gateway = openSqlite(tempFile('gateway.db'));
    const jobs = openSqlite(tempFile('jobs.db'));
    cleanups.push(
      () => void gateway.close(),
      () => void jobs.close(),
    );
    expect(migrateSqlite(gateway)).toEqual(loadMigrations('gateway', 'sqlite').map((m) => m.name));
    expect(migrateLeaseSqlite(jobs)).toEqual(LEASE_MIGRATIONS);
    expect(tables(gateway)).toEqual([...GATEWAY_TABLES.slice(0, 2), 'fencegate_migrations', ...GATEWAY_TABLES.slice(2), 'admission_scratch'].sort());
    expect(tables(jobs)).toEqual(['fencegate_lease_migrations', ...LEASE_TABLES]);
    expect(migrateSqlite(gateway)).toEqual([]);
    expect(migrateLeaseSqlite(jobs)).toEqual([]);
  });

  it("upgrades the previous release's shared database in place: nothing lost, nothing applied twice", async () => {
    const path = tempFile('shared.db');
    const raw = openSqlite(path);
    cleanups.push(() => void raw.close());
    expect(migrateSqliteAsReleased(raw)).toEqual(releasedMigrations('sqlite').map((m) => m.name));
    expect(raw.prepare('SELECT count(*) AS n FROM fencegate_migrations').get()).toEqual({ n: 7 });
    // Today's store writes the previous release's rows. Its rejection insert
    // names the tool column (0009), its record writes and reads the columns
    // of 0010, so the columns are there for the writes only and dropped
    // again: the upgrade below starts from the released schema.
    const later = [
      'rejections ADD COLUMN tool TEXT',
      'idempotency_records ADD COLUMN attempt_until INTEGER',
      'idempotency_records ADD COLUMN request_id TEXT',
      'idempotency_records ADD COLUMN reconcile_result TEXT',
      'idempotency_records ADD COLUMN reconciled_at INTEGER',
    ];
    for (const c of later) raw.exec(`ALTER TABLE ${c}`);
    // And its command-log insert names the commands table (0011): there for the writes only too.
    raw.exec(
      'CREATE TABLE commands (id INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL, outcome TEXT NOT NULL, route TEXT, method TEXT, path TEXT, entity TEXT, fence INTEGER, idempotency_key TEXT, scope TEXT, caller TEXT, tool TEXT, decision TEXT, status INTEGER, upstream_ms REAL, request_id TEXT, client_request_id TEXT, payload_sha256 TEXT)',
    );
    const before = new SqliteGatewayStore({ path, migrate: false });
    const oldJobs = createSqliteJobStore({ path, migrate: false });
    const written = await writeState(before, oldJobs);
    await oldJobs.close();
    await before.close();
    for (const c of later) raw.exec(`ALTER TABLE ${c.replace(/ADD COLUMN (\w+) \w+$/, 'DROP COLUMN $1')}`);
    raw.exec('DROP TABLE commands');
    const ledgerBefore = raw.prepare('SELECT name, applied_at FROM fencegate_migrations ORDER BY name').all();

    // Only the gateway migrations after that release run; nothing runs twice.
    expect(migrateSqlite(raw)).toEqual(gatewayMigrationsSince('sqlite'));
    expect(migrateLeaseSqlite(raw)).toEqual([]);
    const released = new Set((ledgerBefore as { name: string }[]).map((r) => r.name));
    expect(
      (raw.prepare('SELECT name, applied_at FROM fencegate_migrations ORDER BY name').all() as { name: string }[]).filter((r) => released.has(r.name)),
    ).toEqual(ledgerBefore);
    // The lease ledger took its rows over from the old one, times included.
    expect(raw.prepare('SELECT name, applied_at FROM fencegate_lease_migrations ORDER BY name').all()).toEqual(
      (ledgerBefore as { name: string }[]).filter((r) => LEASE_MIGRATIONS.includes(r.name)),
    );

    const gateway = new SqliteGatewayStore({ path });
    const jobs = createSqliteJobStore({ path });
    cleanups.push(
      () => gateway.close(),
      () => jobs.close(),
    );
    await checkState(gateway, jobs, written);

    // The same schema as a fresh database that both parts migrated.
    const fresh = openSqlite(tempFile('fresh.db'));
    cleanups.push(() => void fresh.close());
    migrateSqlite(fresh);
    migrateLeaseSqlite(fresh);
    expect(dumpSqlite(raw)).toBe(dumpSqlite(fresh));
  });

  it('negative control: without adopting the old ledger, the lease migrations run again and fail', () => {
    const raw = openSqlite(tempFile('shared.db'));
    cleanups.push(() => void raw.close());
    migrateSqliteAsReleased(raw);
    expect(() => applySqliteMigrations(raw, { table: LEDGERS.lease.table }, loadMigrations('lease', 'sqlite'))).toThrow(/duplicate column name: store_id/);
  });
});

describe.skipIf(!POSTGRES_URL)('the gateway and the lease module each migrate their own schema (PostgreSQL)', () => {
  const schemaOf = async (prefix: string): Promise<TestSchema> => {
    const s = await createTestSchema(prefix, 4);
    cleanups.push(() => s.drop());
    return s;
  };
  const tables = async (s: TestSchema) =>
    (await s.pool.query<{ t: string }>('SELECT table_name AS t FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1', [s.schema])).rows.map(
      (r) => r.t,
    );
  const functionsIn = async (s: TestSchema) =>
    (await s.pool.query<{ n: string }>('SELECT count(*)::text AS n FROM pg_proc WHERE pronamespace = $1::regnamespace', [s.schema])).rows[0]!.n;

  it('a new gateway schema has only gateway tables and functions, a new worker schema only job tables', async () => {
    const gateway = await schemaOf('fg_split_gw');
    const jobs = await schemaOf('fg_split_jobs');
    expect(await migratePostgres(gateway.pool)).toEqual([
      ...loadMigrations('gateway', 'postgres').map((m) => m.name),
      ...FUNCTION_FILES.map((f) => `functions/${f}`),
    ]);
    expect(await migrateLeasePostgres(jobs.pool)).toEqual(LEASE_MIGRATIONS);
    expect(await tables(gateway)).toEqual([...GATEWAY_TABLES, 'fencegate_functions', 'fencegate_migrations'].sort());
    expect(await tables(jobs)).toEqual(['fencegate_lease_migrations', ...LEASE_TABLES]);
    expect(await functionsIn(jobs)).toBe('0');
    expect(await migratePostgres(gateway.pool)).toEqual([]);
    expect(await migrateLeasePostgres(jobs.pool)).toEqual([]);
  });

  it("upgrades the previous release's shared schema in place: nothing lost, nothing applied twice", async () => {
    const shared = await schemaOf('fg_split_old');
    expect(await migratePostgresAsReleased(shared.pool)).toEqual(releasedMigrations('postgres').map((m) => m.name));
    expect((await shared.pool.query('SELECT count(*)::int AS n FROM fencegate_migrations')).rows[0]).toEqual({ n: 7 });
    // Today's finish statement writes its command-log row (0011): the table is there for the writes only.
    await shared.pool.query(
      'CREATE TABLE commands (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at timestamptz NOT NULL, route text, method text, path text, entity text, fence bigint, idempotency_key text, scope text, caller text, tool text, outcome text NOT NULL, decision text, status integer, upstream_ms double precision, request_id text, client_request_id text, payload_sha256 text)',
    );
    const before = await createPostgresStore({ connectionString: shared.url, migrate: false, listen: false });
    const oldJobs = await createPostgresJobStore({ connectionString: shared.url, migrate: false });
    const written = await writeState(before, oldJobs, releasedPostgresAdmit(shared.pool));
    await oldJobs.close();
    await before.close();
    await shared.pool.query('DROP TABLE commands');
    const ledger = 'SELECT name, applied_at::text AS at FROM fencegate_migrations ORDER BY name';
    const ledgerBefore = (await shared.pool.query(ledger)).rows;

    // No migration runs again: only the gateway's since that release, then the function files (see postgres-functions.test.ts).
    expect(await migratePostgres(shared.pool)).toEqual([...gatewayMigrationsSince('postgres'), ...FUNCTION_FILES.map((f) => `functions/${f}`)]);
    expect(await migrateLeasePostgres(shared.pool)).toEqual([]);
    const released = new Set(ledgerBefore.map((r: { name: string }) => r.name));
    expect((await shared.pool.query(ledger)).rows.filter((r: { name: string }) => released.has(r.name))).toEqual(ledgerBefore);
    expect((await shared.pool.query('SELECT name, applied_at::text AS at FROM fencegate_lease_migrations ORDER BY name')).rows).toEqual(
      ledgerBefore.filter((r: { name: string }) => LEASE_MIGRATIONS.includes(r.name)),
    );

    const gateway = await createPostgresStore({ connectionString: shared.url, listen: false });
    const jobs = await createPostgresJobStore({ connectionString: shared.url });
    cleanups.push(
      () => gateway.close(),
      () => jobs.close(),
    );
    await checkState(gateway, jobs, written);
    // A replica of that release still running (rolling upgrade): its 18-argument call reaches today's function, tool NULL.
    const late = command({ entity: written.entity, fence: 2n });
    expect(await releasedPostgresAdmit(shared.pool)(late)).toBe('stale-fence');
    expect((await gateway.listRejections({ entity: written.entity, limit: 10 })).items.find((r) => r.requestId === late.audit.requestId)).toMatchObject({
      presentedFence: '2',
      tool: null,
    });

    const fresh = await schemaOf('fg_split_fresh');
    await migratePostgres(fresh.pool);
    await migrateLeasePostgres(fresh.pool);
    expect(await dumpPostgres(shared.pool, shared.schema)).toBe(await dumpPostgres(fresh.pool, fresh.schema));
  });

  it('negative control: without adopting the old ledger, the lease migrations are applied a second time', async () => {
    const shared = await schemaOf('fg_split_neg');
    await migratePostgresAsReleased(shared.pool);
    expect(await applyPostgresMigrations(shared.pool, { table: LEDGERS.lease.table }, loadMigrations('lease', 'postgres'))).toEqual(LEASE_MIGRATIONS);
  });
});
