import { describe, expect, it } from 'vitest';
import { parseDuration } from '../../src/core/duration.js';
import { parseConfig } from '../../src/config/load.js';

describe('durations', () => {
  it('reads one unit, a compound largest first, and milliseconds as a number', () => {
    expect(parseDuration('500ms')).toBe(500);
    expect(parseDuration('30s')).toBe(30_000);
    expect(parseDuration('15m')).toBe(900_000);
    expect(parseDuration('1h30m')).toBe(5_400_000);
    expect(parseDuration('2m30s')).toBe(150_000);
    expect(parseDuration('1s500ms')).toBe(1_500);
    expect(parseDuration('1d2h3m4s5ms')).toBe(86_400_000 + 7_200_000 + 180_000 + 4_000 + 5);
    expect(parseDuration(' 7d ')).toBe(604_800_000);
    expect(parseDuration(250)).toBe(250);
  });

  it('refuses what is not a duration, a unit twice, or units out of order', () => {
    for (const bad of ['', '1', 'h', '1h30', '30m1h', '1m1m', '1h 30m', '1.5h', '-1s', '1hour', '1msx', 'ms']) {
      expect(parseDuration(bad), bad).toBeNull();
    }
    expect(parseDuration(-1)).toBeNull();
    expect(parseDuration(1.5)).toBeNull();
    expect(parseDuration('999999999999d')).toBeNull();
  });

  it('a route takes a compound duration, and the refusal names the form', () => {
    const route = { name: 'p', match: { path: '/p/*' }, upstream: 'http://127.0.0.1:1' };
    const ok = parseConfig({ routes: [{ ...route, retention: '1h30m' }] });
    expect(ok.routes[0]!.retention).toBe(5_400_000);
    expect(() => parseConfig({ routes: [{ ...route, retention: '30m1h' }] })).toThrow(/"1h30m"/);
  });
});
