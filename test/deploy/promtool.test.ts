import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { command, paymentsRoute } from '../helpers/gateway.js';
import { createTestSchema, POSTGRES_URL } from '../helpers/postgres.js';
import { tempDir } from '../helpers/temp.js';
import { startUpstream } from '../helpers/upstream.js';
import { killAll, start } from './proc.js';

// The whole `/_fencegate/metrics` exposition, after traffic, passes
// Prometheus's own linter (`promtool check metrics`, exit 0), with a SQLite
// and a PostgreSQL store (its pool and replication series).

const PROMTOOL = spawnSync('sh', ['-c', 'command -v promtool'], { encoding: 'utf8' }).stdout.trim();
const IN_CI = !!process.env.CI;
if (PROMTOOL === '' && !IN_CI) console.warn('[fencegate] promtool not found (Debian: apt-get install prometheus): the promtool test is SKIPPED.');

// CI installs promtool (.ci/run): there, a missing binary is a failure, not a skip.
describe.runIf(IN_CI)('promtool in CI', () => {
  it('is installed', () => {
    expect(PROMTOOL, 'promtool is missing: .ci/run installs it (apt-get install prometheus)').not.toBe('');
  });
});

const tmp = tempDir();
const cleanups: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  await killAll();
  for (const c of cleanups.reverse()) await c();
  tmp.cleanup();
});

function promtool(text: string): { status: number | null; output: string } {
  const r = spawnSync(PROMTOOL, ['check', 'metrics'], { input: text, encoding: 'utf8' });
  return { status: r.status, output: `${r.stdout}${r.stderr}` };
}

async function exposition(store: Record<string, unknown>): Promise<string> {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const path = join(tmp.dir, `config-${cleanups.length}.json`);
  writeFileSync(path, JSON.stringify({ store, routes: [paymentsRoute(up.url)] }));
  const child = start(['serve', '--config', path, '--port', '0']);
  const { url } = await child.waitFor((l) => l.msg === 'listening', 'listening');
  // Traffic, so that labelled series and histograms have samples: a forward, its replay, a stale fence.
  expect((await command(url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' })).status).toBe(201);
  expect((await command(url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' })).status).toBe(201);
  expect((await command(url, '/payments/charges', { fence: 0, entity: 'e', key: 'other' })).status).toBe(409);
  const res = await fetch(`${url}/_fencegate/metrics`);
  expect(res.status).toBe(200);
  const text = await res.text();
  child.proc.kill('SIGTERM');
  await child.exited;
  return text;
}

describe.skipIf(PROMTOOL === '')('promtool check metrics', () => {
  it('passes on the whole exposition (SQLite store)', async () => {
    const text = await exposition({ sqlite: join(tmp.dir, 'm.db') });
    expect(text).toMatch(/^fencegate_requests_total\{/m);
    expect(text).toMatch(/^nodejs_active_handles\{/m);
    expect(promtool(text)).toEqual({ status: 0, output: '' });
  });

  it.skipIf(!POSTGRES_URL)('passes on the whole exposition (PostgreSQL store)', async () => {
    const schema = await createTestSchema('fg_prom');
    cleanups.push(() => schema.drop());
    const text = await exposition({ postgres: POSTGRES_URL, schema: schema.schema });
    expect(promtool(text)).toEqual({ status: 0, output: '' });
  });

  it('negative control: a gauge named *_total, as prom-client names three by default, fails it', () => {
    const r = promtool(
      '# HELP nodejs_active_handles_total Total number of active handles.\n# TYPE nodejs_active_handles_total gauge\nnodejs_active_handles_total 3\n',
    );
    expect(r.status).not.toBe(0);
    expect(r.output).toMatch(/non-counter metrics should not have "_total" suffix/);
  });
});
