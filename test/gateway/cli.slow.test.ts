import Database from 'better-sqlite3';
import { existsSync, readdirSync, readlinkSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ConfigError, parseConfig, parseConfigText } from '../../src/config/load.js';
import { startGateway } from '../../src/entry/node.js';
import { createGateway } from '../../src/http/gateway.js';
import { silentLogger } from '../../src/http/logger.js';
import type { GatewayStore } from '../../src/store/types.js';
import { tempDir } from '../helpers/gateway.js';
import { createTestSchema, POSTGRES_URL } from '../helpers/postgres.js';
import { CLI, killAll as killChildren, runNode, startGatewayChild, writeJson } from '../helpers/child.js';

// The `fencegate` CLI as a child process: an invalid configuration stops
// start-up with a message naming the field (DESIGN §5, CONTRIBUTING.md convention 4).

const tmp = tempDir();
afterAll(async () => {
  await killChildren();
  tmp.cleanup();
});

const route = { name: 'payments', match: { path: '/payments/*' }, upstream: 'http://127.0.0.1:9' };
const withRoute = (over: Record<string, unknown>) => ({ routes: [{ ...route, ...over }] });

const badConfigs: { name: string; config: unknown; field: RegExp }[] = [
  { name: 'not JSON', config: '{"routes": [', field: /not valid JSON/ },
  { name: 'no routes', config: {}, field: /^ {2}routes: /m },
  { name: 'empty routes', config: { routes: [] }, field: /^ {2}routes: .*>=1/m },
  { name: 'unknown top-level field', config: { ...withRoute({}), lisen: {} }, field: /\(root\): unknown key "lisen" \(did you mean "listen"\?\)/ },
  { name: 'unknown route field', config: withRoute({ timeout: 5 }), field: /routes\[0\]: unknown key "timeout" \(did you mean "timeoutMs"\?\)/ },
  { name: 'unknown key, another case', config: withRoute({ timeoutMS: 5 }), field: /routes\[0\]: unknown key "timeoutMS" \(did you mean "timeoutMs"\?\)/ },
  { name: 'unknown key far from every known one', config: { ...withRoute({}), zzzzzzzz: 1 }, field: /\(root\): unknown key "zzzzzzzz"$/m },
  { name: 'no upstream', config: { routes: [{ name: 'p', match: { path: '/p/*' } }] }, field: /routes\[0\]\.upstream: required$/m },
  { name: 'timeoutMs of zero', config: withRoute({ timeoutMs: 0 }), field: /routes\[0\]\.timeoutMs: / },
  { name: 'maxBodyBytes not an integer', config: withRoute({ maxBodyBytes: 1.5 }), field: /routes\[0\]\.maxBodyBytes: / },
  { name: 'upstream not an http URL', config: withRoute({ upstream: 'ftp://example.com' }), field: /routes\[0\]\.upstream: must be an http/ },
  {
    name: 'upstream with a query',
    config: withRoute({ upstream: 'http://127.0.0.1:9000?token=1' }),
    field: /routes\[0\]\.upstream: must be a base URL without a query or fragment/,
  },
  {
    name: 'upstream with a fragment',
    config: withRoute({ upstream: 'http://127.0.0.1:9000/#x' }),
    field: /routes\[0\]\.upstream: must be a base URL without a query or fragment/,
  },
  { name: 'fence mode unknown', config: withRoute({ fence: 'maybe' }), field: /routes\[0\]\.fence: / },
  { name: 'mode unknown', config: withRoute({ mode: 'parallel' }), field: /routes\[0\]\.mode: / },
  { name: 'onUnknown unknown', config: withRoute({ onUnknown: 'ignore' }), field: /routes\[0\]\.onUnknown: / },
  { name: 'retention not a duration', config: withRoute({ retention: 'forever' }), field: /routes\[0\]\.retention: must be a duration/ },
  {
    name: 'entity of an unknown kind',
    config: withRoute({ entity: { cookie: 'job' } }),
    field: /routes\[0\]\.entity: unknown kind "cookie" \(expected one of "header", "path", "json"\)/,
  },
  {
    name: 'path entity not in match.path',
    config: withRoute({ entity: { path: ':invoice' } }),
    field: /routes\[0\]\.entity\.path: ":invoice" is not a parameter/,
  },
  { name: 'json entity not a pointer', config: withRoute({ entity: { json: 'invoice' } }), field: /routes\[0\]\.entity\.json: must be a JSON pointer/ },
  { name: 'wildcard in the middle of a path', config: withRoute({ match: { path: '/a/*/b' } }), field: /routes\[0\]\.match\.path: may only end with/ },
  { name: 'unknown method', config: withRoute({ match: { path: '/p/*', methods: ['FETCH'] } }), field: /routes\[0\]\.match\.methods\[0\]: / },
  {
    name: 'duplicate route names',
    config: { routes: [route, { ...route, match: { path: '/other/*' } }] },
    field: /routes\[1\]\.name: duplicate route name "payments"/,
  },
  {
    name: 'route under the admin prefix',
    config: withRoute({ match: { path: '/_fencegate/x' } }),
    field: /routes\[0\]\.match\.path: overlaps the admin prefix/,
  },
  {
    name: 'replayHeaders with set-cookie',
    config: withRoute({ replayHeaders: ['content-type', 'Set-Cookie'] }),
    field: /routes\[0\]\.replayHeaders: may not contain set-cookie/,
  },
  { name: 'listen.port out of range', config: { ...withRoute({}), listen: { port: 70000 } }, field: /listen\.port: / },
  {
    name: 'store of an unknown kind',
    config: { ...withRoute({}), store: { mysql: 'x' } },
    field: /store: unknown kind "mysql" \(expected one of "sqlite", "postgres", "d1"\)/,
  },
  { name: 'store of no kind', config: { ...withRoute({}), store: {} }, field: /store: needs one of "sqlite", "postgres", "d1"/ },
  {
    name: 'a typo in the store',
    config: { ...withRoute({}), store: { sqlite: 'x', synchronus: 'FULL' } },
    field: /store: unknown key "synchronus" \(did you mean "synchronous"\?\)/,
  },
  { name: 'sweepInterval not a duration', config: { ...withRoute({}), sweepInterval: 'often' }, field: /sweepInterval: must be a duration/ },
  {
    name: 'upstream credential from a missing environment variable',
    config: withRoute({ upstreamHeaders: { Authorization: { env: 'FENCEGATE_TEST_MISSING_SECRET', prefix: 'Bearer ' } } }),
    field: /routes\[0\]\.upstreamHeaders\.Authorization: environment variable FENCEGATE_TEST_MISSING_SECRET is not set/,
  },
];

/** Builds the gateway from config text as `fencegate serve` does, without opening a store or a port. */
function buildFrom(text: string): void {
  const config = parseConfigText(text, 'config.json');
  const store = { kind: 'none' } as unknown as GatewayStore;
  createGateway({ config, store, forwarder: { forward: async () => ({ kind: 'refused', error: 'none' }) }, env: {} });
}

const textOf = (config: unknown) => (typeof config === 'string' ? config : JSON.stringify(config));

describe('an invalid configuration stops start-up with a message naming the field', () => {
  it.each(badConfigs.map((b) => [b.name, b] as const))('%s', (_name, bad) => {
    let error: unknown;
    try {
      buildFrom(textOf(bad.config));
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).message).toMatch(bad.field);
  });

  // The same through the real CLI, for a sample of the table (each child costs a Node start-up).
  const sample = ['not JSON', 'path entity not in match.path', 'upstream credential from a missing environment variable'];
  it.concurrent.each(sample.map((name) => [name, badConfigs.find((b) => b.name === name)!] as const))(
    'fencegate serve: %s → exit 1, stderr names the field',
    async (name, bad) => {
      const file = join(tmp.dir, `bad-${sample.indexOf(name)}.json`);
      writeFileSync(file, textOf(bad.config));
      const db = join(tmp.dir, `bad-${sample.indexOf(name)}.db`);
      const { code, stdout, stderr } = await runNode([CLI, 'serve', '--config', file, '--db', db, '--port', '0'], { FENCEGATE_TEST_MISSING_SECRET: '' });
      expect(code, stdout).toBe(1);
      expect(stderr).toMatch(/^fencegate: /);
      expect(stderr).toMatch(bad.field);
      expect(stdout).not.toMatch(/"listening"/);
    },
  );

  it('a config file that cannot be read', async () => {
    const { code, stderr } = await runNode([CLI, 'serve', '--config', join(tmp.dir, 'missing.json')]);
    expect(code).toBe(1);
    expect(stderr).toMatch(/cannot read config file .*missing\.json/);
  });
});

describe('fencegate usage', () => {
  it('--help prints the usage and exits 0', async () => {
    const { code, stdout } = await runNode([CLI, '--help']);
    expect(code).toBe(0);
    expect(stdout).toMatch(/Usage:/);
    expect(stdout).toMatch(/fencegate serve +--config FILE/);
    expect(stdout).toMatch(/fencegate migrate/);
  });

  it.concurrent.each([
    ['an unknown command', ['launch'], /unknown command "launch"/],
    ['serve without --config', ['serve'], /serve needs --config/],
  ])('%s: exit 2 with the usage', async (_name, args, message) => {
    const { code, stdout, stderr } = await runNode([CLI, ...args]);
    expect(code).toBe(2);
    expect(stdout + stderr).toMatch(message);
  });
});

describe('fencegate migrate --db', () => {
  it('creates the gateway tables; a second run applies nothing; serve runs on the file', async () => {
    const db = join(tmp.dir, 'migrated.db');
    const first = await runNode([CLI, 'migrate', '--db', db]);
    expect(first.code, first.stderr).toBe(0);
    const applied = JSON.parse(first.stdout.trim().split('\n').pop()!);
    expect(applied).toMatchObject({ msg: 'migrated', store: 'sqlite' });
    expect(applied.applied).toContain('0001_gateway.sql');
    expect(existsSync(db)).toBe(true);

    const conn = new Database(db, { readonly: true });
    try {
      const tables = (conn.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all() as { name: string }[]).map((t) => t.name);
      expect(tables).toEqual(expect.arrayContaining(['fence_entities', 'idempotency_records', 'rejections', 'fencegate_migrations']));
    } finally {
      conn.close();
    }

    const second = await runNode([CLI, 'migrate', '--db', db]);
    expect(second.code).toBe(0);
    expect(JSON.parse(second.stdout.trim().split('\n').pop()!).applied).toEqual([]);

    // A gateway started on the migrated file answers /health.
    const config = writeJson(join(tmp.dir, 'good.json'), withRoute({}));
    const child = await startGatewayChild([CLI, 'serve', '--config', config, '--db', db, '--port', '0']);
    expect(await (await fetch(`${child.url}/_fencegate/health`)).json()).toEqual({ status: 'ok' });
    child.proc.kill('SIGTERM');
    expect((await child.exited).code).toBe(0);
  });
});

// A start-up that fails must not leave the SQLite file open behind the error
// (a library user who catches it and starts again would hold two handles).
// Linux-only check: the open descriptors of this process in /proc/self/fd.

const openHandles = (path: string) =>
  readdirSync('/proc/self/fd').filter((fd) => {
    try {
      return readlinkSync(`/proc/self/fd/${fd}`).startsWith(path);
    } catch {
      return false;
    }
  }).length;

const pRoute = { name: 'p', match: { path: '/p/*' }, upstream: 'http://127.0.0.1:9' };

describe.skipIf(!existsSync('/proc/self/fd'))('a failed start-up closes what it opened', () => {
  it('a missing upstream credential: ConfigError, and the store is closed', async () => {
    const db = join(tmp.dir, 'env.db');
    const config = parseConfig({
      listen: { port: 0 },
      store: { sqlite: db },
      routes: [{ ...pRoute, upstreamHeaders: { Authorization: { env: 'FENCEGATE_TEST_NOT_SET' } } }],
    });
    await expect(startGateway({ config, logger: silentLogger, env: {} })).rejects.toBeInstanceOf(ConfigError);
    expect(openHandles(db)).toBe(0);
  });

  it('a port in use: the listen error, and the store is closed', async () => {
    const squatter = createServer();
    await new Promise<void>((r) => squatter.listen(0, '127.0.0.1', () => r()));
    try {
      const db = join(tmp.dir, 'port.db');
      const config = parseConfig({ listen: { host: '127.0.0.1', port: (squatter.address() as AddressInfo).port }, store: { sqlite: db }, routes: [pRoute] });
      await expect(startGateway({ config, logger: silentLogger })).rejects.toThrow(/EADDRINUSE/);
      expect(openHandles(db)).toBe(0);
    } finally {
      squatter.close();
    }
  });
});

// `fencegate migrate --lease` migrates the lease module's schema (tool_jobs,
// its own ledger) on the store's database, and none of the gateway's.

const lastLine = (stdout: string) => JSON.parse(stdout.trim().split('\n').pop()!);
const GATEWAY_TABLES = ['fence_entities', 'idempotency_records', 'rejections', 'fencegate_migrations'];

describe('fencegate migrate --lease', () => {
  it('SQLite: creates tool_jobs and its ledger, no gateway table; a second run applies nothing', async () => {
    const db = join(tmp.dir, 'lease-only.db');
    const first = await runNode([CLI, 'migrate', '--lease', '--db', db]);
    expect(first.code, first.stderr).toBe(0);
    const line = lastLine(first.stdout);
    expect(line).toMatchObject({ msg: 'migrated', store: 'sqlite', schema: 'lease' });
    expect(line.applied.length).toBeGreaterThan(0);

    const conn = new Database(db, { readonly: true });
    try {
      const tables = (conn.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all() as { name: string }[]).map((t) => t.name);
      expect(tables).toEqual(expect.arrayContaining(['tool_jobs', 'tool_job_store', 'fencegate_lease_migrations']));
      for (const t of GATEWAY_TABLES) expect(tables).not.toContain(t);
      const ledger = (conn.prepare('SELECT name FROM fencegate_lease_migrations ORDER BY name').all() as { name: string }[]).map((r) => r.name);
      expect(ledger).toEqual(line.applied);
    } finally {
      conn.close();
    }

    const second = await runNode([CLI, 'migrate', '--lease', '--db', db]);
    expect(second.code, second.stderr).toBe(0);
    expect(lastLine(second.stdout).applied).toEqual([]);

    // Control: the same file without --lease gets the gateway's tables, so
    // the check above would have seen them had --lease been ignored.
    const gateway = await runNode([CLI, 'migrate', '--db', db]);
    expect(gateway.code, gateway.stderr).toBe(0);
    expect(lastLine(gateway.stdout).applied).toContain('0001_gateway.sql');
    const after = new Database(db, { readonly: true });
    try {
      const tables = (after.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all() as { name: string }[]).map((t) => t.name);
      expect(tables).toEqual(expect.arrayContaining(GATEWAY_TABLES));
    } finally {
      after.close();
    }
  });

  it.skipIf(!POSTGRES_URL)('PostgreSQL (fresh schema): creates tool_jobs and its ledger, no gateway table', async () => {
    const schema = await createTestSchema('cli_lease', 1);
    try {
      const tablesOf = async () =>
        (await schema.pool.query<{ t: string }>('SELECT table_name AS t FROM information_schema.tables WHERE table_schema = $1', [schema.schema])).rows.map(
          (r) => r.t,
        );
      const first = await runNode([CLI, 'migrate', '--lease', '--database-url', schema.url]);
      expect(first.code, first.stderr).toBe(0);
      const line = lastLine(first.stdout);
      expect(line).toMatchObject({ msg: 'migrated', store: 'postgres', schema: 'lease' });
      expect(line.applied.length).toBeGreaterThan(0);
      const tables = await tablesOf();
      expect(tables).toEqual(expect.arrayContaining(['tool_jobs', 'tool_job_store', 'fencegate_lease_migrations']));
      for (const t of GATEWAY_TABLES) expect(tables).not.toContain(t);

      const second = await runNode([CLI, 'migrate', '--lease', '--database-url', schema.url]);
      expect(second.code, second.stderr).toBe(0);
      expect(lastLine(second.stdout).applied).toEqual([]);
    } finally {
      await schema.drop();
    }
  });
});
