import { randomUUID } from 'node:crypto';
import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresStore, migratePostgresUrl, type PostgresGatewayStore, type PostgresStoreOptions } from '../../src/store/postgres/index.js';
import { entityTopic, type AdmitInput, type FinishInput } from '../../src/store/types.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { describeGatewayStoreConformance } from './conformance.js';

describe.skipIf(!POSTGRES_URL)('PostgreSQL gateway store', () => {
  describeGatewayStoreConformance('postgres (fresh schema)', async () => {
    const schema = await createTestSchema('fg_conf');
    const opened: PostgresGatewayStore[] = [];
    // Our own application name, so that no other test file terminating
    // "fencegate" sessions can cut this suite's connections.
    const applicationName = `fg-conformance-${randomUUID().slice(0, 8)}`;
    const open = async () => {
      const s = await createPostgresStore({ connectionString: schema.url, poolSize: 12, applicationName });
      opened.push(s);
      return s;
    };
    const store = await open();
    return {
      store,
      async backdateRejections(ids, ms) {
        await schema.pool.query(`UPDATE rejections SET at = at - $1 * interval '1 millisecond' WHERE id = ANY($2::bigint[])`, [ms, ids]);
      },
      async backdate(table, column, ms, where) {
        await schema.pool.query(`UPDATE ${table} SET ${column} = ${column} - $1 * interval '1 millisecond' WHERE ${where.column} = $2`, [ms, where.value]);
      },
      async forgetAttempt(key) {
        await schema.pool.query('UPDATE idempotency_records SET attempt_until = NULL, request_id = NULL WHERE key = $1', [key]);
      },
      openReplica: open,
      async close() {
        for (const s of opened) await s.close();
        await schema.drop();
      },
    };
  });
});

// ---------------------------------------------------------------------------
// PostgreSQL-only behaviour: reconnects, cross-replica NOTIFY, schemas, migrations, leaks.

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Retries `fn` until it resolves (a store that recovers by itself), failing after `attempts`. */
async function eventually<T>(fn: () => Promise<T>, attempts = 100, pauseMs = 50): Promise<T> {
  for (let i = 0; ; i++) {
    try {
      return await fn();
    } catch (err) {
      if (i >= attempts) throw err;
      await sleep(pauseMs);
    }
  }
}

const audit = () => ({ requestId: randomUUID(), clientRequestId: null, caller: null, method: 'POST', path: '/p', payloadSha256: 'ab'.repeat(32) });
const command = (over: Partial<AdmitInput> = {}): AdmitInput => ({
  scope: 'pg',
  key: `k-${randomUUID()}`,
  entity: `e-${randomUUID()}`,
  fence: 1n,
  fingerprint: 'fp',
  mode: 'serial',
  ownerToken: `o-${randomUUID()}`,
  lockMs: 30_000,
  retentionMs: 3_600_000,
  onUnknown: 'reject',
  audit: audit(),
  ...over,
});
const completed = (c: AdmitInput): FinishInput => ({
  scope: c.scope,
  key: c.key,
  entity: c.entity,
  ownerToken: c.ownerToken,
  audit: c.audit,
  outcome: 'completed',
  response: { status: 200, headers: [], body: new Uint8Array([1, 2, 3]) },
  retentionMs: c.retentionMs,
});

/** A TCP relay in front of PostgreSQL that the test can cut (the server "goes away") and bring back on the same port. */
async function startRelay(target: URL): Promise<{ url: string; cut(): Promise<void>; restore(): Promise<void>; close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  let server: Server | null = null;
  let port = 0;
  const listen = () =>
    new Promise<void>((resolve, reject) => {
      const s = createServer((client) => {
        const upstream = connect(Number(target.port || 5432), target.hostname);
        sockets.add(client).add(upstream);
        const drop = () => {
          client.destroy();
          upstream.destroy();
          sockets.delete(client);
          sockets.delete(upstream);
        };
        client.on('error', drop).on('close', drop);
        upstream.on('error', drop).on('close', drop);
        client.pipe(upstream).pipe(client);
      });
      s.once('error', reject);
      s.listen(port, '127.0.0.1', () => {
        port = (s.address() as AddressInfo).port;
        server = s;
        resolve();
      });
    });
  const cut = async () => {
    const s = server;
    server = null;
    for (const sock of sockets) sock.destroy();
    sockets.clear();
    if (s !== null) await new Promise<void>((r) => s.close(() => r()));
  };
  await listen();
  const url = new URL(target.toString());
  url.hostname = '127.0.0.1';
  url.port = String(port);
  return { url: url.toString(), cut, restore: listen, close: cut };
}

describe.skipIf(!POSTGRES_URL)('PostgreSQL gateway store: connections, replicas, schemas', () => {
  let schema: TestSchema;
  const appName = `fg-test-${randomUUID().slice(0, 8)}`;
  const stores: PostgresGatewayStore[] = [];
  const open = async (options: Partial<PostgresStoreOptions> = {}) => {
    const s = await createPostgresStore({ connectionString: schema.url, applicationName: appName, poolSize: 6, ...options });
    stores.push(s);
    return s;
  };
  const terminate = async (application: string) => {
    const { rows } = await schema.pool.query<{ n: string }>(
      `SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`,
      [application],
    );
    return Number(rows[0]!.n);
  };
  /** The rows an admission writes, read back through another connection. */
  const stateOf = async (c: AdmitInput) => {
    const e = await schema.pool.query(`SELECT fence::text, inflight_owner FROM fence_entities WHERE entity = $1`, [c.entity]);
    const r = await schema.pool.query(`SELECT state, owner_token FROM idempotency_records WHERE scope = $1 AND key = $2`, [c.scope, c.key]);
    return { entity: e.rows[0] ?? null, record: r.rows[0] ?? null };
  };

  beforeAll(async () => {
    schema = await createTestSchema('fg_conn');
  });
  afterAll(async () => {
    for (const s of stores) await s.close();
    await schema?.drop();
  });

  it('pg_terminate_backend mid-admission: each admission is all or nothing, and the same store works again', async () => {
    const errors: string[] = [];
    const store = await open({ onError: (_err, source) => errors.push(source) });
    await store.admit(command({ entity: null, fence: null }));
    expect(store.listening).toBe(true);

    const inputs = Array.from({ length: 60 }, (_, i) => command({ fence: BigInt(i + 1) }));
    const racing = Promise.allSettled(inputs.map((c) => store.admit(c)));
    await sleep(2);
    expect(await terminate(appName)).toBeGreaterThan(0);
    const settled = await racing;

    for (const [i, c] of inputs.entries()) {
      const { entity, record } = await stateOf(c);
      const whole =
        entity?.fence === String(i + 1) && entity?.inflight_owner === c.ownerToken && record?.state === 'in_progress' && record?.owner_token === c.ownerToken;
      const none = entity === null && record === null;
      // Never half-written: fence raised without the record, a slot without its record, …
      expect({ i, ok: whole || none }).toEqual({ i, ok: true });
      const s = settled[i]!;
      if (s.status === 'fulfilled') {
        expect(s.value).toEqual({ outcome: 'forward', takeover: false });
        expect(whole).toBe(true);
      }
    }
    // How many were cut depends on timing (typically the 6 in flight on the
    // pool's connections, each rejected); the check above holds for every one.

    // The same store object recovers: new connections, a new LISTEN.
    const again = command();
    expect(await eventually(() => store.admit({ ...again, ownerToken: `o-${randomUUID()}`, key: `k-${randomUUID()}` }))).toMatchObject({ outcome: 'forward' });
    await eventually(async () => {
      if (!store.listening) throw new Error('not listening yet');
    });
    await eventually(async () => {
      if (!errors.includes('listener')) throw new Error('listener error not reported yet');
    });
  });

  it('pg_terminate_backend mid-finish: the finish lands whole or not at all; a retry settles it', async () => {
    const store = await open();
    const inputs = Array.from({ length: 40 }, () => command());
    for (const c of inputs) expect((await store.admit(c)).outcome).toBe('forward');
    const racing = Promise.allSettled(inputs.map((c) => store.finish(completed(c))));
    await sleep(2);
    await terminate(appName);
    const settled = await racing;
    for (const [i, c] of inputs.entries()) {
      const { entity, record } = await stateOf(c);
      const done = record?.state === 'completed' && entity?.inflight_owner === null;
      const untouched = record?.state === 'in_progress' && entity?.inflight_owner === c.ownerToken;
      expect({ i, ok: done || untouched }).toEqual({ i, ok: true });
      if (settled[i]!.status === 'fulfilled') expect(done).toBe(true);
      // The gateway retries a failed finish: it lands (or, if the first one
      // had committed before the cut, is reported late and changes nothing).
      if (settled[i]!.status === 'rejected') {
        const retried = await eventually(() => store.finish(completed(c)));
        expect(retried.recorded).toBe(untouched);
      }
      expect((await stateOf(c)).record?.state).toBe('completed');
    }
  });

  it('a waiter on a replica whose listener was killed is woken by NOTIFY after it re-LISTENs', async () => {
    const otherApp = `${appName}-other`;
    // pollMs far beyond the test timeout: only a notification can wake this waiter.
    const waiting = await open({ pollMs: 600_000 });
    const finisher = await createPostgresStore({ connectionString: schema.url, applicationName: otherApp, migrate: false });
    stores.push(finisher);
    await terminate(appName);
    await eventually(async () => {
      if (!waiting.listening) throw new Error('not listening yet');
      // The pool recovers too.
      await waiting.getEntity('x');
    });
    const c = command();
    expect((await finisher.admit(c)).outcome).toBe('forward');
    const wake = waiting.waitForChange(entityTopic(c.entity!), 600_000).then(() => 'woken');
    await sleep(20);
    await finisher.finish(completed(c));
    expect(await wake).toBe('woken');
    expect((await waiting.admit(command({ entity: c.entity, fence: 2n }))).outcome).toBe('forward');
  });

  it('while the server is unreachable admit throws and writes nothing; the store recovers when it is back', async () => {
    const relay = await startRelay(new URL(schema.url));
    try {
      const errors: Error[] = [];
      const store = await open({ connectionString: relay.url, connectionTimeoutMs: 1_000, onError: (err) => errors.push(err) });
      expect((await store.admit(command())).outcome).toBe('forward');
      await relay.cut();
      const lost = command();
      await expect(store.admit(lost)).rejects.toThrow();
      await expect(store.admit(command())).rejects.toThrow();
      await expect(store.listRejections({ limit: 1 })).rejects.toThrow();
      expect(await stateOf(lost)).toEqual({ entity: null, record: null });
      // Waiting never rejects, even now.
      await expect(store.waitForChange(entityTopic('x'), 5)).resolves.toBeUndefined();
      await relay.restore();
      expect(await eventually(() => store.admit(lost))).toEqual({ outcome: 'forward', takeover: false });
      await eventually(async () => {
        if (!store.listening) throw new Error('not listening yet');
      });
      await store.close();
    } finally {
      await relay.close();
    }
  });

  it('several replicas starting at once migrate safely; migratePostgresUrl then has nothing to do', async () => {
    const fresh = await createTestSchema('fg_mig');
    try {
      const opened = await Promise.all([1, 2, 3].map(() => createPostgresStore({ connectionString: fresh.url, poolSize: 2 })));
      const { rows } = await fresh.pool.query<{ name: string }>('SELECT name FROM fencegate_migrations ORDER BY name');
      expect(rows.map((r) => r.name)).toEqual(expect.arrayContaining(['0001_gateway.sql', '0003_gateway_functions.sql']));
      expect(await migratePostgresUrl(fresh.url)).toEqual([]);
      const c = command();
      expect((await opened[0]!.admit(c)).outcome).toBe('forward');
      expect((await opened[2]!.admit({ ...c, ownerToken: 'other' })).outcome).toBe('idempotency-in-progress');
      for (const s of opened) await s.close();
    } finally {
      await fresh.drop();
    }
  });

  it('schema option with a shared pool: tables and functions live in that schema; the pool stays open', async () => {
    const name = `fg_opt_${randomUUID().slice(0, 8)}`;
    const shared = new pg.Pool({ connectionString: POSTGRES_URL, max: 4 });
    try {
      const store = await createPostgresStore({ pool: shared, schema: name });
      expect(store.listening).toBe(true);
      const c = command();
      expect((await store.admit(c)).outcome).toBe('forward');
      expect(await store.finish(completed(c))).toEqual({ recorded: true });
      expect((await store.admit({ ...c, ownerToken: 'again' })).outcome).toBe('replay');
      const { rows } = await shared.query(`SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`, [name]);
      expect(rows.map((r) => r.table_name)).toEqual(expect.arrayContaining(['fence_entities', 'idempotency_records', 'rejections']));
      // The migrator's search_path did not leak into the shared pool.
      const path = await shared.query(`SELECT current_schema() AS s`);
      expect(path.rows[0].s).toBe('public');
      await store.close();
      await store.close();
      expect((await shared.query('SELECT 1 AS one')).rows[0].one).toBe(1);
      await expect(store.admit(command())).rejects.toThrow(/closed/);
    } finally {
      await shared.query(`DROP SCHEMA IF EXISTS "${name}" CASCADE`);
      await shared.end();
    }
  });

  it('close() is idempotent and leaves no connection behind', async () => {
    const app = `${appName}-leak`;
    const store = await createPostgresStore({ connectionString: schema.url, applicationName: app, poolSize: 4, migrate: false });
    await Promise.all(Array.from({ length: 8 }, () => store.admit(command({ entity: null, fence: null }))));
    await Promise.all([store.close(), store.close()]);
    await store.close();
    await eventually(async () => {
      const { rows } = await schema.pool.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1`, [app]);
      if (rows[0].n !== 0) throw new Error(`${rows[0].n} connections left`);
    });
  });
});

describe.skipIf(!POSTGRES_URL)('PostgreSQL gateway store: audit tables written by the admission', () => {
  it('every accepted fence is appended to fence_history in the admission transaction (as SQLite and D1 do)', async () => {
    const schema = await createTestSchema('fg_hist');
    const store = await createPostgresStore({ connectionString: schema.url });
    try {
      const entity = `e-${randomUUID()}`;
      for (const fence of [3n, 3n, 5n, 4n]) await store.admit(command({ entity, fence, mode: 'concurrent', audit: { ...audit(), caller: 'w1' } }));
      const { rows } = await schema.pool.query(`SELECT fence::text, caller FROM fence_history WHERE entity = $1 ORDER BY fence`, [entity]);
      expect(rows).toEqual([
        { fence: '3', caller: 'w1' },
        { fence: '5', caller: 'w1' },
      ]);
    } finally {
      await store.close();
      await schema.drop();
    }
  });
});
