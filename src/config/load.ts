import { resolveEnvRefs } from './env-refs.js';
import { explainIssues } from './explain.js';
import { ConfigSchema, type Config } from './schema.js';

/** A configuration that does not validate; `message` names every bad field. */
export class ConfigError extends Error {
  override readonly name = 'ConfigError';
  readonly code = 'invalid-config';
  constructor(
    message: string,
    readonly issues: string[],
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

export interface ParseOptions {
  /**
   * Where `{ "env": … }` values are read from. Given (the Node entry passes
   * `process.env`), every such value is resolved here, secrets included, so
   * that a missing variable stops start-up before anything is opened
   * (./env-refs.ts). Left out, URLs resolve from `process.env` where there
   * is one and secrets stay `{ env }` for the gateway to read from its own
   * environment (a Worker's bindings).
   */
  env?: Record<string, string | undefined>;
}

/**
 * Validates a parsed JSON configuration once, at start-up.
 * @throws ConfigError with one line per problem, each naming the field
 *   (e.g. `routes[0].timeoutMs: Too small: expected number to be >=1`,
 *   `routes[0]: unknown key "timeoutMS" (did you mean "timeoutMs"?)`; see ./explain.ts).
 */
export function parseConfig(input: unknown, options: ParseOptions = {}): Config {
  const env = options.env ?? (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env ?? {};
  const refs = resolveEnvRefs(input, env, { deferred: options.env !== undefined });
  const result = ConfigSchema.safeParse(refs.value);
  if (result.success && refs.problems.length === 0) return result.data;
  // A field whose variable is missing holds a stand-in: whatever the schema says of it would say the same thing worse.
  const mine = (path: PropertyKey[]) => refs.missing.some((m) => m.length <= path.length && m.every((p, i) => p === path[i]));
  const schemaIssues = result.success ? [] : result.error.issues.filter((i) => !mine(i.path));
  const issues = [...refs.problems, ...explainIssues(schemaIssues, refs.value, ConfigSchema)];
  throw new ConfigError(`invalid configuration:\n  ${issues.join('\n  ')}`, issues, result.success ? {} : { cause: result.error });
}

/** Parses JSON text, then validates it. */
export function parseConfigText(text: string, source = 'config', options: ParseOptions = {}): Config {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new ConfigError(`${source} is not valid JSON: ${(err as Error).message}`, [], { cause: err });
  }
  return parseConfig(json, options);
}
