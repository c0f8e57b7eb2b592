import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { tempDir } from '../helpers/gateway.js';
import { CLI, killAll, runNode, writeJson } from '../helpers/child.js';

// A bad `reconcile` stops `fencegate serve` before it listens: one line
// on stderr naming the field, under the CLI's heading (convention 4). The compiled CLI: `npm run build` first.

const tmp = tempDir();
afterAll(async () => {
  await killAll();
  tmp.cleanup();
});

const config = (name: string, reconcile: unknown, env: Record<string, unknown> = {}) =>
  writeJson(join(tmp.dir, `${name}.json`), {
    listen: { port: 0 },
    store: { sqlite: join(tmp.dir, `${name}.db`) },
    routes: [{ name: 'charges', match: { path: '/charges' }, upstream: 'http://127.0.0.1:9', reconcile, ...env }],
  });

describe('fencegate serve with a bad reconcile', () => {
  it.each([
    [
      'a template that does not identify the command',
      { path: '/charges/{entity}' },
      /routes\[0\]\.reconcile\.path: names no variable that identifies the command/,
    ],
    ['a method with a body', { method: 'POST', path: '/charges/{key}' }, /routes\[0\]\.reconcile\.method: must be GET or HEAD/],
    [
      'a header secret that is not set',
      { path: '/charges/{key}', headers: { Authorization: { env: 'FG_TEST_UNSET_RECONCILE_KEY', prefix: 'Bearer ' } } },
      /routes\[0\]\.reconcile\.headers\.Authorization: environment variable FG_TEST_UNSET_RECONCILE_KEY is not set/,
    ],
  ])('%s: one line naming the field, exit 1', async (name, reconcile, line) => {
    const r = await runNode([CLI, 'serve', '--config', config(name.replace(/\W+/g, '-'), reconcile)]);
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr).toMatch(line);
    // The CLI's form of every configuration error: its heading, then one line per problem; here one.
    const lines = r.stderr.trimEnd().split('\n');
    expect(lines[0]).toBe('fencegate: invalid configuration:');
    expect(lines.slice(1), r.stderr).toHaveLength(1);
    expect(lines[1]).toMatch(line);
  });
});
