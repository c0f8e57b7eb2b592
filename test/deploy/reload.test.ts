import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { command, effectOf, paymentsRoute } from '../helpers/gateway.js';
import { tempDir } from '../helpers/temp.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { killAll, start, type Child } from './proc.js';

// SIGHUP re-reads the configuration file: validated whole (env variables,
// keys, TLS files) and swapped in for new requests only if valid, while
// requests in flight finish on the configuration they started on; anything
// refused keeps the running configuration and says why in one line
// (docs/deploy.md §4).

const tmp = tempDir();
const ups: FakeUpstream[] = [];
afterAll(async () => {
  await killAll();
  for (const u of ups) await u.close();
  tmp.cleanup();
});

const path = join(tmp.dir, 'config.json');
const db = join(tmp.dir, 'reload.db');
const write = (config: unknown) => writeFileSync(path, typeof config === 'string' ? config : JSON.stringify(config));
const withUpstream = (url: string, extra: Record<string, unknown> = {}) => ({ store: { sqlite: db }, ...extra, routes: [paymentsRoute(url)] });

/** Sends SIGHUP and waits for the n-th reload line (reloaded or failed). */
async function hangup(child: Child, n: number): Promise<Record<string, any>> {
  process.kill(child.proc.pid!, 'SIGHUP');
  await child.waitFor(() => child.lines.filter((l) => l.msg === 'config-reloaded' || l.msg === 'config-reload-failed').length >= n, `reload line ${n}`);
  return child.lines.filter((l) => l.msg === 'config-reloaded' || l.msg === 'config-reload-failed')[n - 1]!;
}

describe('SIGHUP', () => {
  it('swaps a valid configuration in for new requests, lets in-flight ones finish on the old one, and keeps the old one on every refusal', async () => {
    const [a, b] = [await startUpstream(), await startUpstream()];
    ups.push(a, b);
    write(withUpstream(a.url));
    const child = start(['serve', '--config', path, '--port', '0'], { env: { FG_TEST_RELOAD_TOKEN: undefined } });
    const { url } = await child.waitFor((l) => l.msg === 'listening', 'listening');
    expect((await command(url, '/payments/charges', { fence: 1, entity: 'e', key: 'k1' })).status).toBe(201);
    expect(a.calls).toHaveLength(1);

    // A request held at upstream A while the configuration moves to B.
    const gate = a.gate();
    a.behave(() => ({ kind: 'hold', gate: gate.promise }));
    const held = command(url, '/payments/charges', { fence: 1, entity: 'held', key: 'k-held' });
    await a.waitForCalls(2);

    write(withUpstream(b.url));
    expect(await hangup(child, 1)).toMatchObject({ level: 'info', msg: 'config-reloaded', routes: ['payments'] });
    const after = await command(url, '/payments/charges', { fence: 1, entity: 'e', key: 'k2' });
    expect(after.status).toBe(201);
    expect(b.calls).toHaveLength(1);
    expect(a.calls).toHaveLength(2);

    // The held request finishes on the configuration it started on, answered by A.
    gate.open();
    const res = await held;
    expect(res.status).toBe(201);
    expect((await effectOf(res)).effect).toBe(2);

    // Refusals: each one line naming what is wrong; B stays in force.
    const refusals: [unknown, RegExp][] = [
      ['{"routes": [', /is not valid JSON/],
      [{ ...withUpstream(b.url), routes: [{ ...paymentsRoute(b.url), timeoutMs: 0 }] }, /routes\[0\]\.timeoutMs: /],
      [
        {
          ...withUpstream(b.url),
          routes: [{ ...paymentsRoute(b.url), upstreamHeaders: { Authorization: { env: 'FG_TEST_RELOAD_TOKEN', prefix: 'Bearer ' } } }],
        },
        /^routes\[0\]\.upstreamHeaders\.Authorization: environment variable FG_TEST_RELOAD_TOKEN is not set$/,
      ],
      [
        { ...withUpstream(b.url), routes: [{ ...paymentsRoute({ env: 'FG_TEST_RELOAD_UPSTREAM' } as unknown as string) }] },
        /^routes\[0\]\.upstream: environment variable FG_TEST_RELOAD_UPSTREAM is not set$/,
      ],
      [
        { ...withUpstream(b.url), routes: [{ ...paymentsRoute('https://127.0.0.1:1'), tls: { ca: join(tmp.dir, 'missing-ca.pem') } }] },
        /^routes\[0\]\.tls\.ca: cannot read/,
      ],
      [{ ...withUpstream(b.url), store: { sqlite: join(tmp.dir, 'other.db') } }, /^store: cannot change on reload/],
      // (--port overrides the file's port, as at start-up: the host is what changes here.)
      [{ ...withUpstream(b.url), listen: { host: '127.0.0.2', port: 1 } }, /^listen: cannot change on reload/],
    ];
    let n = 1;
    for (const [config, why] of refusals) {
      write(config);
      const line = await hangup(child, ++n);
      expect(line, String(why)).toMatchObject({ level: 'error', msg: 'config-reload-failed' });
      expect(line.error).toMatch(why);
      expect(line.error).not.toMatch(/\n/);
      const still = await command(url, '/payments/charges', { fence: 1, entity: 'e', key: `still-${n}` });
      expect(still.status).toBe(201);
      expect(b.calls.at(-1)!.headers['idempotency-key']).toBe(`still-${n}`);
    }
    expect(a.calls).toHaveLength(2);

    // And a valid file after all of them is taken: a second route, back to A.
    write({ store: { sqlite: db }, routes: [paymentsRoute(b.url), { ...paymentsRoute(a.url), name: 'refunds', match: { path: '/refunds/*' } }] });
    expect(await hangup(child, ++n)).toMatchObject({ msg: 'config-reloaded', routes: ['payments', 'refunds'] });
    a.behave(null);
    expect((await command(url, '/refunds/r1', { fence: 1, entity: 'r', key: 'r1' })).status).toBe(201);
    expect(a.calls).toHaveLength(3);

    child.proc.kill('SIGTERM');
    expect(await child.exited).toBe(0);
  });
});
