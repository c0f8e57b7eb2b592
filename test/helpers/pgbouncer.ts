import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { chownSync, existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { tempDir } from './temp.js';
import { freePort } from './upstream.js';

/**
 * A PRIVATE PgBouncer (Debian's `/usr/sbin/pgbouncer`, stock settings: no
 * `ignore_startup_parameters`, no `max_prepared_statements`) on a free
 * loopback port, in front of one PostgreSQL server. Its ini and userlist are
 * generated (auth trust, the `postgres` user or those named); it refuses to run as root, so
 * as root it runs as the `postgres` OS user, from a directory that is theirs.
 */

export const PGBOUNCER_BIN = process.env.FENCEGATE_PGBOUNCER ?? '/usr/sbin/pgbouncer';

export interface PrivatePgbouncer {
  port: number;
  /** `postgres://postgres@127.0.0.1:<port>/<database>` (another role: replace the user). */
  url: string;
  /** PgBouncer's log so far (for failure messages). */
  log(): string;
  /** SIGTERM, then removes the directory. Idempotent. */
  stop(): Promise<void>;
}

export async function startPgbouncer(options: {
  /** `postgres://user@host:port/database` of the server behind it. */
  server: string;
  mode: 'session' | 'transaction';
  /** Server connections per user and database (default 2: fewer than the store's pool, so transaction pooling mixes them). */
  poolSize?: number;
  /** Roles it lets in (auth trust: no password). Default `postgres`. */
  users?: string[];
}): Promise<PrivatePgbouncer> {
  const server = new URL(options.server);
  const database = server.pathname.slice(1);
  const dir = tempDir('fencegate-pgbouncer-').dir;
  const port = await freePort();
  const logFile = join(dir, 'pgbouncer.log');
  writeFileSync(join(dir, 'userlist.txt'), (options.users ?? ['postgres']).map((u) => `"${u}" ""\n`).join(''));
  writeFileSync(
    join(dir, 'pgbouncer.ini'),
    [
      '[databases]',
      `${database} = host=${server.hostname} port=${server.port || 5432} dbname=${database}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      'unix_socket_dir =',
      'auth_type = trust',
      `auth_file = ${join(dir, 'userlist.txt')}`,
      `pool_mode = ${options.mode}`,
      `default_pool_size = ${options.poolSize ?? 2}`,
      'max_client_conn = 200',
      `logfile = ${logFile}`,
      '',
    ].join('\n'),
  );
  const asRoot = process.getuid?.() === 0;
  if (asRoot) {
    const [uid, gid] = ['-u', '-g'].map((flag) => Number(execFileSync('id', [flag, 'postgres'], { encoding: 'utf8' }).trim()));
    for (const f of ['', 'userlist.txt', 'pgbouncer.ini']) chownSync(join(dir, f), uid!, gid!);
  }
  const args = [join(dir, 'pgbouncer.ini')];
  const child: ChildProcess = asRoot
    ? spawn('runuser', ['-u', 'postgres', '--', PGBOUNCER_BIN, ...args], { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] })
    : spawn(PGBOUNCER_BIN, args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout?.on('data', (b: Buffer) => (output += b.toString()));
  child.stderr?.on('data', (b: Buffer) => (output += b.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const log = () => output + (existsSync(logFile) ? readFileSync(logFile, 'utf8') : '');
  let stopped: Promise<void> | null = null;
  const stop = () =>
    (stopped ??= (async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    })());
  // Listening: a TCP connect succeeds (bounded; its exit ends the wait at once).
  const deadline = Date.now() + 20_000;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      const text = log();
      await stop();
      throw new Error(`pgbouncer exited at start:\n${text}`);
    }
    const ok = await new Promise<boolean>((resolve) => {
      const s = connect(port, '127.0.0.1', () => {
        s.end();
        resolve(true);
      });
      s.on('error', () => resolve(false));
    });
    if (ok) break;
    if (Date.now() > deadline) {
      const text = log();
      await stop();
      throw new Error(`pgbouncer did not listen within 20 s:\n${text}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return { port, url: `postgres://postgres@127.0.0.1:${port}/${database}`, log, stop };
}
