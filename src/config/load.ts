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

/**
 * Validates a parsed JSON configuration once, at start-up.
 * @throws ConfigError with one line per problem, each naming the field
 *   (e.g. `routes[0].timeoutMs: Too small: expected number to be >=1`,
 *   `routes[0]: unknown key "timeoutMS" (did you mean "timeoutMs"?)`; see ./explain.ts).
 */
export function parseConfig(input: unknown): Config {
  const result = ConfigSchema.safeParse(input);
  if (result.success) return result.data;
  const issues = explainIssues(result.error.issues, input, ConfigSchema);
  throw new ConfigError(`invalid configuration:\n  ${issues.join('\n  ')}`, issues, { cause: result.error });
}

/** Parses JSON text, then validates it. */
export function parseConfigText(text: string, source = 'config'): Config {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new ConfigError(`${source} is not valid JSON: ${(err as Error).message}`, [], { cause: err });
  }
  return parseConfig(json);
}
