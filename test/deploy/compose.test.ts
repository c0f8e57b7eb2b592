import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import yaml from 'js-yaml';
import { afterAll, describe, expect, it } from 'vitest';
import { ROOT } from '../helpers/child.js';
import { command } from '../helpers/gateway.js';
import { createTestSchema, POSTGRES_URL } from '../helpers/postgres.js';
import { tempDir } from '../helpers/temp.js';
import { startUpstream } from '../helpers/upstream.js';
import { execForm, parseDockerfile } from './dockerfile.js';
import { freePort, killAll, start } from './proc.js';

// deploy/compose.yaml (gateway + PostgreSQL 15) and deploy/fencegate.service,
// checked without a Docker engine or a running systemd: the compose file is
// read (js-yaml, through graphile-worker's cosmiconfig) and its gateway's
// environment starts the gateway against the test PostgreSQL; the unit goes
// through `systemd-analyze verify` (docs/deploy.md §10).

const COMPOSE_DIR = join(ROOT, 'deploy');
const compose = yaml.load(readFileSync(join(COMPOSE_DIR, 'compose.yaml'), 'utf8')) as any;
const gateway = compose.services.gateway;
const tmp = tempDir();
const cleanups: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  await killAll();
  for (const c of cleanups.reverse()) await c();
  tmp.cleanup();
});

/** Compose's `${VAR:-default}` interpolation, from `vars`. */
const interpolate = (value: string, vars: Record<string, string>) =>
  value.replace(/\$\{(\w+)(?::-([^}]*))?\}/g, (_, name: string, def?: string) => vars[name] ?? def ?? '');

describe('deploy/compose.yaml', () => {
  it('runs the image of the repository Dockerfile after PostgreSQL 15 is healthy, configured through FENCEGATE_CONFIG and the environment', () => {
    expect(compose.services.postgres.image).toBe('postgres:15');
    expect(compose.services.postgres.healthcheck.test.join(' ')).toMatch(/pg_isready/);
    expect(gateway.build).toEqual({ context: '..', dockerfile: 'Dockerfile' });
    expect(gateway.depends_on).toEqual({ postgres: { condition: 'service_healthy' } });
    expect(Object.keys(gateway.environment)).toEqual(expect.arrayContaining(['FENCEGATE_CONFIG', 'PORT', 'DATABASE_URL', 'FENCEGATE_UPSTREAM']));
    // The mounted file is the one FENCEGATE_CONFIG names, and the published port the one the gateway listens on.
    expect(gateway.volumes.map((v: string) => v.split(':')[1])).toContain(gateway.environment.FENCEGATE_CONFIG);
    expect(gateway.ports).toEqual([`${gateway.environment.PORT}:${gateway.environment.PORT}`]);
    const dockerfile = parseDockerfile(readFileSync(join(ROOT, gateway.build.dockerfile), 'utf8'));
    expect(dockerfile.at(-1)!.steps.find((s) => s.op === 'EXPOSE')?.args).toBe(gateway.environment.PORT);
    expect(execForm(dockerfile.at(-1)!.steps.find((s) => s.op === 'HEALTHCHECK')!.args).argv[0]).toBe('node');
    // Longer than the default drainTimeout (30s), so that a stop drains before the kill.
    expect(Number.parseInt(gateway.stop_grace_period, 10)).toBeGreaterThan(30);
  });

  it.skipIf(!POSTGRES_URL)("its gateway's environment starts the gateway against PostgreSQL", async () => {
    const schema = await createTestSchema('fg_compose');
    cleanups.push(() => schema.drop());
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const env: Record<string, string> = {};
    for (const [k, v] of Object.entries(gateway.environment as Record<string, string>)) env[k] = interpolate(String(v), { FENCEGATE_UPSTREAM: up.url });
    // The service name `postgres` is the test server here (compose's network DNS would resolve it).
    expect(env.DATABASE_URL).toMatch(/^postgres:\/\/fencegate:fencegate@postgres:5432\/fencegate$/);
    env.DATABASE_URL = schema.url;
    // The mounted file, from the host side of the volume.
    const mount = (gateway.volumes as string[]).map((v) => v.split(':')).find(([, target]) => target === env.FENCEGATE_CONFIG)!;
    env.FENCEGATE_CONFIG = resolve(COMPOSE_DIR, mount[0]!);
    // The published port is a free one here (8080 may be taken on a shared machine).
    env.PORT = String(await freePort());
    const child = start(['serve'], { cwd: tmp.dir, env });
    const { url, store } = await child.waitFor((l) => l.msg === 'listening', 'listening');
    expect(store).toBe('postgres');
    expect(url).toBe(`http://0.0.0.0:${env.PORT}`);
    const local = `http://127.0.0.1:${env.PORT}`;
    expect((await fetch(`${local}/_fencegate/ready`)).status).toBe(200);
    const res = await command(local, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    expect(res.status).toBe(201);
    expect(up.calls).toHaveLength(1);
    const rows = await schema.pool.query("SELECT state FROM idempotency_records WHERE key = 'k'");
    expect(rows.rows).toEqual([{ state: 'completed' }]);
    child.proc.kill('SIGTERM');
    expect(await child.exited).toBe(0);
  });
});

const ANALYZE = spawnSync('sh', ['-c', 'command -v systemd-analyze'], { encoding: 'utf8' }).stdout.trim();

describe.skipIf(ANALYZE === '')('deploy/fencegate.service', () => {
  const unit = join(COMPOSE_DIR, 'fencegate.service');
  const text = readFileSync(unit, 'utf8');
  const key = (k: string) => [...text.matchAll(new RegExp(`^${k}=(.*)$`, 'gm'))].map((m) => m[1]);

  it('passes systemd-analyze verify', () => {
    const r = spawnSync(ANALYZE, ['verify', unit], { encoding: 'utf8' });
    expect({ status: r.status, stderr: r.stderr }).toEqual({ status: 0, stderr: '' });
  });

  it('negative control: verify reports an unknown key', () => {
    const bad = join(tmp.dir, 'fencegate-bad.service');
    writeFileSync(bad, text.replace('[Service]\n', '[Service]\nExecReloadd=/bin/true\n'));
    expect(spawnSync(ANALYZE, ['verify', bad], { encoding: 'utf8' }).stderr).toMatch(/Unknown key 'ExecReloadd'/);
  });

  it('reloads with SIGHUP, drains on SIGTERM within its stop timeout, reads FENCEGATE_CONFIG, and is hardened', () => {
    expect(key('ExecReload')).toEqual(['/bin/kill -HUP $MAINPID']);
    expect(key('KillSignal')).toEqual(['SIGTERM']);
    expect(Number.parseInt(key('TimeoutStopSec')[0]!, 10)).toBeGreaterThan(30);
    expect(key('ExecStart')[0]).toMatch(/dist\/entry\/cli\.js serve$/);
    expect(key('Environment')).toContain('FENCEGATE_CONFIG=/etc/fencegate/fencegate.json');
    expect(key('User')).toEqual(['fencegate']);
    for (const k of ['NoNewPrivileges', 'ProtectSystem', 'ProtectHome', 'PrivateTmp', 'CapabilityBoundingSet', 'RestrictAddressFamilies', 'SystemCallFilter'])
      expect(key(k).length, k).toBeGreaterThan(0);
    // systemd's own exposure score (0 best, 10 worst) of the unit as written.
    const r = spawnSync(ANALYZE, ['security', '--offline=true', unit], { encoding: 'utf8' });
    const score = Number(/Overall exposure level for fencegate\.service: ([\d.]+)/.exec(r.stdout + r.stderr)?.[1]);
    expect(score).toBeLessThan(2.5);
  });
});
