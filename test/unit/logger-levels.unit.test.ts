import { describe, expect, it } from 'vitest';
import { createJsonLogger, LOG_LEVELS, parseLogLevel } from '../../src/http/logger.js';

describe('log levels', () => {
  const lines = (level: (typeof LOG_LEVELS)[number]) => {
    const out: string[] = [];
    const log = createJsonLogger({ level, write: (l) => out.push(l) });
    log.debug?.('sweep', { records: 0 });
    log.info('decision', { status: 201 });
    log.warn('sweep-behind', {});
    log.error('store-unavailable', {});
    return out.map((l) => JSON.parse(l) as { level: string; msg: string });
  };

  it('debug writes every level, debug lines included', () => {
    expect(lines('debug').map((l) => l.level)).toEqual(['debug', 'info', 'warn', 'error']);
    expect(lines('debug')[0]).toMatchObject({ msg: 'sweep', records: 0 });
  });

  it('info (the default) has no debug method at all, so callers build no fields for it', () => {
    expect(lines('info').map((l) => l.level)).toEqual(['info', 'warn', 'error']);
    expect(createJsonLogger({ level: 'info', write: () => {} }).debug).toBeUndefined();
    expect(lines('warn').map((l) => l.level)).toEqual(['warn', 'error']);
    expect(lines('silent')).toEqual([]);
  });

  it('parses debug in any case, and nothing else new', () => {
    expect(LOG_LEVELS).toEqual(['debug', 'info', 'warn', 'error', 'silent']);
    expect(parseLogLevel(' Debug ')).toBe('debug');
    expect(parseLogLevel('trace')).toBeNull();
  });
});
