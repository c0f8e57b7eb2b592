import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { parseArgs } from 'node:util';
import { SignJWT } from 'jose';
import { ConfigError } from '../config/load.js';
import { readConfig } from '../config/read-file.js';
import type { Config } from '../config/schema.js';
import { parseDuration } from '../core/duration.js';
import { verificationKeys } from '../protocol/keys.js';
import { parseRejectionQuery } from '../http/admin.js';
import { rejectionPages } from '../http/audit/export.js';
import { CSV_HEADER, csvLine, ndjsonLine, rejectionJson, tableHeader, tableLine, visibleText, type RejectionJson } from '../http/audit/format.js';
import { SCOPES } from '../http/middleware/auth/verify.js';
import type { GatewayStore } from '../store/types.js';
import { CliError, gatewayFetch, parseUrlFlag, reportError, UsageError } from './cli-errors.js';
import { AUDIT_HELP, TOKEN_HELP } from './cli-help.js';
import { REJECTION_REASONS } from './cli-reasons.js';
import { openStore } from './open-store.js';

export { AUDIT_HELP, TOKEN_HELP };

export { REJECTION_REASONS };

/** `fencegate audit`. Returns the exit code. */
export async function auditCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      url: { type: 'string' },
      token: { type: 'string' },
      db: { type: 'string' },
      config: { type: 'string' },
      entity: { type: 'string' },
      reason: { type: 'string' },
      caller: { type: 'string' },
      tool: { type: 'string' },
      since: { type: 'string' },
      until: { type: 'string' },
      limit: { type: 'string' },
      format: { type: 'string', default: 'table' },
      'admin-prefix': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help) return out(AUDIT_HELP, 0);
  const format = values.format!;
  if (format !== 'table' && format !== 'csv' && format !== 'ndjson') return usage('--format must be table, csv or ndjson');
  if (values.limit !== undefined && !/^[1-9]\d{0,9}$/.test(values.limit)) return usage('--limit must be a positive integer');
  if (values.reason !== undefined && !(REJECTION_REASONS as string[]).includes(values.reason)) {
    // `stale_fence` for `stale-fence`: the log's reasons are the problem codes, with hyphens.
    const hyphens = values.reason.toLowerCase().replace(/_/g, '-');
    const hint = (REJECTION_REASONS as string[]).includes(hyphens) ? ` (did you mean ${hyphens}?)` : '';
    return usage(`--reason "${values.reason}" is not a reason${hint}; one of: ${REJECTION_REASONS.join(', ')}`);
  }

  const filters = new URLSearchParams();
  for (const name of ['entity', 'reason', 'caller', 'tool', 'since', 'until'] as const) if (values[name] !== undefined) filters.set(name, values[name]!);
  // The same validation as the API: a bad --since fails here, naming the flag.
  const query = parseRejectionQuery(filters);
  if (typeof query === 'string') return usage(`--${query}`);
  const max = values.limit === undefined ? Infinity : Number(values.limit);
  const line = format === 'csv' ? csvLine : format === 'ndjson' ? ndjsonLine : tableLine;
  const header = format === 'csv' ? CSV_HEADER : format === 'table' ? tableHeader() : '';
  // `fencegate audit | head`: a closed pipe ends the export quietly.
  process.stdout.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') process.exit(0);
    throw err;
  });

  if (values.url !== undefined) {
    const config = values.config === undefined ? null : readConfig(values.config);
    const prefix = values['admin-prefix'] ?? config?.adminPrefix ?? '/_fencegate';
    const token = values.token ?? process.env.FENCEGATE_TOKEN;
    const url = new URL(`${prefix}/v1/rejections`, parseUrlFlag('--url', values.url));
    // Absolute times, so that the gateway's clock and ours agree on the window.
    if (query.since) filters.set('since', query.since.toISOString());
    if (query.until) filters.set('until', query.until.toISOString());
    if (values.limit !== undefined) filters.set('limit', String(Math.min(max, 1000)));
    filters.forEach((v, k) => url.searchParams.set(k, v));
    // A limit over one page: stream everything and stop reading at `max`.
    if (max > 1000) url.searchParams.delete('limit');
    const res = await gatewayFetch(url, { headers: { accept: 'application/x-ndjson', ...(token ? { authorization: `Bearer ${token}` } : {}) } });
    if (!res.ok || res.body === null) throw new CliError(await answerProblem(res, token !== undefined && token !== ''));
    await write(header);
    await eachNdjsonRow(res.body, max, (row) => write(line(row as RejectionJson)));
    return 0;
  }

  const store = await openAuditStore(values);
  if (store === null) return usage('audit needs --url, --db or --config');
  try {
    await write(header);
    const { limit: _limit, ...filtered } = query;
    for await (const page of rejectionPages(store, filtered, max)) {
      let text = '';
      for (const row of page) text += line(rejectionJson(row));
      await write(text);
    }
  } finally {
    await store.close();
  }
  return 0;
}

/**
 * An NDJSON answer of the audit API, row by row, at most `max` rows, each
 * handed to `each` in order: the `--url` exports of `fencegate audit` and
 * `fencegate audit commands` (./cli-audit-commands.ts).
 */
export async function eachNdjsonRow(body: ReadableStream<Uint8Array>, max: number, each: (row: unknown) => Promise<void>): Promise<void> {
  let n = 0;
  let rest = '';
  const decoder = new TextDecoder();
  for await (const chunk of body as unknown as AsyncIterable<Uint8Array>) {
    rest += decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = rest.indexOf('\n')) >= 0 && n < max) {
      const text = rest.slice(0, nl);
      rest = rest.slice(nl + 1);
      if (text === '') continue;
      await each(JSON.parse(text));
      n++;
    }
    if (n >= max) break;
  }
}

/** `fencegate token`. Returns the exit code. */
export async function tokenCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      config: { type: 'string' },
      sub: { type: 'string' },
      scope: { type: 'string', default: 'fencegate:proxy' },
      ttl: { type: 'string', default: '1h' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help) return out(TOKEN_HELP, 0);
  const usage = (message: string) => reportError(new UsageError(message), 'token');
  if (values.config === undefined) return usage('token needs --config FILE (its auth.secret signs the token)');
  if (values.sub === undefined || values.sub === '') return usage('token needs --sub NAME');
  const ttl = parseDuration(values.ttl!);
  if (ttl === null || ttl < 1000) return usage('--ttl must be a duration such as 15m, 1h, 7d');
  const scopes = values.scope!.split(/[ ,]+/).filter(Boolean);
  const unknown = scopes.filter((s) => !(SCOPES as readonly string[]).includes(s));
  if (unknown.length > 0) return usage(`unknown scope ${unknown.join(', ')} (expected ${SCOPES.join(', ')})`);
  const config = readConfig(values.config);
  if (config.auth === undefined) {
    throw new CliError(
      `${values.config} has no "auth" section: that gateway checks no tokens, so none is needed (without auth its admin API answers on a loopback listener, e.g. fencegate audit --url http://127.0.0.1:${config.listen.port})`,
    );
  }
  const keys = verificationKeys(config.auth, process.env, 'auth');
  if (keys.secret === null) throw new CliError('auth has no HS256 secret: tokens for public keys come from whoever holds the private key');
  const issuer = Array.isArray(config.auth.issuer) ? config.auth.issuer[0]! : config.auth.issuer;
  const token = await new SignJWT({ scope: scopes.join(' ') })
    .setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
    .setIssuer(issuer)
    .setAudience(config.auth.audience)
    .setSubject(values.sub)
    .setIssuedAt()
    .setJti(randomUUID())
    .setExpirationTime(Math.floor((Date.now() + ttl) / 1000))
    .sign(keys.secret);
  return out(`${token}\n`, 0);
}

export async function openAuditStore(values: { db?: string; config?: string }): Promise<GatewayStore | null> {
  let store: Config['store'] | null = null;
  if (values.db !== undefined) store = { sqlite: values.db, synchronous: 'FULL' };
  else if (values.config !== undefined) store = readConfig(values.config).store;
  if (store === null) return null;
  if ('d1' in store) throw new ConfigError('store.d1 lives on Cloudflare: use fencegate audit --url against the Worker', []);
  // An export reads pages one after another: two connections are plenty.
  return openStore(store, { poolSize: 2 });
}

/** Writes to stdout, waiting when the pipe is full (`| head`, a slow terminal). */
export async function write(text: string): Promise<void> {
  if (text === '') return;
  if (!process.stdout.write(text)) await once(process.stdout, 'drain');
}

function out(text: string, code: number): number {
  process.stdout.write(text);
  return code;
}

function usage(message: string): number {
  return reportError(new UsageError(message), 'audit');
}

/**
 * A refusal from the gateway in one line: status, the problem's detail
 * (made visible: it may echo what a caller sent, and goes to a terminal),
 * and what to do about a 401 or 403.
 */
export async function answerProblem(res: Response, hadToken: boolean): Promise<string> {
  const text = (await res.text()).slice(0, 2000);
  let detail = text;
  try {
    const p = JSON.parse(text) as { detail?: unknown; title?: unknown };
    if (typeof p.detail === 'string') detail = p.detail;
    else if (typeof p.title === 'string') detail = p.title;
  } catch {
    // not JSON: the text as it is
  }
  const hint =
    res.status === 401
      ? hadToken
        ? ' (the token was refused: mint a new one, or check issuer and audience)'
        : ' (pass --token T or set FENCEGATE_TOKEN)'
      : res.status === 403
        ? ' (the token lacks the scope this needs)'
        : '';
  return `${res.status} ${res.statusText}: ${visibleText(detail).replace(/\s+/g, ' ')}${hint}`;
}
