import { join } from 'node:path';
import { decodeJwt } from 'jose';
import { afterEach, describe, expect, it } from 'vitest';
import { command, paymentsRoute, startTestGateway, tempDir, type TestGateway } from '../helpers/gateway.js';
import { CLI, killAll as killChildren, runNode, writeJson } from '../helpers/child.js';
import { startUpstream } from '../helpers/upstream.js';
import { AUDIENCE, bearer, ISSUER, SECRET } from '../auth/tokens.js';

// `fencegate token` and `fencegate audit` (docs/auth-audit.md), run as child
// processes from the compiled package (`npm run build` first), against a real
// gateway on loopback and straight against its SQLite file.

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  await killChildren();
  for (const c of cleanups.splice(0).reverse()) await c();
});

const ENV = { FG_TEST_JWT_SECRET: SECRET };
const auth = { secret: { env: 'FG_TEST_JWT_SECRET' }, issuer: ISSUER, audience: AUDIENCE };

async function setup(): Promise<{ gw: TestGateway; configPath: string }> {
  const tmp = tempDir();
  cleanups.push(() => tmp.cleanup());
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const route = paymentsRoute(up.url);
  const gw = await startTestGateway({ routes: [route], config: { auth }, env: ENV });
  cleanups.unshift(() => gw.close());
  const configPath = writeJson(join(tmp.dir, 'fencegate.json'), { store: { sqlite: gw.dbPath }, auth, routes: [route] });
  return { gw, configPath };
}

const mint = async (configPath: string, ...args: string[]) => {
  const r = await runNode([CLI, 'token', '--config', configPath, ...args], ENV);
  expect(r.code, r.stderr).toBe(0);
  return r.stdout.trim();
};

describe('fencegate token', () => {
  it('mints a development JWT from auth.secret that the gateway accepts', async () => {
    const { gw, configPath } = await setup();
    const t = await mint(configPath, '--sub', 'billing', '--scope', 'fencegate:proxy fencegate:audit', '--ttl', '10m');
    const claims = decodeJwt(t);
    expect(claims).toMatchObject({ sub: 'billing', iss: ISSUER, aud: AUDIENCE, scope: 'fencegate:proxy fencegate:audit' });
    expect(claims.exp! - claims.iat!).toBe(600);
    expect((await command(gw.url, '/payments/x', { fence: 1, entity: 'e', key: 'k', headers: bearer(t) })).status).toBe(201);
    expect((await fetch(`${gw.url}/_fencegate/v1/rejections`, { headers: bearer(t) })).status).toBe(200);
  });

  it('refuses what it cannot do, with a message and exit code 2', async () => {
    const { configPath } = await setup();
    const noSub = await runNode([CLI, 'token', '--config', configPath], ENV);
    expect([noSub.code, noSub.stderr]).toEqual([2, expect.stringMatching(/--sub/)]);
    const badScope = await runNode([CLI, 'token', '--config', configPath, '--sub', 'x', '--scope', 'root'], ENV);
    expect([badScope.code, badScope.stderr]).toEqual([2, expect.stringMatching(/unknown scope root/)]);
    const noEnv = await runNode([CLI, 'token', '--config', configPath, '--sub', 'x'], { FG_TEST_JWT_SECRET: '' });
    expect(noEnv.code).toBe(1);
    expect(noEnv.stderr).toMatch(/FG_TEST_JWT_SECRET is not set/);
  });
});

describe('fencegate audit', () => {
  async function seeded() {
    const s = await setup();
    const worker = await mint(s.configPath, '--sub', 'billing');
    const send = (fence: number, entity: string, key: string) => command(s.gw.url, '/payments/x', { fence, entity, key, headers: bearer(worker) });
    expect((await send(5, 'tool-job:1', 'a')).status).toBe(201);
    expect((await send(4, 'tool-job:1', 'b')).status).toBe(409);
    expect((await send(3, 'tool-job:1', 'c')).status).toBe(409);
    expect((await send(9, 'tool-job:2', 'd')).status).toBe(201);
    expect((await send(1, 'tool-job:2', 'e,"x"')).status).toBe(400); // a bad key: 400, not logged
    expect((await send(1, 'tool-job:2', 'f')).status).toBe(409);
    return s;
  }

  it('against a running gateway: --entity, --reason, --since, csv / ndjson / table, token from the environment', async () => {
    const { gw, configPath } = await seeded();
    const audit = await mint(configPath, '--sub', 'auditor', '--scope', 'fencegate:audit');

    const nd = await runNode([CLI, 'audit', '--url', gw.url, '--entity', 'tool-job:1', '--since', '2h', '--format', 'ndjson'], { FENCEGATE_TOKEN: audit });
    expect(nd.code, nd.stderr).toBe(0);
    const rows = nd.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(rows.map((r) => [r.reason, r.presented_fence, r.current_fence, r.caller, r.idempotency_key])).toEqual([
      ['stale-fence', '3', '5', 'billing', 'c'],
      ['stale-fence', '4', '5', 'billing', 'b'],
    ]);

    const csv = await runNode([CLI, 'audit', '--url', gw.url, '--token', audit, '--reason', 'stale-fence', '--format', 'csv']);
    expect(csv.code, csv.stderr).toBe(0);
    const lines = csv.stdout.split('\r\n');
    expect(lines[0]).toMatch(/^id,at,reason,entity,/);
    expect(lines.slice(1, -1).map((l) => l.split(',')[3])).toEqual(['tool-job:2', 'tool-job:1', 'tool-job:1']);

    const table = await runNode([CLI, 'audit', '--url', gw.url, '--token', audit, '--limit', '2']);
    expect(table.code, table.stderr).toBe(0);
    const t = table.stdout.trimEnd().split('\n');
    expect(t[0]).toMatch(/^id\s+at\s+reason\s+entity\s+presented_fence\s+current_fence\s+idempotency_key\s+caller\s+method\s+path\s+detail$/);
    expect(t).toHaveLength(3);
    expect(t[1]).toMatch(/stale-fence\s+tool-job:2\s+1\s+9\s+f\s+billing\s+POST\s+\/payments\/x(\s+\S.*)?$/);

    // Without a token: the gateway's 401, exit 1 (and the attempt is itself logged).
    const denied = await runNode([CLI, 'audit', '--url', gw.url]);
    expect(denied.code).toBe(1);
    expect(denied.stderr).toMatch(/401/);
  });

  it('straight against the store (--db or --config), with the same filters', async () => {
    const { gw, configPath } = await seeded();
    const byDb = await runNode([CLI, 'audit', '--db', gw.dbPath, '--entity', 'tool-job:2', '--format', 'ndjson']);
    expect(byDb.code, byDb.stderr).toBe(0);
    expect(
      byDb.stdout
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l).idempotency_key),
    ).toEqual(['f']);
    const byConfig = await runNode([CLI, 'audit', '--config', configPath, '--reason', 'stale-fence', '--format', 'ndjson', '--since', '1h']);
    expect(byConfig.code, byConfig.stderr).toBe(0);
    expect(byConfig.stdout.trim().split('\n')).toHaveLength(3);
    const bad = await runNode([CLI, 'audit', '--db', gw.dbPath, '--since', 'last-week']);
    expect([bad.code, bad.stderr]).toEqual([2, expect.stringMatching(/--since: expected an ISO 8601 time/)]);
  });
});

describe('fencegate audit commands', () => {
  it('reads the command log from the gateway (--url) and from its store (--db), filtered, in each format', async () => {
    const { gw, configPath } = await setup();
    const t = await mint(configPath, '--sub', 'billing', '--scope', 'fencegate:proxy fencegate:audit');
    for (const k of ['c1', 'c2', 'c3'])
      expect((await command(gw.url, '/payments/x', { fence: 2, entity: 'acct:9', key: k, headers: bearer(t) })).status).toBe(201);
    expect((await command(gw.url, '/payments/x', { fence: 2, entity: 'acct:8', key: 'other', headers: bearer(t) })).status).toBe(201);

    const url = await runNode([CLI, 'audit', 'commands', '--url', gw.url, '--token', t, '--entity', 'acct:9', '--format', 'ndjson'], ENV);
    expect(url.code, url.stderr).toBe(0);
    const rows = url.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(rows.map((r) => [r.idempotency_key, r.outcome, r.status, r.caller])).toEqual([
      ['c3', 'completed', 201, 'billing'],
      ['c2', 'completed', 201, 'billing'],
      ['c1', 'completed', 201, 'billing'],
    ]);

    const db = await runNode([CLI, 'audit', 'commands', '--db', gw.dbPath, '--key', 'other', '--format', 'csv']);
    expect(db.code, db.stderr).toBe(0);
    const lines = db.stdout.trimEnd().split('\r\n');
    expect(lines[0]).toMatch(/^id,at,route,method,path,entity,fence,idempotency_key,/);
    expect(lines).toHaveLength(2);
    expect(lines[1]).toContain(',acct:8,2,other,');

    const table = await runNode([CLI, 'audit', 'commands', '--db', gw.dbPath, '--entity', 'acct:9', '--limit', '1']);
    expect(table.code, table.stderr).toBe(0);
    expect(table.stdout.split('\n')[0]).toMatch(/^id\s+at\s+route\s+entity/);
    expect(table.stdout.trim().split('\n')).toHaveLength(2);

    const bad = await runNode([CLI, 'audit', 'commands', '--db', gw.dbPath, '--since', 'yesterday']);
    expect([bad.code, bad.stderr]).toEqual([2, expect.stringMatching(/--since/)]);
    const help = await runNode([CLI, 'audit', 'commands', '--help']);
    expect(help.stdout).toMatch(/^fencegate audit commands/);
  });
});
