import { createServer, connect, type Server, type Socket } from 'node:net';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { command, effectOf, paymentsRoute, until } from '../helpers/gateway.js';
import { createTestSchema, POSTGRES_URL } from '../helpers/postgres.js';
import { tempDir } from '../helpers/temp.js';
import { startUpstream } from '../helpers/upstream.js';
import { killAll, start } from './proc.js';

// `<adminPrefix>/ready` answers 503 whenever this process should get no
// traffic: while its store is opened and migrated, while the store does not
// answer, and while it drains after SIGTERM; `/health` answers 200 through
// all of them, so that a liveness probe never kills a process that is doing
// what it should (docs/deploy.md §3).

const tmp = tempDir();
const cleanups: (() => Promise<unknown> | unknown)[] = [];
afterAll(async () => {
  await killAll();
  for (const c of cleanups.reverse()) await c();
  tmp.cleanup();
});

let n = 0;
function configFile(config: unknown): string {
  const path = join(tmp.dir, `config-${n++}.json`);
  writeFileSync(path, JSON.stringify(config));
  return path;
}
const probe = async (url: string, what: 'ready' | 'health') => {
  const res = await fetch(`${url}/_fencegate/${what}`);
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
};

describe('while draining (SIGTERM)', () => {
  it('the listener stays open: ready 503 draining, health 200, a new request 503 with nothing admitted, the held one completes', async () => {
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const child = start(['serve', '--config', configFile({ store: { sqlite: join(tmp.dir, 'drain.db') }, routes: [paymentsRoute(up.url)] }), '--port', '0']);
    const { url } = await child.waitFor((l) => l.msg === 'listening', 'listening');
    expect(await probe(url, 'ready')).toEqual({ status: 200, body: { status: 'ready' } });

    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise }));
    const held = command(url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    await up.waitForCalls(1);
    child.proc.kill('SIGTERM');
    await child.waitFor((l) => l.msg === 'shutting-down', 'shutting-down');

    expect(await probe(url, 'ready')).toEqual({ status: 503, body: { status: 'draining' } });
    expect((await probe(url, 'health')).status).toBe(200);
    const late = await command(url, '/payments/charges', { fence: 2, entity: 'f', key: 'k2' });
    expect(late.status).toBe(503);
    expect(late.headers.get('connection')).toBe('close');
    expect(await late.json()).toMatchObject({ type: expect.stringMatching(/store-unavailable$/), detail: expect.stringMatching(/shutting down/) });
    expect(up.calls).toHaveLength(1);

    gate.open();
    const res = await held;
    expect(res.status).toBe(201);
    expect((await effectOf(res)).effect).toBe(1);
    expect(await child.exited).toBe(0);
  });
});

describe.skipIf(!POSTGRES_URL)('PostgreSQL', () => {
  it('while migrations wait (another replica holds their lock): ready 503 starting, health 200; then ready', async () => {
    const schema = await createTestSchema('fg_probe');
    cleanups.push(() => schema.drop());
    // The lock the migrations take (src/db/postgres-migrate.ts), held as another replica migrating would hold it.
    const holder = new pg.Client({ connectionString: schema.url });
    await holder.connect();
    cleanups.push(() => holder.end());
    await holder.query('BEGIN');
    await holder.query("SELECT pg_advisory_xact_lock(hashtext('fencegate_migrations:' || current_schema()))");

    const child = start([
      'serve',
      '--config',
      configFile({ store: { postgres: POSTGRES_URL, schema: schema.schema }, routes: [paymentsRoute('http://127.0.0.1:9')] }),
      '--port',
      '0',
    ]);
    // The socket is bound before the store is opened; its address is in no line yet, so ask the kernel's table through a probe loop.
    const url = await listeningUrl(child.proc.pid!);
    expect(await probe(url, 'ready')).toEqual({ status: 503, body: { status: 'starting' } });
    expect(await probe(url, 'health')).toEqual({ status: 200, body: { status: 'starting' } });
    const early = await command(url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' });
    expect(early.status).toBe(503);
    expect(child.lines.some((l) => l.msg === 'listening')).toBe(false);

    await holder.query('COMMIT');
    await child.waitFor((l) => l.msg === 'listening', 'listening');
    expect(await probe(url, 'ready')).toEqual({ status: 200, body: { status: 'ready' } });
    child.proc.kill('SIGTERM');
    expect(await child.exited).toBe(0);
  });

  it('while the store does not answer: ready 503, health 200 saying so; ready again once it answers', async () => {
    const schema = await createTestSchema('fg_probe');
    cleanups.push(() => schema.drop());
    const db = new URL(POSTGRES_URL!);
    const proxy = await tcpProxy(db.hostname, Number(db.port || 5432));
    cleanups.push(() => proxy.close());
    const through = new URL(POSTGRES_URL!);
    through.port = String(proxy.port);
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const child = start([
      'serve',
      '--config',
      configFile({ store: { postgres: through.toString(), schema: schema.schema, queryTimeout: '1s' }, routes: [paymentsRoute(up.url)] }),
      '--port',
      '0',
    ]);
    const { url } = await child.waitFor((l) => l.msg === 'listening', 'listening');
    expect((await probe(url, 'ready')).status).toBe(200);

    proxy.cut();
    // A round trip that goes unanswered is what marks the store down (src/store/postgres/health.ts).
    expect((await command(url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' })).status).toBe(503);
    await child.waitFor((l) => l.msg === 'store-unavailable', 'store-unavailable');
    expect(await probe(url, 'ready')).toEqual({ status: 503, body: { status: 'unavailable', store: 'unavailable' } });
    expect(await probe(url, 'health')).toEqual({ status: 200, body: { status: 'ok', store: 'unavailable' } });

    proxy.restore();
    await until(
      async () => (await command(url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' })).status === 201 || null,
      'a request through the restored store',
    );
    expect((await probe(url, 'ready')).status).toBe(200);
    child.proc.kill('SIGTERM');
    expect(await child.exited).toBe(0);
  });
});

/** The loopback URL a process listens on, from /proc/net/tcp (its socket inodes under /proc/<pid>/fd). */
async function listeningUrl(pid: number): Promise<string> {
  const { readFileSync, readdirSync, readlinkSync } = await import('node:fs');
  return until(() => {
    let inodes: Set<string>;
    try {
      inodes = new Set(
        readdirSync(`/proc/${pid}/fd`)
          .map((fd) => {
            try {
              return /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))?.[1];
            } catch {
              return undefined;
            }
          })
          .filter((x): x is string => x !== undefined),
      );
    } catch {
      return null;
    }
    for (const line of readFileSync('/proc/net/tcp', 'utf8').split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      // state 0A is LISTEN; local address 0100007F:PORT is 127.0.0.1.
      if (f[3] === '0A' && inodes.has(f[9]!) && f[1]!.startsWith('0100007F:')) return `http://127.0.0.1:${parseInt(f[1]!.split(':')[1]!, 16)}`;
    }
    return null;
  }, 'the gateway listening');
}

/** A TCP proxy that can be cut (every connection reset, new ones refused) and restored. */
async function tcpProxy(host: string, port: number): Promise<{ port: number; cut(): void; restore(): void; close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  let down = false;
  const server: Server = createServer((client) => {
    if (down) return client.destroy();
    const upstream = connect(port, host);
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
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as { port: number }).port,
    cut() {
      down = true;
      for (const s of sockets) s.destroy();
    },
    restore() {
      down = false;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
