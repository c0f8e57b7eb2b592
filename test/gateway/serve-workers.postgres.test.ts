import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CLI, killAll, ROOT, spawnNode, writeJson, type Proc } from '../helpers/child.js';
import { command, paymentsRoute, tempDir } from '../helpers/gateway.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { answerOf, decreasingPairs, shuffled } from '../replicas/support.js';

// `fencegate serve --workers 2 --database-url …`: two workers behind one
// socket on one PostgreSQL schema (DESIGN §8.2 inside one group,
// src/entry/cluster.ts). G1–G3 across the workers, the group's /metrics
// adding up, and the negative control: the same race through a group whose
// workers drop the fence (test/helpers/pg-gateway-child.mjs).

const CLUSTER_CHILD = join(ROOT, 'test', 'helpers', 'cluster-child.mjs');
type Group = Proc & { url: string };

async function group(args: string[]): Promise<Group> {
  const g = spawnNode(args);
  const first = await g.next((l) => l.msg === 'listening');
  await g.next((l) => l.msg === 'listening');
  return Object.assign(g, { url: first.url as string });
}

describe.skipIf(!POSTGRES_URL)('serve --workers 2 on one PostgreSQL schema', () => {
  const tmp = tempDir('fencegate-pg-workers-');
  const run = randomUUID().slice(0, 8);
  let schema: TestSchema;
  let up: FakeUpstream;
  let g: Group;
  let config: string;

  beforeAll(async () => {
    schema = await createTestSchema('fg_workers', 2);
    up = await startUpstream();
    config = writeJson(join(tmp.dir, 'config.json'), {
      listen: { host: '127.0.0.1', port: 0 },
      store: { postgres: schema.url, poolSize: 4 },
      routes: [paymentsRoute(up.url, { serialWaitMs: 60_000 })],
    });
    g = await group([CLI, 'serve', '--config', config, '--workers', '2']);
  }, 90_000);

  afterAll(async () => {
    await killAll();
    await up?.close();
    await schema?.drop();
    tmp.cleanup();
  }, 30_000);

  const decidedBy = () => new Set(g.lines.filter((l) => l.msg === 'decision').map((l) => l.worker));

  it('racing fences 1…120 over both workers: non-decreasing upstream order, one at a time (G1, G3); every refusal is stale-fence', async () => {
    const entity = `tool-job:race-${run}`;
    const fences = shuffled(Array.from({ length: 120 }, (_, i) => i + 1));
    const answers = await Promise.all(fences.map((f) => command(g.url, '/payments/charges', { fence: f, entity, key: `${entity}:${f}` }).then(answerOf)));
    const seen = up.calls.filter((c) => c.entity === entity).map((c) => Number(c.fence));
    expect(decreasingPairs(seen)).toEqual([]);
    expect(up.maxInflight(entity)).toBe(1);
    expect(seen).toContain(120);
    for (const [i, a] of answers.entries()) if (a.status !== 201) expect(a.code, `fence ${fences[i]}`).toBe('stale-fence');
    expect(seen.length + answers.filter((a) => a.status !== 201).length).toBe(120);
    expect([...decidedBy()].sort()).toEqual([0, 1]);
  });

  it('100 identical requests over both workers: one upstream call (G2); /metrics on either worker counts all 100', async () => {
    const key = `dup-${run}`;
    up.behave((c) => (c.key === key ? { kind: 'delay', ms: 20 } : undefined));
    try {
      const before = await (await fetch(`${g.url}/_fencegate/metrics`)).text();
      const answers = await Promise.all(
        Array.from({ length: 100 }, () => command(g.url, '/payments/charges', { fence: 1, entity: `tool-job:dup-${run}`, key }).then(answerOf)),
      );
      expect(up.callsFor(key)).toHaveLength(1);
      expect(answers.filter((a) => a.status === 201 && !a.replayed)).toHaveLength(1);
      const total = (t: string) =>
        t
          .split('\n')
          .filter((l) => l.startsWith('fencegate_requests_total{route="payments"'))
          .reduce((s, l) => s + Number(l.split(' ').pop()), 0);
      for (let i = 0; i < 4; i++) {
        const t = await (await fetch(`${g.url}/_fencegate/metrics`, { headers: { connection: 'close' } })).text();
        expect(total(t) - total(before)).toBe(100);
        // Each worker's pool is summed: two pools of up to 4.
        expect(t).toMatch(/^fencegate_workers\{state="answered"\} 2$/m);
      }
    } finally {
      up.behave(null);
    }
  });

  it('negative control: the same race through a group whose workers drop the fence reaches the upstream out of order', async () => {
    const control = await group([CLUSTER_CHILD, '2', 'pg-gateway-child.mjs', config, schema.url, '--checks-off', 'fence']);
    const entity = `tool-job:unfenced-${run}`;
    const fences = shuffled(Array.from({ length: 40 }, (_, i) => i + 1));
    const answers = await Promise.all(fences.map((f) => command(control.url, '/payments/charges', { fence: f, entity, key: `${entity}:${f}` }).then(answerOf)));
    expect(answers.every((a) => a.status === 201)).toBe(true);
    const seen = up.calls.filter((c) => c.entity === entity).map((c) => Number(c.fence));
    expect(decreasingPairs(seen).length).toBeGreaterThan(0);
    await control.kill();
  });
});
