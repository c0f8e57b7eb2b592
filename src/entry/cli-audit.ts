import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { parseArgs } from 'node:util';
import { SignJWT } from 'jose';
import { ConfigError } from '../config/load.js';
import { readConfig } from '../config/read-file.js';
import type { Config } from '../config/schema.js';
import { parseDuration } from '../core/duration.js';
import { verificationKeys } from '../config/keys.js';
import { parseRejectionQuery } from '../http/admin.js';
import { rejectionPages } from '../http/audit/export.js';
import { CSV_HEADER, csvLine, ndjsonLine, rejectionJson, tableHeader, tableLine, visibleText, type RejectionJson } from '../http/audit/format.js';
import { SCOPES } from '../http/middleware/auth/verify.js';
import type { GatewayStore } from '../store/types.js';
import { openStore } from './open-store.js';

export const AUDIT_HELP = `fencegate audit — read the rejection log

Usage:
  fencegate audit --url URL [--token T] [filters] [--format table|csv|ndjson]
  fencegate audit (--db PATH | --config FILE) [filters] [--format table|csv|ndjson]

Against a running gateway (--url, token from --token or FENCEGATE_TOKEN, with
the fencegate:audit scope), or straight against its store (--db, or the store
of --config). Every matching row is streamed, newest first.

Filters:
  --entity E        only this entity
  --reason R        stale-fence, idempotency-key-reused, outcome-unknown,
                    invalid-fence-signature, fence-expired, unauthorized,
                    forbidden, late-finish
  --caller C        only this caller (token sub)
  --since T         ISO 8601 time, or a duration back from now (2h, 30m, 7d)
  --until T         same
  --limit N         at most N rows (default: all)
  --admin-prefix P  the gateway's adminPrefix (default /_fencegate, or the config's)
`;

export const TOKEN_HELP = `fencegate token — mint a development JWT from the configured HS256 secret

Usage:
  fencegate token --config FILE --sub NAME [--scope "fencegate:proxy fencegate:audit"] [--ttl 1h]

Signs with auth.secret (HS256) and the config's issuer and audience. Prints the
token on stdout. For development and tests: production tokens come from your
identity provider.
`;

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

  const filters = new URLSearchParams();
  for (const name of ['entity', 'reason', 'caller', 'since', 'until'] as const) if (values[name] !== undefined) filters.set(name, values[name]!);
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
    const url = new URL(`${prefix}/v1/rejections`, values.url);
    // Absolute times, so that the gateway's clock and ours agree on the window.
    if (query.since) filters.set('since', query.since.toISOString());
    if (query.until) filters.set('until', query.until.toISOString());
    if (values.limit !== undefined) filters.set('limit', String(Math.min(max, 1000)));
    filters.forEach((v, k) => url.searchParams.set(k, v));
    // A limit over one page: stream everything and stop reading at `max`.
    if (max > 1000) url.searchParams.delete('limit');
    const res = await fetch(url, { headers: { accept: 'application/x-ndjson', ...(token ? { authorization: `Bearer ${token}` } : {}) } });
    if (!res.ok || res.body === null) {
      // The answer may echo what a caller sent; it goes to a terminal.
      process.stderr.write(`fencegate: ${res.status} ${visibleText(`${res.statusText}: ${(await res.text()).slice(0, 2000)}`)}\n`);
      return 1;
    }
    await write(header);
    let n = 0;
    let rest = '';
    const decoder = new TextDecoder();
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      rest += decoder.decode(chunk, { stream: true });
      let nl: number;
      while ((nl = rest.indexOf('\n')) >= 0 && n < max) {
        const text = rest.slice(0, nl);
        rest = rest.slice(nl + 1);
        if (text === '') continue;
        await write(line(JSON.parse(text) as RejectionJson));
        n++;
      }
      if (n >= max) break;
    }
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
  if (values.config === undefined) return usage('token needs --config FILE (its auth.secret signs the token)');
  if (values.sub === undefined || values.sub === '') return usage('token needs --sub NAME');
  const ttl = parseDuration(values.ttl!);
  if (ttl === null || ttl < 1000) return usage('--ttl must be a duration such as 15m, 1h, 7d');
  const scopes = values.scope!.split(/[ ,]+/).filter(Boolean);
  const unknown = scopes.filter((s) => !(SCOPES as readonly string[]).includes(s));
  if (unknown.length > 0) return usage(`unknown scope ${unknown.join(', ')} (expected ${SCOPES.join(', ')})`);
  const config = readConfig(values.config);
  if (config.auth === undefined) return usage(`${values.config} has no "auth" section`);
  const keys = verificationKeys(config.auth, process.env, 'auth');
  if (keys.secret === null) return usage('auth has no HS256 secret: tokens for public keys come from whoever holds the private key');
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

async function openAuditStore(values: { db?: string; config?: string }): Promise<GatewayStore | null> {
  let store: Config['store'] | null = null;
  if (values.db !== undefined) store = { sqlite: values.db, synchronous: 'FULL' };
  else if (values.config !== undefined) store = readConfig(values.config).store;
  if (store === null) return null;
  if ('d1' in store) throw new ConfigError('store.d1 lives on Cloudflare: use fencegate audit --url against the Worker', []);
  // An export reads pages one after another: two connections are plenty.
  return openStore(store, { poolSize: 2 });
}

/** Writes to stdout, waiting when the pipe is full (`| head`, a slow terminal). */
async function write(text: string): Promise<void> {
  if (text === '') return;
  if (!process.stdout.write(text)) await once(process.stdout, 'drain');
}

function out(text: string, code: number): number {
  process.stdout.write(text);
  return code;
}

function usage(message: string): number {
  process.stderr.write(`fencegate: ${message}\n`);
  return 2;
}
