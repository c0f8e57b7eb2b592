#!/usr/bin/env node
import { parseArgs } from 'node:util';
import { ConfigError } from '../config/load.js';
import { readConfig } from '../config/read-file.js';
import type { Config } from '../config/schema.js';
import { createJsonLogger, type LogLevel } from '../http/logger.js';
import { migrateSqlite, openSqlite } from '../store/sqlite/index.js';
import { auditCommand, tokenCommand } from './cli-audit.js';
import { startGateway } from './node.js';

const HELP = `fencegate — a fencing-aware side-effect gateway

Usage:
  fencegate serve   --config FILE [--port N] [--db PATH | --database-url URL]
  fencegate migrate (--config FILE | --db PATH | --database-url URL)
  fencegate audit   (--url URL [--token T] | --db PATH | --config FILE) [--entity E] [--reason R]
                    [--caller C] [--since 2h] [--until T] [--limit N] [--format table|csv|ndjson]
  fencegate token   --config FILE --sub NAME [--scope "fencegate:proxy fencegate:audit"] [--ttl 1h]
  fencegate --help  (fencegate audit --help, fencegate token --help: their options)

Options:
  --config FILE        JSON configuration (see README: Configuration)
  --port N             override listen.port
  --db PATH            use this SQLite file as the store (overrides store)
  --database-url URL   use this PostgreSQL database (also DATABASE_URL)
  --help               show this text

Environment:
  FENCEGATE_LOG_LEVEL  info (default) | warn | error | silent
  FENCEGATE_TOKEN      bearer token for fencegate audit --url (keeps it out of ps)
`;

async function main(argv: string[]): Promise<number> {
  // Subcommands with options of their own.
  if (argv[0] === 'audit') return auditCommand(argv.slice(1));
  if (argv[0] === 'token') return tokenCommand(argv.slice(1));
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      config: { type: 'string' },
      port: { type: 'string' },
      db: { type: 'string' },
      'database-url': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  const command = positionals[0];
  if (values.help || command === undefined || command === 'help') {
    process.stdout.write(HELP);
    return command === undefined && !values.help ? 2 : 0;
  }
  const logger = createJsonLogger({ level: (process.env.FENCEGATE_LOG_LEVEL as LogLevel | undefined) ?? 'info' });

  if (command === 'migrate') {
    const store = storeFrom(values);
    if (store === null) return usage('migrate needs --config, --db or --database-url');
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
      const applied = await migratePostgresUrl(store.postgres);
      logger.info('migrated', { store: 'postgres', applied });
      return 0;
    }
    return usage('store.d1 is migrated with wrangler: npx wrangler d1 migrations apply DB --local');
  }

  if (command === 'serve') {
    if (values.config === undefined) return usage('serve needs --config FILE');
    const config = readConfig(values.config);
    if (values.port !== undefined) {
      if (!/^\d{1,5}$/.test(values.port) || Number(values.port) > 65535) return usage('--port must be a number from 0 to 65535');
      config.listen.port = Number(values.port);
    }
    const store = storeFrom(values, config);
    if (store !== null) config.store = store;
    const running = await startGateway({ config, logger });
    logger.info('listening', { url: running.url, store: running.gateway.store.kind, routes: config.routes.map((r) => r.name) });
    let stopping = false;
    const stop = (signal: string) => {
      if (stopping) {
        logger.warn('forced-exit', { signal });
        process.exit(1);
      }
      stopping = true;
      logger.info('shutting-down', { signal, inflight: running.gateway.inflight() });
      running.close().then(
        () => {
          logger.info('stopped', {});
          process.exit(0);
        },
        (err) => {
          logger.error('shutdown-failed', { error: String(err) });
          process.exit(1);
        },
      );
    };
    process.on('SIGTERM', () => stop('SIGTERM'));
    process.on('SIGINT', () => stop('SIGINT'));
    return -1; // keep running
  }
  return usage(`unknown command "${command}"`);
}

function storeFrom(values: { config?: string; db?: string; 'database-url'?: string }, config?: Config): Config['store'] | null {
  if (values.db !== undefined) return { sqlite: values.db, synchronous: config && 'sqlite' in config.store ? config.store.synchronous : 'FULL' };
  const url = values['database-url'] ?? process.env.DATABASE_URL;
  if (url !== undefined && url !== '') return { postgres: url, poolSize: config && 'postgres' in config.store ? config.store.poolSize : 10 };
  if (config !== undefined) return null;
  if (values.config !== undefined) return readConfig(values.config).store;
  return null;
}

function usage(message: string): number {
  process.stderr.write(`fencegate: ${message}\n\n${HELP}`);
  return 2;
}

main(process.argv.slice(2)).then(
  (code) => {
    if (code >= 0) process.exit(code);
  },
  (err) => {
    if (err instanceof ConfigError) process.stderr.write(`fencegate: ${err.message}\n`);
    else process.stderr.write(`fencegate: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  },
);
