import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);

// `npm run demo -- --postgres URL` with a database that does not exist: one
// line saying so (its password masked), exit 1, not a stack trace.
describe('examples/demo-stale-owner.mjs --postgres', () => {
  it('a missing database is one line, exit 1, the password masked', async () => {
    const url = 'postgres://postgres:hunter2@127.0.0.1:5432/fencegate_no_such_database';
    const failed = await run(process.execPath, ['examples/demo-stale-owner.mjs', '--postgres', url], { timeout: 60_000 }).then(
      () => null,
      (err: { code: number; stderr: string }) => err,
    );
    expect(failed, 'the demo must fail').not.toBeNull();
    expect(failed!.code).toBe(1);
    const lines = failed!.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/^demo: cannot connect to PostgreSQL at postgres:\/\/postgres:\*\*\*@127\.0\.0\.1:5432\/fencegate_no_such_database: /);
    expect(failed!.stderr).not.toContain('hunter2');
  });
});
