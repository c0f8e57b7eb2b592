import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { createAdminApp } from '../../src/http/admin.js';
import type { GatewayStore } from '../../src/store/types.js';
import { CLI, killAll, startGatewayChild, writeJson } from '../helpers/child.js';
import { tempDir } from '../helpers/temp.js';

// `fencegate serve` prints where the console is in its start-up line, and the
// console answers there: `<adminPrefix>/`, in the mode the admin API is in.

const tmp = tempDir('fencegate-console-startup-');
afterAll(async () => {
  await killAll();
  tmp.cleanup();
});

describe('the console URL in the start-up line', () => {
  it('is <url><adminPrefix>/ and serves the page (no auth on loopback: open)', { timeout: 30_000 }, async () => {
    const config = writeJson(join(tmp.dir, 'config.json'), {
      listen: { host: '127.0.0.1', port: 0 },
      adminPrefix: '/ops',
      store: { sqlite: join(tmp.dir, 'gateway.db') },
      routes: [{ name: 'payments', match: { path: '/payments/*', methods: ['POST'] }, upstream: 'http://127.0.0.1:9' }],
    });
    const child = await startGatewayChild([CLI, 'serve', '--config', config]);
    const line = child.lines.find((l) => l.msg === 'listening')!;
    expect(line.console).toBe(`${child.url}/ops/`);
    const res = await fetch(line.console);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/html; charset=utf-8');
    expect(await res.text()).toContain('<body data-auth="open">');
    // The page the line names is the one at /console too.
    expect(await (await fetch(`${child.url}/ops/console`)).text()).toContain('<body data-auth="open">');
    await child.kill();
  });
});

describe('the mode rendered into the page', () => {
  it('is auth behind a guard, open without one, off when the /v1 API is disabled; answered without touching the API', async () => {
    // The console route reads nothing from the store: a store that throws on any use proves it.
    const store = new Proxy(
      {},
      {
        get: (_t, name) => {
          throw new Error(`store.${String(name)} used`);
        },
      },
    ) as GatewayStore;
    const guard = async () => new Response('guarded', { status: 401 });
    const cases = [
      [{ enabled: true, guard }, 'auth'],
      [{ enabled: true }, 'open'],
      [{ enabled: false, guard }, 'off'],
      [{ enabled: false }, 'off'],
    ] as const;
    for (const [options, mode] of cases) {
      const app = createAdminApp({ store, problemBase: '/p/', ...options });
      for (const path of ['/', '/console']) {
        const res = await app.request(path);
        expect(res.status, `${mode} ${path}`).toBe(200);
        expect(await res.text()).toContain(`<body data-auth="${mode}">`);
      }
      // Negative control: the guard does stand in front of /v1.
      if ('guard' in options && options.enabled) expect((await app.request('/v1/rejections')).status).toBe(401);
    }
  });
});
