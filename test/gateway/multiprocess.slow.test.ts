import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { command, paymentsRoute, tempDir } from '../helpers/gateway.js';
import { CLI, GATEWAY_CHILD, killAll as killChildren, ROOT, spawnNode, startGatewayChild, writeJson, type Proc as Child } from '../helpers/child.js';

const CLUSTER_CHILD = join(ROOT, 'test', 'helpers', 'cluster-child.mjs');
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// Two gateway PROCESSES on one SQLite file (DESIGN §8.1):
// every decision is one immediate transaction, so the guarantees hold across
// processes, not just across requests of one process. Two shapes: two
// `fencegate serve` processes on two ports, and one `fencegate serve
// --workers 2` (two workers behind one socket, src/entry/cluster.ts), whose
// requests are spread over both workers by the connections they come on.

let up: FakeUpstream;
const tmp = tempDir();

beforeAll(async () => {
  up = await startUpstream();
});

afterAll(async () => {
  await killChildren();
  await up?.close();
  tmp.cleanup();
});

type Shape = 'two processes' | 'serve --workers 2';
const SHAPES: Shape[] = ['two processes', 'serve --workers 2'];

let n = 0;
/**
 * Two gateways on a fresh shared database: the CLI itself, or the test child
 * with a check switched off; as two processes, or as one group of two
 * workers (then both entries are the group's one URL).
 */
async function twoGateways(shape: Shape, checksOff?: 'fence' | 'idempotency'): Promise<[Child & { url: string }, Child & { url: string }]> {
  const db = join(tmp.dir, `shared-${++n}.db`);
  const config = writeJson(join(tmp.dir, `config-${n}.json`), {
    listen: { host: '127.0.0.1', port: 0 },
    store: { sqlite: db, synchronous: 'NORMAL' },
    routes: [paymentsRoute(up.url, { serialWaitMs: 60_000 })],
  });
  if (shape === 'serve --workers 2') {
    const args =
      checksOff === undefined
        ? [CLI, 'serve', '--config', config, '--workers', '2']
        : [CLUSTER_CHILD, '2', 'gateway-child.mjs', config, '--checks-off', checksOff];
    const group = spawnNode(args);
    // Both workers listening (on the one socket the primary holds).
    const first = await group.next((l) => l.msg === 'listening');
    await group.next((l) => l.msg === 'listening');
    const g = Object.assign(group, { url: first.url as string });
    return [g, g];
  }
  const args = checksOff === undefined ? [CLI, 'serve', '--config', config] : [GATEWAY_CHILD, config, '--checks-off', checksOff];
  // Started one after the other: the second also finds the migrations applied.
  const a = await startGatewayChild(args);
  const b = await startGatewayChild(args);
  return [a, b];
}

/** In a group: how many decisions each worker logged (both must have decided some for the test to say anything). */
function decisionsByWorker(g: Child): Map<number, number> {
  const by = new Map<number, number>();
  for (const l of g.lines) if (l.msg === 'decision' && typeof l.worker === 'number') by.set(l.worker, (by.get(l.worker) ?? 0) + 1);
  return by;
}

function shuffled<T>(xs: T[]): T[] {
  const a = [...xs];
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [a[i], a[j]] = [a[j]!, a[i]!];
  }
  return a;
}

async function answer(res: Response): Promise<{ status: number; code: string | null; replayed: boolean; body: string }> {
  const body = await res.text();
  const code = res.headers.get('content-type') === 'application/problem+json' ? String(JSON.parse(body).type).split('/').pop()! : null;
  return { status: res.status, code, replayed: res.headers.get('idempotent-replayed') === 'true', body };
}

/** Fences 1…count, shuffled, all at once, alternating between the two gateways. */
async function race(gateways: Child[] & { url: string }[], entity: string, count = 200) {
  const fences = shuffled(Array.from({ length: count }, (_, i) => i + 1));
  const answers = await Promise.all(
    fences.map((f, i) => command(gateways[i % 2]!.url, '/payments/charges', { fence: f, entity, key: `${entity}:${f}` }).then(answer)),
  );
  const seen = up.calls.filter((c) => c.entity === entity).map((c) => Number(c.fence));
  return { fences, answers, seen };
}

/** Every stale-fence rejection for `entity`, read through the admin API with keyset pagination. */
async function staleRejections(gateway: { url: string }, entity: string): Promise<number[]> {
  const out: number[] = [];
  let cursor: string | null = null;
  do {
    const q: string = `entity=${encodeURIComponent(entity)}&reason=stale-fence&limit=50${cursor ? `&cursor=${cursor}` : ''}`;
    const page: any = await (await fetch(`${gateway.url}/_fencegate/v1/rejections?${q}`)).json();
    out.push(...page.items.map((r: any) => Number(r.presented_fence)));
    cursor = page.next_cursor;
  } while (cursor !== null);
  return out;
}

describe.each(SHAPES)('%s on one SQLite file', (shape) => {
  // One upstream for every shape: each shape's entities and keys are its own.
  const tag = shape === 'two processes' ? 'p' : 'w';
  let pair: [Child & { url: string }, Child & { url: string }];
  beforeAll(async () => {
    pair = await twoGateways(shape);
  });
  afterAll(async () => {
    await Promise.all(pair.map((g) => g.kill()));
  });

  it('racing fences 1…200: the upstream sees a non-decreasing sequence, one at a time, and every refused one is in the rejection log', async () => {
    const { fences, answers, seen } = await race(pair, `tool-job:race-${tag}`);

    for (let i = 1; i < seen.length; i++) expect(seen[i]!, `upstream order ${seen.join(',')}`).toBeGreaterThanOrEqual(seen[i - 1]!);
    expect(up.maxInflight(`tool-job:race-${tag}`)).toBe(1);
    expect(seen).toContain(200);

    const refused = fences.filter((_, i) => answers[i]!.status !== 201);
    for (const f of refused) expect(answers[fences.indexOf(f)]!.code, `fence ${f}`).toBe('stale-fence');
    expect(seen.length + refused.length).toBe(200);
    expect(refused.length).toBeGreaterThan(0);

    // Either gateway answers for the shared log: both wrote to it.
    const logged = await staleRejections(pair[1], `tool-job:race-${tag}`);
    expect(logged).toHaveLength(refused.length);
    expect([...logged].sort((x, y) => x - y)).toEqual([...refused].sort((x, y) => x - y));
    const entity: any = await (await fetch(`${pair[0].url}/_fencegate/v1/entities/tool-job:race-${tag}`)).json();
    expect(entity.fence).toBe('200');
    if (shape === 'serve --workers 2') expect([...decisionsByWorker(pair[0]).keys()].sort()).toEqual([0, 1]);
  });

  it('100 identical requests split across both processes: the upstream is called exactly once', async () => {
    up.behave(() => ({ kind: 'delay', ms: 5 }));
    try {
      const answers = await Promise.all(
        Array.from({ length: 100 }, (_, i) =>
          command(pair[i % 2]!.url, '/payments/charges', { fence: 1, entity: `tool-job:dup-${tag}`, key: `dup-key-${tag}` }).then(answer),
        ),
      );
      expect(up.callsFor(`dup-key-${tag}`)).toHaveLength(1);
      const original = answers.filter((a) => a.status === 201 && !a.replayed);
      expect(original).toHaveLength(1);
      for (const a of answers) {
        if (a === original[0]) continue;
        if (a.status === 409) expect(a.code).toBe('idempotency-in-progress');
        else expect(a).toEqual({ ...original[0], replayed: true });
      }
      if (shape === 'serve --workers 2') expect([...decisionsByWorker(pair[0]).keys()].sort()).toEqual([0, 1]);
    } finally {
      up.behave(null);
    }
  });
});

describe.each(SHAPES)('negative control (%s): the same race with the fence check switched off in both', (shape) => {
  it('the upstream sees a stale fence after a newer one, and nothing is refused', async () => {
    const pair = await twoGateways(shape, 'fence');
    // Fewer fences than above: without the check every one of them waits its
    // turn for the entity, and a shuffled 40 is out of order all the same.
    const { answers, seen } = await race(pair, `tool-job:unfenced-${n}`, 40);
    expect(answers.every((a) => a.status === 201)).toBe(true);
    expect(seen).toHaveLength(40);
    const decreases = seen.filter((f, i) => i > 0 && f < seen[i - 1]!).length;
    expect(decreases).toBeGreaterThan(0);
    expect(await staleRejections(pair[0], `tool-job:unfenced-${n}`)).toEqual([]);
    await Promise.all(pair.map((g) => g.kill()));
  });
});
