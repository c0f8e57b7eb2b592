/**
 * A failed DNS lookup, on workerd and on Node, recorded and classified
 * (docs/deploy-workers.md, the table of upstream failures). The lookup must
 * fail without asking the machine's resolver (which is off loopback), so the
 * probe (dns-probe.mjs) runs in a network namespace with only loopback
 * (`unshare -rn`); where namespaces are not available the test is skipped.
 */
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { classifyFetchError } from '../../src/http/forward-fetch.js';
import { ROOT } from '../helpers/child.js';

const canUnshare = spawnSync('unshare', ['-rn', 'true'], { stdio: 'ignore' }).status === 0;

describe('a DNS failure', () => {
  it.skipIf(!canUnshare)(
    'workerd throws "internal error; reference = …" (unknown); Node fetch gives EAI_AGAIN or ENOTFOUND (refused)',
    () => {
      const probe = join(ROOT, 'test', 'workers', 'dns-probe.mjs');
      const run = spawnSync('unshare', ['-rn', 'sh', '-c', `ip link set lo up 2>/dev/null; exec "${process.execPath}" "${probe}"`], {
        cwd: ROOT,
        encoding: 'utf8',
        timeout: 60_000,
        env: { ...process.env, WRANGLER_SEND_METRICS: 'false', NO_COLOR: '1' },
      });
      const line = run.stdout.split('\n').find((l) => l.startsWith('{"workerd"'));
      expect(line, `${run.stdout}\n${run.stderr}`).toBeDefined();
      const { workerd, node } = JSON.parse(line!);
      console.log(`PROBE dns ${line}`);

      // workerd: the same shape as an untrusted certificate or an answer that is not HTTP.
      expect(workerd).toMatchObject({ outcome: 'threw', ctor: 'Error', name: 'Error', cause: null });
      expect(workerd.props).toEqual({});
      expect(workerd.message).toMatch(/^internal error; reference = \w+$/);
      expect(classifyFetchError(Object.assign(new Error(workerd.message), workerd.props), false)).toMatchObject({ kind: 'unknown' });

      // Node: a lookup error in `cause.code`, which only a connect that never happened raises.
      expect(node).toMatchObject({ outcome: 'threw', ctor: 'TypeError', message: 'fetch failed' });
      expect(['EAI_AGAIN', 'ENOTFOUND']).toContain(node.causeCode);
      const nodeError = new TypeError(node.message, { cause: Object.assign(new Error(node.causeMessage), { code: node.causeCode }) });
      expect(classifyFetchError(nodeError, false)).toEqual({ kind: 'refused', error: node.causeCode });
    },
    90_000,
  );
});
