import { readFileSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo, type Server } from 'node:net';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { command, expectProblem, paymentsRoute, startTestGateway, tempDir } from '../helpers/gateway.js';
import { CLI, killAll as killChildren, runNode, writeJson } from '../helpers/child.js';
import { startUpstream } from '../helpers/upstream.js';
import { hsAuth, token } from '../auth/tokens.js';
import { parseLogLevel } from '../../src/http/logger.js';

// How the `fencegate` CLI fails (src/entry/cli-errors.ts): one line on
// stderr starting `fencegate: `, exit 2 for usage and 1 otherwise, no stack
// unless FENCEGATE_DEBUG=1. Real child processes of the compiled CLI.

const tmp = tempDir();
const servers: Server[] = [];
afterAll(async () => {
  await killChildren();
  for (const s of servers) s.close();
  tmp.cleanup();
});

const route = { name: 'payments', match: { path: '/payments/*' }, upstream: 'http://127.0.0.1:9' };
const noAuth = writeJson(join(tmp.dir, 'no-auth.json'), { listen: { port: 8181 }, store: { sqlite: join(tmp.dir, 'x.db') }, routes: [route] });

/** A port nothing listens on: bound, then closed. */
async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()));
  const port = (s.address() as AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

const STACK = /^\s+at /m;

describe('one-line errors with an exit code', () => {
  it.concurrent.each([
    ['a bad --url', ['audit', '--url', 'nope'], 2, /^fencegate: --url "nope" is not a URL \(e\.g\. http:\/\/127\.0\.0\.1:8080\) \(fencegate audit --help\)\n$/],
    ['an unknown flag', ['serve', '--bogus'], 2, /^fencegate: unknown option --bogus \(fencegate serve --help lists the options\)\n$/],
    ['a flag without its value', ['serve', '--config', noAuth, '--port'], 2, /^fencegate: --port needs a value \(fencegate serve --help\)\n$/],
    ['an unknown command', ['launch'], 2, /^fencegate: unknown command "launch" \(fencegate --help\)\n$/],
    [
      '--reason with underscores',
      ['audit', '--db', join(tmp.dir, 'r.db'), '--reason', 'stale_fence'],
      2,
      /^fencegate: --reason "stale_fence" is not a reason \(did you mean stale-fence\?\); one of: stale-fence, idempotency-key-reused, outcome-unknown, invalid-fence-signature, fence-expired, unauthorized, forbidden, late-finish/,
    ],
    [
      'an unknown --reason',
      ['audit', '--db', join(tmp.dir, 'r.db'), '--reason', 'nope'],
      2,
      /^fencegate: --reason "nope" is not a reason; one of: stale-fence, /,
    ],
    [
      'token on a gateway without auth',
      ['token', '--config', noAuth, '--sub', 'x'],
      1,
      /^fencegate: .*no-auth\.json has no "auth" section: that gateway checks no tokens, so none is needed \(without auth its admin API answers on a loopback listener, e\.g\. fencegate audit --url http:\/\/127\.0\.0\.1:8181\)\n$/,
    ],
    [
      'resolve-unknown without --route',
      ['resolve-unknown', '--url', 'http://127.0.0.1:1', '--from', '2h', '--to', '1m'],
      2,
      /^fencegate: resolve-unknown needs --route NAME \(fencegate resolve-unknown --help\)\n$/,
    ],
    [
      'resolve-unknown with a bad --from',
      ['resolve-unknown', '--url', 'http://127.0.0.1:1', '--route', 'p', '--from', 'monday', '--to', '1m'],
      2,
      /^fencegate: --from "monday" is not an ISO 8601 time or a duration such as 2h/,
    ],
    [
      'resolve-unknown with a time of day and no offset',
      ['resolve-unknown', '--url', 'http://127.0.0.1:1', '--route', 'p', '--from', '2026-05-01T00:00', '--to', '1m'],
      2,
      /^fencegate: --from "2026-05-01T00:00" has a time of day but no offset: add Z \(UTC\) or one such as \+02:00/,
    ],
    [
      'resolve-unknown --to without offset',
      ['resolve-unknown', '--url', 'http://127.0.0.1:1', '--route', 'p', '--from', '2026-05-01', '--to', '2026-05-01T10:00:00.5'],
      2,
      /^fencegate: --to "2026-05-01T10:00:00.5" has a time of day but no offset/,
    ],
    // Control: the same times with Z / an offset pass the flag check (and reach for the gateway).
    [
      'resolve-unknown with Z and +02:00',
      ['resolve-unknown', '--url', 'http://127.0.0.1:1', '--route', 'p', '--from', '2026-05-01T00:00Z', '--to', '2026-05-01T10:00:00.5+02:00'],
      1,
      /^fencegate: cannot reach the gateway at http:\/\/127\.0\.0\.1:1/,
    ],
  ])('%s', async (_name, args, code, line) => {
    const r = await runNode([CLI, ...args]);
    expect(r.code, r.stderr).toBe(code);
    expect(r.stderr).toMatch(line);
    expect(r.stderr.trimEnd().split('\n')).toHaveLength(1);
    expect(r.stderr).not.toMatch(STACK);
  });

  it('an unreachable gateway: names the URL and the cause; FENCEGATE_DEBUG=1 adds the stack', async () => {
    const url = `http://127.0.0.1:${await freePort()}`;
    const r = await runNode([CLI, 'audit', '--url', url]);
    expect(r.code).toBe(1);
    expect(r.stderr).toBe(`fencegate: cannot reach the gateway at ${url}: connect ECONNREFUSED ${url.slice(7)} (is fencegate serve running there?)\n`);
    const debug = await runNode([CLI, 'audit', '--url', url], { FENCEGATE_DEBUG: '1' });
    expect(debug.code).toBe(1);
    expect(debug.stderr).toMatch(STACK);
  });

  it('a port in use: names it and the two ways to change it', async () => {
    const squatter = createServer();
    servers.push(squatter);
    await new Promise<void>((r) => squatter.listen(0, '127.0.0.1', () => r()));
    const port = (squatter.address() as AddressInfo).port;
    const config = writeJson(join(tmp.dir, 'busy.json'), { listen: { port }, store: { sqlite: join(tmp.dir, 'busy.db') }, routes: [route] });
    const r = await runNode([CLI, 'serve', '--config', config], { FENCEGATE_LOG_LEVEL: 'silent' });
    expect(r.code).toBe(1);
    expect(r.stderr).toBe(
      `fencegate: 127.0.0.1:${port} is already in use (another fencegate?): pick another port with --port N or listen.port in the config\n`,
    );
  });

  it('FENCEGATE_LOG_LEVEL: another word stops start-up naming the levels; any case of a level is that level', async () => {
    for (const bad of ['verbose', 'trace']) {
      const r = await runNode([CLI, 'serve', '--config', noAuth, '--port', '0'], { FENCEGATE_LOG_LEVEL: bad });
      expect(r.code, r.stderr).toBe(2);
      expect(r.stderr).toBe(
        `fencegate: FENCEGATE_LOG_LEVEL must be one of debug, info, warn, error, silent (it is ${JSON.stringify(bad)}) (fencegate serve --help)\n`,
      );
    }
    // Control: WARN passes the check (the next one, --port's, is what stops it).
    const r = await runNode([CLI, 'serve', '--config', noAuth, '--port', 'x'], { FENCEGATE_LOG_LEVEL: 'WARN' });
    expect(r.stderr).toBe('fencegate: --port must be a number from 0 to 65535 (fencegate serve --help)\n');
    expect([parseLogLevel('WARN'), parseLogLevel(' error '), parseLogLevel('Silent'), parseLogLevel('DEBUG'), parseLogLevel('verbose')]).toEqual([
      'warn',
      'error',
      'silent',
      'debug',
      null,
    ]);
  });

  it('--version prints the package version', async () => {
    const r = await runNode([CLI, '--version']);
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(`fencegate ${JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')).version}\n`);
  });

  it('a missing environment variable: names the field and the variable', async () => {
    const config = writeJson(join(tmp.dir, 'env.json'), {
      store: { sqlite: join(tmp.dir, 'env.db') },
      routes: [{ ...route, upstreamHeaders: { Authorization: { env: 'FG_CLI_TEST_UNSET' } } }],
    });
    const r = await runNode([CLI, 'serve', '--config', config, '--port', '0'], { FG_CLI_TEST_UNSET: '' });
    expect(r.code).toBe(1);
    expect(r.stderr).toBe('fencegate: invalid configuration:\n  routes[0].upstreamHeaders.Authorization: environment variable FG_CLI_TEST_UNSET is not set\n');
  });

  it('config errors: the store kinds, "required", "did you mean"', async () => {
    const file = join(tmp.dir, 'typos.json');
    writeFileSync(file, JSON.stringify({ store: { mysql: 'x' }, routes: [{ name: 'p', match: { path: '/p/*' }, timeoutMS: 5 }] }));
    const r = await runNode([CLI, 'serve', '--config', file]);
    expect(r.code).toBe(1);
    expect(r.stderr).toBe(
      'fencegate: invalid configuration:\n' +
        '  store: unknown kind "mysql" (expected one of "sqlite", "postgres", "d1")\n' +
        '  routes[0].upstream: required\n' +
        '  routes[0]: unknown key "timeoutMS" (did you mean "timeoutMs"?)\n',
    );
  });
});

describe('per-command help', () => {
  it.concurrent.each([
    ['serve', /^fencegate serve — run the gateway\n[\s\S]*--port N/],
    ['migrate', /^fencegate migrate — [\s\S]*--lease/],
    ['audit', /^fencegate audit — read the rejection log\n[\s\S]*--reason R/],
    ['token', /^fencegate token — [\s\S]*default fencegate:proxy/],
    ['resolve-unknown', /^fencegate resolve-unknown — [\s\S]*--dry-run/],
  ])('fencegate %s --help', async (cmd, text) => {
    const r = await runNode([CLI, cmd, '--help']);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(text);
  });

  it('docs/cli.md and --help agree on token’s default scope (fencegate:proxy)', async () => {
    const { readFileSync } = await import('node:fs');
    const doc = readFileSync(join(__dirname, '..', '..', 'docs', 'cli.md'), 'utf8');
    const usage = /^fencegate token .*$/m.exec(doc)![0];
    const help = (await runNode([CLI, '--help'])).stdout;
    expect(help).toContain(usage.replace(/^fencegate/, '  fencegate'));
    expect(usage).toContain('[--scope "fencegate:proxy"]');
  });
});

describe('fencegate resolve-unknown', () => {
  it('dry run lists, the real run releases, against a running gateway', async () => {
    const up = await startUpstream();
    const gw = await startTestGateway({ routes: [paymentsRoute(up.url, { timeoutMs: 200 })] });
    try {
      up.behave(() => ({ kind: 'hang' }));
      for (const key of ['c1', 'c2']) await expectProblem(await command(gw.url, '/payments/x', { fence: 1, entity: `e-${key}`, key }), 504, 'upstream-timeout');
      up.behave(null);
      const args = [
        CLI,
        'resolve-unknown',
        '--url',
        gw.url,
        '--route',
        'payments',
        '--from',
        '10m',
        '--to',
        new Date(Date.now() + 60_000).toISOString(),
        '--note',
        'upstream was down',
      ];
      const dry = await runNode([...args, '--dry-run']);
      expect(dry.code, dry.stderr).toBe(0);
      expect(JSON.parse(dry.stdout)).toMatchObject({ dry_run: true, matched: 2, resolved: 0 });
      expect((await gw.admin('/v1/idempotency')).body.items).toHaveLength(2);
      const real = await runNode(args);
      expect(real.code, real.stderr).toBe(0);
      const answer = JSON.parse(real.stdout);
      expect(answer).toMatchObject({ resolved: 2, skipped: 0, more: false });
      expect((await gw.admin('/v1/idempotency')).body.items).toEqual([]);
      expect((await gw.admin('/v1/operator-actions')).body.items.map((a: any) => a.note)).toEqual([
        `bulk ${answer.bulk_id}: upstream was down`,
        `bulk ${answer.bulk_id}: upstream was down`,
      ]);
    } finally {
      await gw.close();
      await up.close();
    }
  });

  it('with auth: no token → 401 and what to pass; an audit-scoped token → 403 (admin scope needed)', async () => {
    const gw = await startTestGateway({ routes: [paymentsRoute('http://127.0.0.1:9')], config: { auth: hsAuth() } });
    try {
      const args = [CLI, 'resolve-unknown', '--url', gw.url, '--route', 'payments', '--from', '1h', '--to', '1m'];
      const none = await runNode(args, { FENCEGATE_TOKEN: '' });
      expect(none.code).toBe(1);
      expect(none.stderr).toMatch(/^fencegate: 401 Unauthorized: .* \(pass --token T or set FENCEGATE_TOKEN\)\n$/);
      const audit = await runNode([...args, '--token', await token({ sub: 'auditor', scope: 'fencegate:audit' })]);
      expect(audit.code).toBe(1);
      expect(audit.stderr).toMatch(/^fencegate: 403 Forbidden: .*fencegate:admin.* \(the token lacks the scope this needs\)\n$/);
    } finally {
      await gw.close();
    }
  });
});
