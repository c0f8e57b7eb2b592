const UNITS: Record<string, number> = { d: 86_400_000, h: 3_600_000, m: 60_000, s: 1000, ms: 1 };
const ORDER = ['d', 'h', 'm', 's', 'ms'];

/**
 * `"500ms"`, `"30s"`, `"15m"`, `"24h"`, `"7d"`, a compound such as
 * `"1h30m"` or `"2m30s"` (each unit at most once, largest first, as people
 * write them), or a number of milliseconds. Returns milliseconds, or null
 * when the text is not a duration.
 */
export function parseDuration(value: string | number): number | null {
  if (typeof value === 'number') return Number.isSafeInteger(value) && value >= 0 ? value : null;
  const text = value.trim();
  if (text === '') return null;
  // One part is digits then a unit; "ms" before "m" so that "500ms" is not 500m + "s".
  const part = /(\d{1,12})(ms|s|m|h|d)/y;
  let ms = 0;
  let last = -1;
  let at = 0;
  while (at < text.length) {
    part.lastIndex = at;
    const m = part.exec(text);
    if (!m) return null;
    const rank = ORDER.indexOf(m[2]!);
    // "30m1h" or "1m1m" is more likely a typo than a sum: refused.
    if (rank <= last) return null;
    last = rank;
    ms += Number(m[1]) * UNITS[m[2]!]!;
    at = part.lastIndex;
  }
  return Number.isSafeInteger(ms) ? ms : null;
}
