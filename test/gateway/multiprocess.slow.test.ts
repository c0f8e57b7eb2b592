import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { command, paymentsRoute, tempDir } from '../helpers/gateway.js';
import { CLI, GATEWAY_CHILD, killAll as killChildren, startGatewayChild, writeJson, type Proc as Child } from '../helpers/child.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// Two gateway PROCESSES on one SQLite file (DESIGN §8.1):
// every decision is one immediate transaction, so the guarantees hold across
// processes, not just across requests of one process.

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

let n = 0;
/** Two gateways on a fresh shared database: the CLI itself, or the test child with a check switched off. */
async function twoGateways(checksOff?: 'fence' | 'idempotency'): Promise<[Child & { url: string }, Child & { url: string }]> {
  const db = join(tmp.dir, `shared-${++n}.db`);
  const config = writeJson(join(tmp.dir, `config-${n}.json`), {
    listen: { host: '127.0.0.1', port: 0 },
    store: { sqlite: db, synchronous: 'NORMAL' },
    routes: [paymentsRoute(up.url, { serialWaitMs: 60_000 })],
  });
  const args = checksOff === undefined ? [CLI, 'serve', '--config', config] : [GATEWAY_CHILD, config, '--checks-off', checksOff];
  // Started one after the other: the second also finds the migrations applied.
  const a = await startGatewayChild(args);
  const b = await startGatewayChild(args);
  return [a, b];
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

describe('two gateway processes on one SQLite file', () => {
  let pair: [Child & { url: string }, Child & { url: string }];
  beforeAll(async () => {
    pair = await twoGateways();
  });

  it('racing fences 1…200: the upstream sees a non-decreasing sequence, one at a time, and every refused one is in the rejection log', async () => {
    const { fences, answers, seen } = await race(pair, 'tool-job:race');

    for (let i = 1; i < seen.length; i++) expect(seen[i]!, `upstream order ${seen.join(',')}`).toBeGreaterThanOrEqual(seen[i - 1]!);
    expect(up.maxInflight('tool-job:race')).toBe(1);
    expect(seen).toContain(200);

    const refused = fences.filter((_, i) => answers[i]!.status !== 201);
    for (const f of refused) expect(answers[fences.indexOf(f)]!.code, `fence ${f}`).toBe('stale-fence');
    expect(seen.length + refused.length).toBe(200);
    expect(refused.length).toBeGreaterThan(0);

    // Either gateway answers for the shared log: both wrote to it.
    const logged = await staleRejections(pair[1], 'tool-job:race');
    expect(logged).toHaveLength(refused.length);
    expect([...logged].sort((x, y) => x - y)).toEqual([...refused].sort((x, y) => x - y));
    const entity: any = await (await fetch(`${pair[0].url}/_fencegate/v1/entities/tool-job:race`)).json();
    expect(entity.fence).toBe('200');
  });

  it('100 identical requests split across both processes: the upstream is called exactly once', async () => {
    up.behave(() => ({ kind: 'delay', ms: 5 }));
    try {
      const answers = await Promise.all(
        Array.from({ length: 100 }, (_, i) =>
          command(pair[i % 2]!.url, '/payments/charges', { fence: 1, entity: 'tool-job:dup', key: 'dup-key' }).then(answer),
        ),
      );
      expect(up.callsFor('dup-key')).toHaveLength(1);
      const original = answers.filter((a) => a.status === 201 && !a.replayed);
      expect(original).toHaveLength(1);
      for (const a of answers) {
        if (a === original[0]) continue;
        if (a.status === 409) expect(a.code).toBe('idempotency-in-progress');
        else expect(a).toEqual({ ...original[0], replayed: true });
      }
    } finally {
      up.behave(null);
    }
  });
});

describe('negative control: the same race with the fence check switched off in both children', () => {
  it('the upstream sees a stale fence after a newer one, and nothing is refused', async () => {
    const pair = await twoGateways('fence');
    // Fewer fences than above: without the check every one of them waits its
    // turn for the entity, and a shuffled 40 is out of order all the same.
    const { answers, seen } = await race(pair, 'tool-job:unfenced', 40);
    expect(answers.every((a) => a.status === 201)).toBe(true);
    expect(seen).toHaveLength(40);
    const decreases = seen.filter((f, i) => i > 0 && f < seen[i - 1]!).length;
    expect(decreases).toBeGreaterThan(0);
    expect(await staleRejections(pair[0], 'tool-job:unfenced')).toEqual([]);
  });
});
