/** One JSON object per line. Ids, codes, tokens, hashes and durations; never bodies or secrets. */
export interface Logger {
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

export type LogLevel = 'info' | 'warn' | 'error' | 'silent';

const RANK: Record<LogLevel, number> = { info: 0, warn: 1, error: 2, silent: 3 };

/**
 * @example
 * const log = createJsonLogger({ level: 'info' }); // writes to stdout
 * log.info('decision', { request_id, decision: 'stale-fence', status: 409 });
 */
export function createJsonLogger(options: { level?: LogLevel; write?: (line: string) => void } = {}): Logger {
  const min = RANK[options.level ?? 'info'];
  const write = options.write ?? ((line: string) => process.stdout.write(line + '\n'));
  const emit = (level: Exclude<LogLevel, 'silent'>) => (msg: string, fields?: Record<string, unknown>) => {
    if (RANK[level] < min) return;
    write(JSON.stringify({ t: new Date().toISOString(), level, msg, ...fields }, (_k, v) => (typeof v === 'bigint' ? v.toString() : v)));
  };
  return { info: emit('info'), warn: emit('warn'), error: emit('error') };
}

export const silentLogger: Logger = { info() {}, warn() {}, error() {} };
