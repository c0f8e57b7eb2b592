import { readFileSync } from 'node:fs';
import { createSecureContext } from 'node:tls';
import { checkKeys, KeyConfigError, verificationKeys } from '../protocol/keys.js';
import { inlineKeyFiles } from './key-files.js';
import { ConfigError } from './load.js';
import type { Config } from './schema.js';
import { credentialHashKeyOf } from '../http/key-scope.js';

/**
 * Everything the Node entry checks before it opens the store or a socket
 * (docs/deploy.md §1): key and TLS files read and inlined, every
 * `{ "env": … }` secret present, every public key importable. A
 * configuration refused here leaves nothing behind (no SQLite file, no
 * pool), and a reload (SIGHUP) runs the same checks before it swaps a
 * configuration in. Throws ConfigError with one line per problem, each
 * naming the field (CONTRIBUTING.md convention 4).
 */
export async function prepareConfig(
  input: Config,
  env: Record<string, string | undefined>,
  read: (path: string) => string = (p) => readFileSync(p, 'utf8'),
): Promise<Config> {
  const problems: string[] = [];
  let config = input;
  try {
    config = inlineKeyFiles(input, read);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    problems.push(...err.issues);
  }
  config = { ...config, routes: config.routes.map((route, i) => inlineTlsFiles(route, i, read, problems)) };
  config.routes.forEach((route, i) => {
    for (const [name, spec] of Object.entries(route.upstreamHeaders)) {
      if (typeof spec === 'string') continue;
      const value = env[spec.env];
      if (value === undefined || value === '') problems.push(`routes[${i}].upstreamHeaders.${name}: environment variable ${spec.env} is not set`);
    }
  });
  try {
    credentialHashKeyOf(config, env);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    problems.push(
      ...err.issues.map(
        (field) =>
          err.message
            .split('\n')
            .find((l) => l.trim().startsWith(`${field}:`))
            ?.trim() ?? field,
      ),
    );
  }
  for (const [field, spec] of [
    ['auth', config.auth],
    ['fence.signed', config.fence.signed],
  ] as const) {
    if (spec === undefined) continue;
    try {
      await checkKeys(verificationKeys(spec, env, field));
    } catch (err) {
      if (!(err instanceof KeyConfigError)) throw err;
      problems.push(err.message);
    }
  }
  if (problems.length > 0) throw new ConfigError(`invalid configuration:\n  ${problems.join('\n  ')}`, problems);
  return config;
}

/** A route's TLS files (`tls.ca`, `tls.cert`, `tls.key` given as paths) replaced by their PEM text. */
function inlineTlsFiles(route: Config['routes'][number], i: number, read: (path: string) => string, problems: string[]): Config['routes'][number] {
  if (route.tls === undefined) return route;
  const tls = { ...route.tls };
  for (const part of ['ca', 'cert', 'key'] as const) {
    const source = tls[part];
    if (typeof source !== 'string') continue;
    try {
      const pem = read(source);
      if (!pem.includes('-----BEGIN ')) throw new Error('not PEM: no "-----BEGIN" line');
      tls[part] = { pem };
    } catch (err) {
      problems.push(`routes[${i}].tls.${part}: cannot read ${source} (${(err as Error).message})`);
    }
  }
  const pem = (part: 'ca' | 'cert' | 'key') => (typeof tls[part] === 'object' ? tls[part].pem : undefined);
  if (!problems.some((p) => p.startsWith(`routes[${i}].tls.`))) {
    // The same check the first connection would make, now: an unparsable PEM or a key that is not the certificate's stops start-up.
    try {
      createSecureContext({ ca: pem('ca'), cert: pem('cert'), key: pem('key') });
    } catch (err) {
      problems.push(`routes[${i}].tls: ${(err as Error).message}`);
    }
  }
  return { ...route, tls };
}
