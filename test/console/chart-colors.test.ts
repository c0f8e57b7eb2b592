import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Script } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { CONSOLE_DIR } from '../../scripts/bundle-console.mjs';
import { REJECTION_REASONS } from '../../src/entry/cli-reasons.js';
import { CONSOLE_PAGES, CONSOLE_REASONS } from '../../src/http/console/page.js';

// Every reason the rejection log can hold (RejectionReason, listed
// exhaustively by the CLI's Record) has its own colour in the console's
// chart, far enough from every other to tell apart in the legend, and its
// option in the reason filter.

/** chart.js run as the page runs it, with the namespace it registers on. */
function loadChart(source = readFileSync(join(CONSOLE_DIR, 'chart.js'), 'utf8')): { colorOf: (r: string) => string; OTHER: string } {
  const window: any = {};
  new Script(source).runInNewContext({ window });
  return window.fencegateConsole.chart;
}

const rgb = (hex: string) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
const distance = (a: string, b: string) => Math.hypot(...rgb(a).map((v, i) => v - rgb(b)[i]!));

/** The pairs of reasons whose colours are closer than `min` (RGB distance; 0 for the same colour). */
function tooClose(colorOf: (r: string) => string, reasons: readonly string[], min: number): string[] {
  const close: string[] = [];
  for (let i = 0; i < reasons.length; i++) {
    for (let j = i + 1; j < reasons.length; j++) {
      const d = distance(colorOf(reasons[i]!), colorOf(reasons[j]!));
      if (d < min) close.push(`${reasons[i]} ${colorOf(reasons[i]!)} ~ ${reasons[j]} ${colorOf(reasons[j]!)} (${d.toFixed(0)})`);
    }
  }
  return close;
}

describe('the chart colours of the rejection reasons', () => {
  it('the console knows every reason of RejectionReason', () => {
    expect([...CONSOLE_REASONS].sort()).toEqual([...REJECTION_REASONS].sort());
    for (const reason of REJECTION_REASONS) expect(CONSOLE_PAGES.open).toContain(`<option>${reason}</option>`);
  });

  it('every reason has its own colour, none the grey of an unknown reason, each pair at least 60 apart in RGB', () => {
    const chart = loadChart();
    const colors = REJECTION_REASONS.map((r) => chart.colorOf(r));
    for (const c of colors) expect(c).toMatch(/^#[0-9a-f]{6}$/);
    expect(new Set(colors).size).toBe(REJECTION_REASONS.length);
    expect(colors).not.toContain(chart.OTHER);
    expect(tooClose(chart.colorOf, [...REJECTION_REASONS, '(unknown)'], 60)).toEqual([]);
    // An inherited name is not a reason.
    expect(chart.colorOf('constructor')).toBe(chart.OTHER);
  });

  it('negative control: the table as it was (the 400s missing) gives four and more reasons one grey', () => {
    const source = readFileSync(join(CONSOLE_DIR, 'chart.js'), 'utf8');
    // The six 400s' entries, from invalid-fence to missing-idempotency-key, removed.
    const old = source.replace(/\n {4}'invalid-fence': [\s\S]*?'missing-idempotency-key': '#[0-9a-f]{6}',?\n/, '\n');
    expect(old).not.toBe(source);
    const chart = loadChart(old);
    const grey = REJECTION_REASONS.filter((r) => chart.colorOf(r) === chart.OTHER);
    expect(grey.length).toBeGreaterThanOrEqual(4);
    expect(tooClose(chart.colorOf, REJECTION_REASONS, 60).length).toBeGreaterThan(0);
  });
});
