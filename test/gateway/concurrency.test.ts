import { afterEach, describe, expect, it } from 'vitest';
import type { GatewayStore } from '../../src/store/types.js';
import { command, paymentsRoute, rejectionRows, startTestGateway, type RouteInput, type TestGateway } from '../helpers/gateway.js';
import { withoutIdempotency } from '../helpers/store-wrappers.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// Concurrency against the real SQLite store, through the real HTTP server.
// (Several gateway processes on one file: multiprocess.slow.test.ts.)

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0)) await c();
});

async function setup(routes: (u: string) => RouteInput[], wrapStore?: (s: GatewayStore) => GatewayStore): Promise<{ up: FakeUpstream; gw: TestGateway }> {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const gw = await startTestGateway({ routes: routes(up.url), wrapStore });
  cleanups.push(() => gw.close());
  return { up, gw };
}

function shuffled<T>(xs: T[]): T[] {
  const a = [...xs];
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [a[i], a[j]] = [a[j]!, a[i]!];
  }
  return a;
}

interface Answer {
  status: number;
  replayed: boolean;
  type: string | null;
  body: string;
}

async function answer(res: Response): Promise<Answer> {
  const body = await res.text();
  const problem = res.headers.get('content-type') === 'application/problem+json';
  return { status: res.status, replayed: res.headers.get('idempotent-replayed') === 'true', type: problem ? JSON.parse(body).type : null, body };
}

/** `n` identical requests at once, against a slowish upstream. */
async function identical(gw: TestGateway, n: number): Promise<Answer[]> {
  return Promise.all(
    Array.from({ length: n }, () => command(gw.url, '/payments/charges', { fence: 1, entity: 'job-1', key: 'same-key', body: '{"amount":999}' }).then(answer)),
  );
}

describe('idempotency under concurrency (G2)', () => {
  it('100 parallel identical requests: the upstream is called exactly once; every other caller gets 409 in-progress or the replay', async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(u)]);
    up.behave(() => ({ kind: 'delay', ms: 5 }));
    const answers = await identical(gw, 100);

    expect(up.effects).toBe(1);
    const original = answers.filter((a) => a.status === 201 && !a.replayed);
    expect(original).toHaveLength(1);
    for (const a of answers) {
      if (a === original[0]) continue;
      if (a.status === 409) expect(a.type).toMatch(/\/idempotency-in-progress$/);
      else expect(a).toEqual({ ...original[0], replayed: true });
    }
  });

  it('negative control: with the key hidden from the store, the same requests make more than one effect', async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(u)], withoutIdempotency);
    up.behave(() => ({ kind: 'delay', ms: 5 }));
    // Fewer than 100: without deduplication each one waits its serial turn.
    const answers = await identical(gw, 30);
    expect(up.effects).toBeGreaterThan(1);
    expect(answers.filter((a) => a.status === 201 && !a.replayed).length).toBeGreaterThan(1);
  });
});

describe('serial mode (G3)', () => {
  it('many entities × many requests in parallel: never two requests for one entity at the upstream at once', async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(u, { serialWaitMs: 60_000 })]);
    up.behave(() => ({ kind: 'delay', ms: 3 }));
    const entities = Array.from({ length: 8 }, (_, i) => `job-${i}`);
    const requests = shuffled(entities.flatMap((e) => Array.from({ length: 12 }, (_, j) => ({ e, key: `${e}:${j}` }))));
    const answers = await Promise.all(requests.map((r) => command(gw.url, '/payments/charges', { fence: 1, entity: r.e, key: r.key }).then(answer)));

    expect(answers.every((a) => a.status === 201)).toBe(true);
    expect(up.effects).toBe(requests.length);
    for (const e of entities) expect(up.maxInflight(e), e).toBe(1);
    // The test could have seen overlap: different entities did run side by side.
    expect(up.maxInflightTotal).toBeGreaterThan(1);
  });

  it('racing fences 1…60 shuffled for one entity: the upstream sees them in non-decreasing order; every refusal is logged', async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(u, { serialWaitMs: 60_000 })]);
    const fences = shuffled(Array.from({ length: 60 }, (_, i) => i + 1));
    const answers = await Promise.all(fences.map((f) => command(gw.url, '/payments/charges', { fence: f, entity: 'job-x', key: `f-${f}` }).then(answer)));

    const seen = up.calls.map((c) => Number(c.fence));
    for (let i = 1; i < seen.length; i++) expect(seen[i]!).toBeGreaterThanOrEqual(seen[i - 1]!);
    expect(up.maxInflight('job-x')).toBe(1);
    const stale = fences.filter((_, i) => answers[i]!.status === 409);
    expect(answers.every((a) => a.status === 201 || (a.status === 409 && /\/stale-fence$/.test(a.type ?? '')))).toBe(true);
    expect(seen.length + stale.length).toBe(60);
    expect(seen).toContain(60);
    const logged = rejectionRows(gw.sqlite, 'stale-fence').map((r) => Number(r.presented_fence));
    expect(logged.sort((a, b) => a - b)).toEqual([...stale].sort((a, b) => a - b));
  });

  it('mode "concurrent" does let requests for one entity overlap', async () => {
    const { up, gw } = await setup((u) => [paymentsRoute(u, { mode: 'concurrent' })]);
    // Hold every request until three for the entity are in flight together
    // (or give up after a while, and let the assertion below fail).
    up.behave(() => ({ kind: 'hold', gate: up.waitFor(() => up.maxInflight('job-c') >= 3, 'overlap', 5_000).catch(() => {}) }));
    const answers = await Promise.all(
      Array.from({ length: 6 }, (_, j) => command(gw.url, '/payments/charges', { fence: 1, entity: 'job-c', key: `c-${j}` }).then(answer)),
    );
    expect(answers.every((a) => a.status === 201)).toBe(true);
    expect(up.maxInflight('job-c')).toBeGreaterThanOrEqual(3);
  });
});
