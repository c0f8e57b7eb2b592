import { existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { tempDir } from '../helpers/temp.js';
import { freePort, killAll, run, start } from './proc.js';

// `fencegate serve` as a deployment starts it: the file from FENCEGATE_CONFIG,
// the port from PORT, secrets and URLs from the environment; a configuration
// refused for any of them leaves nothing behind (docs/deploy.md §1).

const tmp = tempDir();
afterAll(async () => {
  await killAll();
  tmp.cleanup();
});

const route = { name: 'payments', match: { path: '/payments/*' }, upstream: 'http://127.0.0.1:9' };
let n = 0;
/** A fresh working directory holding config.json; the store is the default `./fencegate.db` in it. */
function workdir(config: unknown): { dir: string; path: string } {
  const dir = join(tmp.dir, `w${n++}`);
  mkdirSync(dir);
  const path = join(dir, 'config.json');
  writeFileSync(path, JSON.stringify(config));
  return { dir, path };
}

describe('a refused configuration touches no store', () => {
  const cases: { name: string; config: unknown; line: RegExp }[] = [
    {
      name: 'route upstream',
      config: { routes: [{ ...route, upstream: { env: 'FG_TEST_NO_UPSTREAM' } }] },
      line: /^ {2}routes\[0\]\.upstream: environment variable FG_TEST_NO_UPSTREAM is not set$/m,
    },
    {
      name: 'upstream header',
      config: { routes: [{ ...route, upstreamHeaders: { Authorization: { env: 'FG_TEST_NO_TOKEN', prefix: 'Bearer ' } } }] },
      line: /^ {2}routes\[0\]\.upstreamHeaders\.Authorization: environment variable FG_TEST_NO_TOKEN is not set$/m,
    },
    {
      name: 'credentialHashKey',
      config: { credentialHashKey: { env: 'FG_TEST_NO_HASH' }, routes: [route] },
      line: /^ {2}credentialHashKey: environment variable FG_TEST_NO_HASH is not set$/m,
    },
    {
      name: 'auth secret',
      config: { auth: { secret: { env: 'FG_TEST_NO_JWT' }, issuer: 'i', audience: 'a' }, routes: [route] },
      line: /^ {2}auth\.secret: environment variable FG_TEST_NO_JWT is not set$/m,
    },
    {
      name: 'an unreadable public key',
      config: { auth: { publicKeys: [{ alg: 'ES256', pem: 'not a key' }], issuer: 'i', audience: 'a' }, routes: [route] },
      line: /auth\.publicKeys\[0\]: not an SPKI PEM/,
    },
    {
      name: 'a TLS file',
      config: { routes: [{ ...route, upstream: 'https://127.0.0.1:9', tls: { ca: './no-such-ca.pem' } }] },
      line: /^ {2}routes\[0\]\.tls\.ca: cannot read \.\/no-such-ca\.pem/m,
    },
  ];
  for (const c of cases) {
    it(`missing ${c.name}: exit 1, the field named, no ./fencegate.db`, async () => {
      const { dir, path } = workdir(c.config);
      const r = await run(['serve', '--config', path, '--port', '0'], { cwd: dir });
      expect(r.code).toBe(1);
      expect(r.stderr).toMatch(/^fencegate: invalid configuration:\n/);
      expect(r.stderr).toMatch(c.line);
      expect(readdirSync(dir)).toEqual(['config.json']);
    });
  }

  it('negative control: the same directory with the variable set opens ./fencegate.db', async () => {
    const { dir, path } = workdir({ routes: [{ ...route, upstream: { env: 'FG_TEST_UPSTREAM' } }] });
    const child = start(['serve', '--config', path, '--port', '0'], { cwd: dir, env: { FG_TEST_UPSTREAM: 'http://127.0.0.1:9' } });
    await child.waitFor((l) => l.msg === 'listening', 'listening');
    expect(existsSync(join(dir, 'fencegate.db'))).toBe(true);
    child.proc.kill('SIGTERM');
    expect(await child.exited).toBe(0);
  });
});

describe('FENCEGATE_CONFIG and PORT', () => {
  it('serve without --config reads FENCEGATE_CONFIG; PORT wins over listen.port', async () => {
    const [configured, port] = [await freePort(), await freePort()];
    const { dir, path } = workdir({ listen: { port: configured }, routes: [route] });
    const child = start(['serve'], { cwd: dir, env: { FENCEGATE_CONFIG: path, PORT: String(port) } });
    const line = await child.waitFor((l) => l.msg === 'listening', 'listening');
    expect(line.url).toBe(`http://127.0.0.1:${port}`);
    expect((await fetch(`${line.url}/_fencegate/health`)).status).toBe(200);
    child.proc.kill('SIGTERM');
    expect(await child.exited).toBe(0);
  });

  it('--config wins over FENCEGATE_CONFIG, --port over PORT', async () => {
    const port = await freePort();
    const { dir, path } = workdir({ routes: [route] });
    const child = start(['serve', '--config', path, '--port', String(port)], { cwd: dir, env: { FENCEGATE_CONFIG: join(dir, 'nonexistent.json'), PORT: '1' } });
    const line = await child.waitFor((l) => l.msg === 'listening', 'listening');
    expect(line.url).toBe(`http://127.0.0.1:${port}`);
    child.proc.kill('SIGTERM');
    expect(await child.exited).toBe(0);
  });

  it('without either, listen.port', async () => {
    const configured = await freePort();
    const { dir, path } = workdir({ listen: { port: configured }, routes: [route] });
    const child = start(['serve', '--config', path], { cwd: dir });
    expect((await child.waitFor((l) => l.msg === 'listening', 'listening')).url).toBe(`http://127.0.0.1:${configured}`);
    child.proc.kill('SIGTERM');
    expect(await child.exited).toBe(0);
  });

  it('a bad PORT, or neither --config nor FENCEGATE_CONFIG, is a usage error', async () => {
    const { dir, path } = workdir({ routes: [route] });
    const bad = await run(['serve'], { cwd: dir, env: { FENCEGATE_CONFIG: path, PORT: 'http' } });
    expect(bad.code).toBe(2);
    expect(bad.stderr).toBe('fencegate: PORT must be a number from 0 to 65535 (fencegate serve --help)\n');
    const none = await run(['serve'], { cwd: dir });
    expect(none.code).toBe(2);
    expect(none.stderr).toMatch(/serve needs --config FILE \(or FENCEGATE_CONFIG\)/);
    expect(readdirSync(dir)).toEqual(['config.json']);
  });
});

describe('fencegate config check', () => {
  it('validates as serve does (variables, TLS files) and opens nothing', async () => {
    const { dir, path } = workdir({ routes: [{ ...route, upstream: { env: 'FG_TEST_CHECK_UPSTREAM' } }] });
    const bad = await run(['config', 'check', '--config', path], { cwd: dir });
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/^ {2}routes\[0\]\.upstream: environment variable FG_TEST_CHECK_UPSTREAM is not set$/m);
    const good = await run(['config', 'check'], { cwd: dir, keepStdout: true, env: { FENCEGATE_CONFIG: path, FG_TEST_CHECK_UPSTREAM: 'http://127.0.0.1:9' } });
    expect(good).toMatchObject({ code: 0, stdout: `${path}: valid (1 route: payments)\n` });
    expect(readdirSync(dir)).toEqual(['config.json']);
  });
});
