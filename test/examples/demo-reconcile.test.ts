import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT } from '../helpers/child.js';

// `npm run demo:reconcile` (examples/demo-reconcile.mjs) against the built
// package (dist/, so after `npm run build`): the worker's call times out, the
// provider did charge, the retry gets the charge back, no operator.
describe('examples/demo-reconcile.mjs', () => {
  it("reconciles the lost answer: the retry gets the charge, one charge, the only action is the reconciler's", () => {
    const r = spawnSync(process.execPath, [join(ROOT, 'examples', 'demo-reconcile.mjs')], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 });
    expect(r.status, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toContain('the retry got the charge back: 200');
    expect(r.stdout).toContain('the provider charged once (1 charge)');
    expect(r.stdout).toContain('resolve-completed by "reconciler"');
    expect(r.stdout).not.toContain('✘');
  }, 90_000);
});
