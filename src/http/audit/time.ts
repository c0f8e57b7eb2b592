import { parseDuration } from '../../core/duration.js';

/** An audit filter's time: ISO 8601, or a duration back from `now` (`2h`); null when it is neither. */
export function parseTime(v: string, now: number): Date | null {
  const ago = parseDuration(v);
  if (ago !== null) return new Date(now - ago);
  if (!/^\d{4}-\d{2}-\d{2}/.test(v)) return null;
  const d = new Date(v);
  return Number.isNaN(d.getTime()) ? null : d;
}
