import { parseArgs } from 'node:util';
import { readConfig } from '../config/read-file.js';
import {
  commandCsvLine,
  commandJson,
  commandNdjsonLine,
  commandPages,
  commandTableHeader,
  commandTableLine,
  COMMAND_CSV_HEADER,
  parseCommandQuery,
  type CommandJson,
} from '../http/audit/commands.js';
import { answerProblem, eachNdjsonRow, openAuditStore, write } from './cli-audit.js';
import { CliError, gatewayFetch, parseUrlFlag, reportError, UsageError } from './cli-errors.js';
import { AUDIT_COMMANDS_HELP } from './cli-help.js';

/**
 * `fencegate audit commands`: the command log (DESIGN §4.1 `commands`), in
 * the shape of `fencegate audit` (the rejection log): the same sources
 * (--url, --db, --config), formats and streaming. Returns the exit code.
 */
export async function auditCommandsCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      url: { type: 'string' },
      token: { type: 'string' },
      db: { type: 'string' },
      config: { type: 'string' },
      entity: { type: 'string' },
      key: { type: 'string' },
      route: { type: 'string' },
      caller: { type: 'string' },
      since: { type: 'string' },
      until: { type: 'string' },
      limit: { type: 'string' },
      format: { type: 'string', default: 'table' },
      'admin-prefix': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  const usage = (message: string) => reportError(new UsageError(message), 'audit commands');
  if (values.help) {
    process.stdout.write(AUDIT_COMMANDS_HELP);
    return 0;
  }
  const format = values.format!;
  if (format !== 'table' && format !== 'csv' && format !== 'ndjson') return usage('--format must be table, csv or ndjson');
  if (values.limit !== undefined && !/^[1-9]\d{0,9}$/.test(values.limit)) return usage('--limit must be a positive integer');

  const filters = new URLSearchParams();
  for (const name of ['entity', 'key', 'route', 'caller', 'since', 'until'] as const) if (values[name] !== undefined) filters.set(name, values[name]!);
  const query = parseCommandQuery(filters);
  if (typeof query === 'string') return usage(`--${query}`);
  const max = values.limit === undefined ? Infinity : Number(values.limit);
  const line = format === 'csv' ? commandCsvLine : format === 'ndjson' ? commandNdjsonLine : commandTableLine;
  const header = format === 'csv' ? COMMAND_CSV_HEADER : format === 'table' ? commandTableHeader() : '';
  process.stdout.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') process.exit(0);
    throw err;
  });

  if (values.url !== undefined) {
    const config = values.config === undefined ? null : readConfig(values.config);
    const prefix = values['admin-prefix'] ?? config?.adminPrefix ?? '/_fencegate';
    const token = values.token ?? process.env.FENCEGATE_TOKEN;
    const url = new URL(`${prefix}/v1/commands`, parseUrlFlag('--url', values.url));
    if (query.since) filters.set('since', query.since.toISOString());
    if (query.until) filters.set('until', query.until.toISOString());
    if (values.limit !== undefined && max <= 1000) filters.set('limit', String(max));
    filters.forEach((v, k) => url.searchParams.set(k, v));
    const res = await gatewayFetch(url, { headers: { accept: 'application/x-ndjson', ...(token ? { authorization: `Bearer ${token}` } : {}) } });
    if (!res.ok || res.body === null) throw new CliError(await answerProblem(res, token !== undefined && token !== ''));
    await write(header);
    await eachNdjsonRow(res.body, max, (row) => write(line(row as CommandJson)));
    return 0;
  }

  const store = await openAuditStore(values);
  if (store === null) return usage('audit commands needs --url, --db or --config');
  try {
    await write(header);
    const { limit: _limit, ...filtered } = query;
    for await (const page of commandPages(store, filtered, max)) {
      let text = '';
      for (const row of page) text += line(commandJson(row));
      await write(text);
    }
  } finally {
    await store.close();
  }
  return 0;
}
