import { execFile, execFileSync } from 'node:child_process';
import { chownSync, existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { freePort } from './upstream.js';
import { tempDir } from './temp.js';

/**
 * A PRIVATE PostgreSQL server for one test file (initdb into a temporary
 * directory, `pg_ctl start` on a free loopback port), so that a test can
 * stop and restart "the database" without disturbing the shared server the
 * other test files use. As root the server binaries run as the `postgres`
 * OS user (PostgreSQL refuses to run as root); the directory is theirs.
 */

export interface PrivatePostgres {
  /** `postgres://postgres@127.0.0.1:<port>/postgres` (trust auth). */
  url: string;
  port: number;
  /** The temporary directory: data/, server.log, the unix socket. */
  dir: string;
  /** `pg_ctl stop -m <mode>`; resolves once the server is down. */
  stop(mode?: 'smart' | 'fast' | 'immediate'): Promise<void>;
  /** `pg_ctl start` with the same options; resolves once it accepts connections. */
  start(): Promise<void>;
  /** `pg_ctl promote` (a standby becomes a primary); resolves once it is one. */
  promote(): Promise<void>;
  /** The server log so far (for failure messages). */
  log(): string;
  /** Stops the server (immediate) and deletes the directory. Idempotent; never throws. */
  destroy(): Promise<void>;
}

/**
 * Where initdb and pg_ctl live: `FENCEGATE_PG_BIN`, else the newest Debian
 * `/usr/lib/postgresql/<n>/bin`, else `pg_config --bindir`. Null when there
 * is no initdb (the caller skips with a message).
 */
export function findPostgresBin(): string | null {
  const candidates: string[] = [];
  if (process.env.FENCEGATE_PG_BIN) candidates.push(process.env.FENCEGATE_PG_BIN);
  try {
    const versions = readdirSync('/usr/lib/postgresql')
      .filter((v) => /^\d+$/.test(v))
      .sort((a, b) => Number(b) - Number(a));
    candidates.push(...versions.map((v) => `/usr/lib/postgresql/${v}/bin`));
  } catch {
    // not Debian's layout
  }
  try {
    candidates.push(execFileSync('pg_config', ['--bindir'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim());
  } catch {
    // no pg_config on PATH
  }
  return candidates.find((dir) => existsSync(join(dir, 'initdb')) && existsSync(join(dir, 'pg_ctl'))) ?? null;
}

/** The `postgres` OS user's uid/gid when we are root (the server must not run as root), else null. */
function serverUser(): { uid: number; gid: number } | null {
  if (process.getuid?.() !== 0) return null;
  const [uid, gid] = ['-u', '-g'].map((flag) => Number(execFileSync('id', [flag, 'postgres'], { encoding: 'utf8' }).trim()));
  return { uid: uid!, gid: gid! };
}

export interface PrivatePostgresOptions {
  /**
   * More `-c name=value` server settings, e.g. `synchronous_standby_names`,
   * `synchronous_commit`, `wal_level`, `max_wal_senders` (the defaults,
   * replica and 10, already let a standby stream; initdb's pg_hba.conf
   * trusts replication from 127.0.0.1).
   */
  settings?: Record<string, string>;
  /**
   * Make this server a streaming standby of the server on that loopback port
   * (a PrivatePostgres, or a proxy in front of one) with `pg_basebackup -R`,
   * which writes standby.signal and primary_conninfo, instead of initdb.
   */
  standbyOf?: { port: number };
  /** `cluster_name`: a standby's walreceiver reports it as application_name, which synchronous_standby_names matches. */
  name?: string;
}

export async function startPrivatePostgres(bin: string, init: PrivatePostgresOptions = {}): Promise<PrivatePostgres> {
  const user = serverUser();
  const dir = tempDir('fencegate-pg-').dir;
  if (user !== null) chownSync(dir, user.uid, user.gid);
  const data = join(dir, 'data');
  const logFile = join(dir, 'server.log');
  const port = await freePort();
  // Run a server binary as the server's user, from the temporary directory
  // (the postgres user may not read the caller's working directory).
  const run = (tool: string, args: string[], timeoutMs = 120_000) =>
    new Promise<string>((resolve, reject) => {
      const [file, argv] = user === null ? [join(bin, tool), args] : ['runuser', ['-u', 'postgres', '--', join(bin, tool), ...args]];
      execFile(file, argv, { cwd: dir, timeout: timeoutMs, encoding: 'utf8' }, (err, stdout, stderr) => {
        if (err) reject(new Error(`${tool} ${args.join(' ')} failed: ${err.message}\n${stdout}\n${stderr}`));
        else resolve(stdout);
      });
    });
  // A throwaway cluster: no fsync (a fast stop still checkpoints cleanly),
  // loopback only, its socket in the temporary directory.
  const options = [
    `-p ${port}`,
    `-k ${dir}`,
    '-c listen_addresses=127.0.0.1',
    '-c fsync=off',
    '-c full_page_writes=off',
    '-c max_connections=60',
    '-c shared_buffers=16MB',
    ...(init.name === undefined ? [] : [`-c cluster_name=${init.name}`]),
    ...Object.entries(init.settings ?? {}).map(([k, v]) => `-c ${k}=${v}`),
  ].join(' ');
  const pgCtl = (args: string[]) => run('pg_ctl', ['-D', data, '-w', '-t', '60', ...args]);

  let destroyed = false;
  const stopNow = () => {
    try {
      execFileSync(
        user === null ? join(bin, 'pg_ctl') : 'runuser',
        user === null ? ['-D', data, '-m', 'immediate', 'stop'] : ['-u', 'postgres', '--', join(bin, 'pg_ctl'), '-D', data, '-m', 'immediate', 'stop'],
        {
          cwd: dir,
          stdio: 'ignore',
          timeout: 30_000,
        },
      );
    } catch {
      // not running
    }
  };
  // Last resort if the test process exits without its afterAll.
  const onExit = () => {
    if (destroyed) return;
    stopNow();
    rmSync(dir, { recursive: true, force: true });
  };
  process.once('exit', onExit);

  const instance: PrivatePostgres = {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    port,
    dir,
    async stop(mode = 'fast') {
      await pgCtl(['-m', mode, 'stop']);
    },
    async start() {
      await pgCtl(['-l', logFile, '-o', options, 'start']);
    },
    async promote() {
      await pgCtl(['promote']);
    },
    log: () => (existsSync(logFile) ? readFileSync(logFile, 'utf8') : ''),
    async destroy() {
      if (destroyed) return;
      destroyed = true;
      process.off('exit', onExit);
      stopNow();
      rmSync(dir, { recursive: true, force: true });
    },
  };
  try {
    if (init.standbyOf === undefined) await run('initdb', ['-D', data, '-A', 'trust', '-U', 'postgres', '-E', 'UTF8', '--locale=C', '--no-sync']);
    else
      await run('pg_basebackup', [
        '-D',
        data,
        '-R',
        '-X',
        'stream',
        '-c',
        'fast',
        '--no-sync',
        '-h',
        '127.0.0.1',
        '-p',
        String(init.standbyOf.port),
        '-U',
        'postgres',
      ]);
    await instance.start();
  } catch (err) {
    await instance.destroy();
    throw err;
  }
  return instance;
}
