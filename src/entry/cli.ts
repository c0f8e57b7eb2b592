#!/usr/bin/env node
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { configJsonSchemaText } from '../config/json-schema.js';
import { prepareConfig } from '../config/prepare.js';
import { readConfig } from '../config/read-file.js';
import type { Config } from '../config/schema.js';
import { createJsonLogger, LOG_LEVELS, parseLogLevel, type Logger } from '../http/logger.js';
import { migrateLeasePostgresUrl, migrateLeaseSqlite } from '../lease/migrate.js';
import { DEFAULT_QUERY_TIMEOUT_MS } from '../store/query-timeout.js';
import { migrateSqlite, openSqlite } from '../store/sqlite/index.js';
import { auditCommand, tokenCommand } from './cli-audit.js';
import { auditCommandsCommand } from './cli-audit-commands.js';
import { reportError, UsageError } from './cli-errors.js';
import { CONFIG_HELP, HELP, MIGRATE_HELP, SERVE_HELP } from './cli-help.js';
import { resolveUnknownCommand } from './cli-resolve.js';
import { groupDrained, metricsGroup, relayWakeups, runPrimary, signalReady, workersFrom, workerSlot, WORKERS_ENV } from './cluster.js';
import { startGateway } from './node.js';

async function main(argv: string[]): Promise<number> {
  // Subcommands with options of their own.
  // `fencegate audit commands …`: the command log (./cli-audit-commands.ts).
  if (argv[0] === 'audit' && argv[1] === 'commands') return auditCommandsCommand(argv.slice(2));
  if (argv[0] === 'audit') return auditCommand(argv.slice(1));
  if (argv[0] === 'token') return tokenCommand(argv.slice(1));
  if (argv[0] === 'resolve-unknown') return resolveUnknownCommand(argv.slice(1));
  if (argv[0] === 'config') return configCommand(argv.slice(1));
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      config: { type: 'string' },
      port: { type: 'string' },
      db: { type: 'string' },
      'database-url': { type: 'string' },
      lease: { type: 'boolean' },
      workers: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
      version: { type: 'boolean' },
    },
  });
  if (values.version) {
    process.stdout.write(`fencegate ${packageVersion()}\n`);
    return 0;
  }
  const command = positionals[0];
  if (command !== undefined && command !== 'serve' && command !== 'migrate' && command !== 'help') return usage(`unknown command "${command}"`);
  if (positionals.length > 1) return usage(`unexpected argument "${positionals[1]}"`, command);
  if (values.help || command === undefined || command === 'help') {
    process.stdout.write(command === 'serve' ? SERVE_HELP : command === 'migrate' ? MIGRATE_HELP : HELP);
    return command === undefined && !values.help ? 2 : 0;
  }
  const level = parseLogLevel(process.env.FENCEGATE_LOG_LEVEL || 'info');
  if (level === null)
    return usage(`FENCEGATE_LOG_LEVEL must be one of ${LOG_LEVELS.join(', ')} (it is ${JSON.stringify(process.env.FENCEGATE_LOG_LEVEL)})`, command);
  const logger = createJsonLogger({ level });

  if (command === 'migrate') {
    const store = storeFrom(values);
    if (store === null) return usage('migrate needs --config, --db or --database-url (or FENCEGATE_CONFIG, DATABASE_URL)', 'migrate');
    if (values.lease) return migrateLease(store, logger);
    if ('sqlite' in store) {
      const db = openSqlite(store.sqlite);
      const applied = migrateSqlite(db);
      db.close();
      logger.info('migrated', { store: 'sqlite', applied });
      return 0;
    }
    if ('postgres' in store) {
      const pgModule = '../store/postgres/index.js';
      const { migratePostgresUrl } = await import(pgModule);
      const applied = await migratePostgresUrl(store.postgres, { schema: store.schema, pooler: store.pooler });
      logger.info('migrated', { store: 'postgres', applied });
      return 0;
    }
    return usage('store.d1 is migrated with wrangler: npx wrangler d1 migrations apply DB --local', 'migrate');
  }

  if (command === 'serve') {
    // A container or a unit names its file in the environment (docs/deploy.md §1); --config wins over it.
    const configPath = values.config ?? (process.env.FENCEGATE_CONFIG || undefined);
    if (configPath === undefined) return usage('serve needs --config FILE (or FENCEGATE_CONFIG)', 'serve');
    // The port: --port, else PORT (set by platforms that assign one), else listen.port (docs/deploy.md §2).
    const port = portOverride(values.port, process.env.PORT);
    if (typeof port === 'string') return usage(port, 'serve');
    // Every `{ "env": … }`, secrets included, is resolved now: a missing one stops start-up before the store is opened.
    // A reload (SIGHUP) reads the file again the same way, with the same overrides.
    const load = (): Config => {
      const config = readConfig(configPath, { env: process.env });
      if (port !== null) config.listen.port = port;
      const store = storeFrom(values, config);
      if (store !== null) config.store = store;
      return config;
    };
    const config = load();
    // `--workers N` (else FENCEGATE_WORKERS, else one per core up to 8): N
    // processes on one socket and one store (./cluster.ts). The primary
    // checks the whole configuration first, as a single process would, so
    // that a bad file fails once, here, and not in every worker.
    const workers = workersFrom(values.workers, process.env[WORKERS_ENV]);
    if (typeof workers === 'string') return usage(workers, 'serve');
    const slot = workerSlot();
    if (workers > 1 && slot === null) {
      await prepareConfig(config, process.env);
      return runPrimary({ workers, logger });
    }
    // A worker of a group says which on every line.
    const log = slot === null ? logger : withFields(logger, { worker: slot });
    // Until the gateway runs, a SIGHUP is not a reload, and must not be Node's default (exit).
    let onHangup = (): void =>
      log.warn('config-reload-failed', { config: configPath, error: 'the gateway is still starting; send SIGHUP again once it listens' });
    process.on('SIGHUP', () => onHangup());
    // A worker of a group: the background work in worker 0 only, the group's /metrics.
    const group = metricsGroup();
    // Waiters on a SQLite file woken by the other workers' changes (PostgreSQL's LISTEN already does it).
    if ('sqlite' in config.store) relayWakeups();
    const running = await startGateway({
      config,
      logger: log,
      ...(slot === null ? {} : { background: slot === 0 }),
      ...(group === null ? {} : { metricsGroup: group }),
      ...(slot === null ? {} : { groupDrained }),
    });
    log.info('listening', {
      url: running.url,
      console: `${running.url}${config.adminPrefix}/`,
      store: running.gateway.store.kind,
      routes: config.routes.map((r) => r.name),
      ...(slot === null ? {} : { pid: process.pid }),
    });
    // SIGHUP: the file again, validated as at start-up; swapped in only whole
    // (docs/deploy.md §4). One reload at a time; a signal during one
    // runs one more after it, so that the last edit is the one in force.
    let reloading: Promise<void> | null = null;
    let again = false;
    const reload = (): void => {
      if (reloading !== null) {
        again = true;
        return;
      }
      reloading = (async () => {
        try {
          const next = load();
          await running.reload(next);
          log.info('config-reloaded', { config: configPath, routes: next.routes.map((r) => r.name) });
        } catch (err) {
          // The running configuration stays; the line says what was refused, as start-up would.
          const error = err instanceof Error ? err.message.replace(/^invalid configuration:\n\s*/, '').replace(/\n\s*/g, '; ') : String(err);
          log.error('config-reload-failed', { config: configPath, error });
        }
      })().finally(() => {
        reloading = null;
        if (again) {
          again = false;
          reload();
        }
      });
    };
    onHangup = reload;
    let stopping = false;
    let stoppingAt = 0;
    const stop = (signal: string) => {
      if (stopping) {
        // One Ctrl-C reaches every process of the terminal's group, so a
        // gateway run by a wrapper (`npm start`) gets it twice within
        // milliseconds: only a signal sent again later forces the exit
        // (and gives up the finishes that the graceful close waits for).
        if (performance.now() - stoppingAt < 1000) return;
        log.warn('forced-exit', { signal });
        process.exit(1);
      }
      stopping = true;
      stoppingAt = performance.now();
      log.info('shutting-down', { signal, inflight: running.gateway.inflight() });
      running.close().then(
        () => {
          log.info('stopped', {});
          process.exit(0);
        },
        (err) => {
          log.error('shutdown-failed', { error: String(err) });
          process.exit(1);
        },
      );
    };
    process.on('SIGTERM', () => stop('SIGTERM'));
    process.on('SIGINT', () => stop('SIGINT'));
    // In a group: ready for the primary's signals only now that they are handled (one sent earlier would kill the worker undrained).
    signalReady();
    return -1; // keep running
  }
  return usage(`unknown command "${command}"`);
}

/**
 * `fencegate config schema`: the configuration's JSON Schema, generated from
 * the zod schema (examples/fencegate.schema.json is its committed copy).
 * `fencegate config check`: the file validated as `serve` would validate it
 * (environment variables, key and TLS files), without opening the store or
 * a socket; for a deployment pipeline, before a restart or a SIGHUP.
 */
async function configCommand(argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: { config: { type: 'string' }, help: { type: 'boolean', short: 'h' } },
  });
  const sub = positionals[0];
  if (values.help || sub === undefined) {
    process.stdout.write(CONFIG_HELP);
    return values.help ? 0 : 2;
  }
  if (positionals.length > 1) return usage(`unexpected argument "${positionals[1]}"`, 'config');
  if (sub === 'schema') {
    process.stdout.write(configJsonSchemaText());
    return 0;
  }
  if (sub === 'check') {
    const path = values.config ?? (process.env.FENCEGATE_CONFIG || undefined);
    if (path === undefined) return usage('config check needs --config FILE (or FENCEGATE_CONFIG)', 'config');
    const config = await prepareConfig(readConfig(path, { env: process.env }), process.env);
    process.stdout.write(
      `${path}: valid (${config.routes.length} route${config.routes.length === 1 ? '' : 's'}: ${config.routes.map((r) => r.name).join(', ')})\n`,
    );
    return 0;
  }
  return usage(`unknown config command "${sub}" (schema, check)`, 'config');
}

/**
 * `fencegate migrate --lease`: the lease module's own schema (DESIGN §6,
 * migrations/lease/, ledger fencegate_lease_migrations) on the store's
 * database, and nothing of the gateway's.
 */
async function migrateLease(store: Config['store'], logger: Logger): Promise<number> {
  if ('d1' in store) return usage('--lease needs a SQLite or PostgreSQL store: the lease module has no D1 store', 'migrate');
  if ('sqlite' in store) {
    const db = openSqlite(store.sqlite);
    try {
      logger.info('migrated', { store: 'sqlite', schema: 'lease', applied: migrateLeaseSqlite(db) });
    } finally {
      db.close();
    }
    return 0;
  }
  logger.info('migrated', { store: 'postgres', schema: 'lease', applied: await migrateLeasePostgresUrl(store.postgres) });
  return 0;
}

/** `--port`, else a non-empty PORT, as a port number; null when neither is set; a string saying what is wrong. */
function portOverride(flag: string | undefined, env: string | undefined): number | null | string {
  const [name, value] = flag !== undefined ? ['--port', flag] : env !== undefined && env !== '' ? ['PORT', env] : [null, null];
  if (name === null) return null;
  if (!/^\d{1,5}$/.test(value) || Number(value) > 65535) return `${name} must be a number from 0 to 65535`;
  return Number(value);
}

function storeFrom(values: { config?: string; db?: string; 'database-url'?: string }, config?: Config): Config['store'] | null {
  if (values.db !== undefined) return { sqlite: values.db, synchronous: config && 'sqlite' in config.store ? config.store.synchronous : 'FULL' };
  const url = values['database-url'] ?? process.env.DATABASE_URL;
  // The URL replaces the configured one; the other PostgreSQL settings (schema, pooler, listenUrl, queryTimeout) stay.
  if (url !== undefined && url !== '')
    return { ...(config && 'postgres' in config.store ? config.store : { poolSize: 10, queryTimeout: DEFAULT_QUERY_TIMEOUT_MS }), postgres: url };
  if (config !== undefined) return null;
  const path = values.config ?? (process.env.FENCEGATE_CONFIG || undefined);
  if (path !== undefined) return readConfig(path).store;
  return null;
}

/** The logger with `extra` added to every line's fields. */
function withFields(logger: Logger, extra: Record<string, unknown>): Logger {
  const wrap = (f: (msg: string, fields?: Record<string, unknown>) => void) => (msg: string, fields?: Record<string, unknown>) =>
    f(msg, { ...fields, ...extra });
  const out: Logger = { info: wrap(logger.info), warn: wrap(logger.warn), error: wrap(logger.error) };
  if (logger.debug) out.debug = wrap(logger.debug);
  return out;
}

/** A usage error: one line naming the command's help (exit 2, see ./cli-errors.ts). */
function usage(message: string, command?: string): number {
  return reportError(new UsageError(message), command);
}

const argv = process.argv.slice(2);
let settled = false;
// A command whose promise never settles while nothing else keeps the process
// alive would otherwise end with exit code 0 and no word: say so, and fail.
process.once('beforeExit', () => {
  if (settled) return;
  process.stderr.write('fencegate: the command stopped before it finished (a promise that never settled; FENCEGATE_DEBUG=1 and a bug report help)\n');
  process.exit(1);
});
main(argv).then(
  (code) => {
    settled = true;
    if (code >= 0) process.exit(code);
  },
  (err) => {
    settled = true;
    process.exit(
      reportError(
        err,
        ['serve', 'migrate', 'audit', 'token', 'resolve-unknown', 'config'].find((c) => c === argv[0]),
      ),
    );
  },
);

/** The version in package.json, two folders up from this file in src/ and in dist/ alike. */
function packageVersion(): string {
  return (JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }).version;
}
