import { z } from 'zod';

/** `{ "env": "NAME", "prefix"?: "Bearer " }`: a value read from an environment variable once, at start-up. */
export const EnvRefSchema = z.strictObject({
  env: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be an environment variable name'),
  prefix: z.string().optional(),
});
export type EnvRef = z.output<typeof EnvRefSchema>;

/**
 * The fields a `{ "env": … }` may stand in for: every URL and every secret
 * of the configuration. `*` is any array index or record key. `deferred`
 * fields had `{ env }` before this resolver existed and the gateway still
 * accepts it unresolved (the Worker entry resolves them from its bindings,
 * ../http/gateway.ts); they are resolved here only when the caller passes
 * the environment explicitly (the Node entry does, so that a missing one
 * stops start-up before the store is opened).
 */
export const ENV_FIELDS: readonly { path: readonly string[]; deferred?: true; as?: 'pem' }[] = [
  { path: ['routes', '*', 'upstream'] },
  { path: ['routes', '*', 'tls', 'ca'], as: 'pem' },
  { path: ['routes', '*', 'tls', 'cert'], as: 'pem' },
  { path: ['routes', '*', 'tls', 'key'], as: 'pem' },
  { path: ['store', 'postgres'] },
  { path: ['store', 'listenUrl'] },
  { path: ['routes', '*', 'upstreamHeaders', '*'], deferred: true },
  { path: ['credentialHashKey'], deferred: true },
  { path: ['auth', 'secret'], deferred: true },
  { path: ['fence', 'signed', 'secret'], deferred: true },
];

/**
 * What a field whose variable is missing holds while the rest is validated:
 * a value its schema accepts, so that the one line about the variable is not
 * followed by the schema's complaint about the stand-in (a union such as
 * `store` would blame the whole object). Never seen outside: the
 * configuration is refused.
 */
const PLACEHOLDER = { url: 'http://unset.invalid', pem: { pem: '-----BEGIN UNSET-----' }, secret: 'x'.repeat(64) };

export interface EnvResolution {
  /** The input with every resolvable `{ env }` replaced (a copy; the input is not changed). */
  value: unknown;
  /** One line per variable that is not set, naming the field (`routes[0].upstream: environment variable X is not set`). */
  problems: string[];
  /** The paths of those fields (holding a placeholder), so that the schema's own complaint about them is not repeated. */
  missing: (string | number)[][];
}

const isEnvRef = (v: unknown): v is EnvRef => EnvRefSchema.safeParse(v).success;

/** `routes[0].upstream`, as ./explain.ts names fields. */
export function fieldName(path: readonly (string | number)[]): string {
  return path.reduce<string>((s, p) => (typeof p === 'number' ? `${s}[${p}]` : s === '' ? p : `${s}.${p}`), '');
}

/**
 * Replaces `{ env }` in the fields of ENV_FIELDS by the variable's value
 * (with its prefix). A TLS field's value becomes `{ pem }` (PEM text, where a
 * bare string is a file path). An empty variable counts as missing: an empty
 * URL or secret is never what was meant.
 */
export function resolveEnvRefs(input: unknown, env: Record<string, string | undefined>, options: { deferred: boolean }): EnvResolution {
  const problems: string[] = [];
  const missing: (string | number)[][] = [];
  const value = structuredClone(input);
  for (const field of ENV_FIELDS) {
    if (field.deferred && !options.deferred) continue;
    visit(value, field.path, [], (holder, key, at) => {
      const ref = holder[key];
      if (!isEnvRef(ref)) return;
      const text = env[ref.env];
      if (text === undefined || text === '') {
        problems.push(`${fieldName(at)}: environment variable ${ref.env} is not set`);
        missing.push(at);
        holder[key] = field.as === 'pem' ? PLACEHOLDER.pem : field.deferred ? PLACEHOLDER.secret : PLACEHOLDER.url;
        return;
      }
      const resolved = (ref.prefix ?? '') + text;
      holder[key] = field.as === 'pem' ? { pem: resolved } : resolved;
    });
  }
  return { value, problems, missing };
}

type Holder = Record<string | number, unknown>;

function visit(
  node: unknown,
  rest: readonly string[],
  at: (string | number)[],
  fn: (holder: Holder, key: string | number, at: (string | number)[]) => void,
): void {
  if (typeof node !== 'object' || node === null || rest.length === 0) return;
  const [head, ...tail] = rest as [string, ...string[]];
  const keys: (string | number)[] = head !== '*' ? [head] : Array.isArray(node) ? node.map((_, i) => i) : Object.keys(node);
  for (const key of keys) {
    if (!Object.hasOwn(node, key)) continue;
    const path = [...at, key];
    if (tail.length === 0) fn(node as Holder, key, path);
    else visit((node as Holder)[key], tail, path, fn);
  }
}
