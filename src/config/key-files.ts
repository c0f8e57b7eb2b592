import { readFileSync } from 'node:fs';
import { ConfigError } from './load.js';
import type { Config } from './schema.js';

/**
 * Reads the key files a configuration names (`auth.jwksFile`,
 * `auth.publicKeys[].file`, and the same under `fence.signed`) and returns a
 * configuration with their contents inline, so that the gateway itself never
 * touches a file system (it also runs on Workers). Paths are relative to the
 * working directory, like the SQLite path. A missing or malformed file stops
 * start-up with a message naming the field.
 */
export function inlineKeyFiles(config: Config, read: (path: string) => string = (p) => readFileSync(p, 'utf8')): Config {
  const problems: string[] = [];
  const load = (field: string, path: string): string | null => {
    try {
      return read(path);
    } catch (err) {
      problems.push(`${field}: cannot read ${path} (${(err as Error).message})`);
      return null;
    }
  };
  const inline = <T extends NonNullable<Config['auth']> | NonNullable<Config['fence']['signed']>>(spec: T | undefined, field: string): T | undefined => {
    if (spec === undefined) return undefined;
    const out = { ...spec };
    if (spec.jwksFile !== undefined) {
      const text = load(`${field}.jwksFile`, spec.jwksFile);
      if (text !== null) {
        try {
          const jwks = JSON.parse(text) as { keys?: unknown };
          if (!Array.isArray(jwks.keys) || jwks.keys.length === 0) throw new Error('no "keys" array');
          out.jwks = { keys: [...(spec.jwks?.keys ?? []), ...(jwks.keys as Record<string, unknown>[])] };
        } catch (err) {
          problems.push(`${field}.jwksFile: ${spec.jwksFile} is not a JWKS (${(err as Error).message})`);
        }
      }
      delete out.jwksFile;
    }
    if (spec.publicKeys !== undefined) {
      out.publicKeys = spec.publicKeys.map((k, i) => {
        if (k.file === undefined) return k;
        const pem = load(`${field}.publicKeys[${i}].file`, k.file);
        const { file: _file, ...rest } = k;
        return { ...rest, pem: pem ?? '' };
      });
    }
    return out;
  };
  const auth = inline(config.auth, 'auth');
  const signed = inline(config.fence.signed, 'fence.signed');
  if (problems.length > 0) throw new ConfigError(`invalid configuration:\n  ${problems.join('\n  ')}`, problems);
  return { ...config, ...(auth ? { auth } : {}), fence: { ...config.fence, ...(signed ? { signed } : {}) } };
}
