/** One JSON object per line. Ids, codes, tokens, hashes and durations; never bodies or secrets. */
export interface Logger {
  /** What the background does when it changes nothing (a sweep or reconcile pass with nothing to do): off unless FENCEGATE_LOG_LEVEL=debug. Optional, so a caller's own logger need not have it. */
  debug?(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

export type LogLevel = 'debug' | 'info' | 'warn' | 'error' | 'silent';

const RANK: Record<LogLevel, number> = { debug: -1, info: 0, warn: 1, error: 2, silent: 3 };

/** The levels FENCEGATE_LOG_LEVEL takes, in the order of RANK. */
export const LOG_LEVELS = Object.keys(RANK) as LogLevel[];

/**
 * A level as an operator writes it (`WARN`, ` error `), or null for what is
 * none of LOG_LEVELS: a typo must not start the gateway at another level
 * than the one asked for without a word.
 */
export function parseLogLevel(text: string): LogLevel | null {
  const level = text.trim().toLowerCase();
  return (LOG_LEVELS as string[]).includes(level) ? (level as LogLevel) : null;
}

/**
 * @example
 * const log = createJsonLogger({ level: 'info' }); // writes to stdout
 * log.info('decision', { request_id, decision: 'stale-fence', status: 409 });
 */
export function createJsonLogger(options: { level?: LogLevel; write?: (line: string) => void } = {}): Logger {
  const min = RANK[options.level ?? 'info'];
  const write = options.write ?? stdoutLines();
  const emit = (level: Exclude<LogLevel, 'silent'>) => (msg: string, fields?: Record<string, unknown>) => {
    if (RANK[level] < min) return;
    const t = isoNow();
    let line: string;
    try {
      // The line JSON.stringify({ t, level, msg, ...fields }) gives, without
      // copying the fields into a new object first (one per decision). A field
      // named t, level or msg takes that place in the spread: the plain path.
      const rest = fields === undefined || 't' in fields || 'level' in fields || 'msg' in fields ? null : JSON.stringify(fields);
      if (rest !== null) line = `{"t":"${t}","level":"${level}","msg":${JSON.stringify(msg)}${rest.length > 2 ? `,${rest.slice(1)}` : '}'}`;
      else line = JSON.stringify({ t, level, msg, ...fields });
    } catch {
      const entry = { t, level, msg, ...fields };
      // A bigint (a fence) somewhere in the fields: the slower path.
      line = JSON.stringify(entry, (_k, v) => (typeof v === 'bigint' ? v.toString() : v));
    }
    write(line);
  };
  const logger: Logger = { info: emit('info'), warn: emit('warn'), error: emit('error') };
  // Absent below debug, so that `logger.debug?.(…)` builds no fields on the hot path.
  if (min <= RANK.debug) logger.debug = emit('debug');
  return logger;
}

let lastMs = Number.NaN;
let lastIso = '';
/** `new Date().toISOString()`, made once per millisecond: under load many lines share one. */
function isoNow(): string {
  const ms = Date.now();
  if (ms !== lastMs) {
    lastMs = ms;
    lastIso = new Date(ms).toISOString();
  }
  return lastIso;
}

/**
 * Lines to stdout, one write per event-loop turn instead of one per line:
 * stdout to a pipe or file is a synchronous write(2) on Linux, one per
 * decision under load. Whatever is buffered is written on process exit.
 */
function stdoutLines(): (line: string) => void {
  let buffer = '';
  let scheduled = false;
  const flush = () => {
    scheduled = false;
    if (buffer === '') return;
    const out = buffer;
    buffer = '';
    process.stdout.write(out);
  };
  process.once('exit', flush);
  return (line) => {
    buffer += line + '\n';
    if (!scheduled) {
      scheduled = true;
      setImmediate(flush);
    }
  };
}

export const silentLogger: Logger = { info() {}, warn() {}, error() {} };

/** An error as one log field: its name and message, never a stack. */
export function errorText(err: unknown): string {
  return err instanceof Error ? `${err.name}: ${err.message}` : String(err);
}
