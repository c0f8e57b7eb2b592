import { readFileSync } from 'node:fs';
import { ConfigError, parseConfigText, type ParseOptions } from './load.js';
import type { Config } from './schema.js';

/**
 * Reads and validates a configuration file (Node only: the Worker reads its
 * configuration from a binding).
 * @throws ConfigError naming the file when it cannot be read, or every bad field.
 */
export function readConfig(path: string, options: ParseOptions = {}): Config {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ConfigError(`cannot read config file ${path}: ${(err as Error).message}`, []);
  }
  return parseConfigText(text, path, options);
}
