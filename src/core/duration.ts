const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/**
 * `"500ms"`, `"30s"`, `"15m"`, `"24h"`, `"7d"`, or a number of milliseconds.
 * Returns milliseconds, or null when the text is not a duration.
 */
export function parseDuration(value: string | number): number | null {
  if (typeof value === 'number') return Number.isSafeInteger(value) && value >= 0 ? value : null;
  const m = /^(\d{1,12})(ms|s|m|h|d)$/.exec(value.trim());
  if (!m) return null;
  const ms = Number(m[1]) * UNITS[m[2]!]!;
  return Number.isSafeInteger(ms) ? ms : null;
}
