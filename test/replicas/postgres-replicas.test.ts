import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CLI, killAll as killChildren, ROOT, startGatewayChild, writeJson, type Proc as Child } from '../helpers/child.js';
import { command, paymentsRoute, tempDir, until } from '../helpers/gateway.js';
import { createTestSchema, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { answerOf, decreasingPairs, shuffled, transportFailure, type Answer } from './support.js';

// DESIGN §8.2 with real processes: three gateway PROCESSES (the real CLI,
// `fencegate serve --database-url`) on one PostgreSQL schema, a client
// spraying them round-robin. Every decision is one transaction in the
// database, so G1–G4 hold across replicas, not only across requests of one
// process. The negative control runs the same fence race through a child
// whose store wrapper drops the fence (test/helpers/pg-gateway-child.mjs).

const PG_CHILD = join(ROOT, 'test', 'helpers', 'pg-gateway-child.mjs');
type Replica = Child & { url: string };

describe.skipIf(!POSTGRES_URL)('three gateway processes on one PostgreSQL schema', () => {
  const tmp = tempDir('fencegate-replicas-');
  const run = randomUUID().slice(0, 8);
  let schema: TestSchema;
  let up: FakeUpstream;
  let replicas: Replica[] = [];
  let control: Replica;
  /** Round-robin: request i goes to replica i mod 3 (of those still alive). */
  const at = (i: number) => replicas[i % replicas.length]!.url;
  const sql = async <R = any>(text: string, values: unknown[] = []) => (await schema.pool.query(text, values)).rows as R[];
  const fenceOf = async (entity: string) =>
    (await sql<{ fence: string | null }>('SELECT fence::text AS fence FROM fence_entities WHERE entity = $1', [entity]))[0]?.fence ?? null;

  beforeAll(async () => {
    schema = await createTestSchema('fg_replicas', 4);
    up = await startUpstream();
    const config = writeJson(join(tmp.dir, 'config.json'), {
      listen: { host: '127.0.0.1', port: 0 },
      store: { postgres: schema.url, poolSize: 6 },
      // Survivors sweep dead in-progress records quickly (the kill test).
      sweepInterval: '1s',
      routes: [
        // Long serial waits: in the fence race every request queues for its entity.
        paymentsRoute(up.url, { serialWaitMs: 60_000 }),
        // The same entities without waiting: a held slot answers 409 entity-busy at once.
        paymentsRoute(up.url, { name: 'nowait', match: { path: '/nowait/*', methods: ['POST'] }, serialWaitMs: 0 }),
        // Short upstream timeout and lock margin, so a dead replica's lock expires within the test.
        paymentsRoute(up.url, { name: 'crash', match: { path: '/crash/*', methods: ['POST'] }, timeoutMs: 3_000, lockMarginMs: 500 }),
      ],
    });
    // All four at once: the migrations run concurrently on the fresh schema (advisory lock).
    const started = await Promise.allSettled([
      ...[0, 1, 2].map(() => startGatewayChild([CLI, 'serve', '--config', config, '--database-url', schema.url])),
      startGatewayChild([PG_CHILD, config, schema.url, '--checks-off', 'fence']),
    ]);
    const failed = started.find((s) => s.status === 'rejected');
    if (failed) throw (failed as PromiseRejectedResult).reason;
    const ok = started.map((s) => (s as PromiseFulfilledResult<Replica>).value);
    replicas = ok.slice(0, 3);
    control = ok[3]!;
    for (const r of replicas) expect(r.lines.find((l) => l.msg === 'listening')).toMatchObject({ store: 'postgres' });
  }, 90_000);

  afterAll(async () => {
    await killChildren();
    await up?.close();
    await schema?.drop();
    tmp.cleanup();
  }, 30_000);

  it('100 parallel identical requests over 3 replicas: exactly one upstream call; every other caller gets 409 in-progress or the replay', async () => {
    const key = `dup-${run}`;
    const entity = `tool-job:dup-${run}`;
    // A slow answer keeps the record in progress while the others arrive.
    up.behave((c) => (c.key === key ? { kind: 'delay', ms: 50 } : undefined));
    try {
      const answers = await Promise.all(Array.from({ length: 100 }, (_, i) => command(at(i), '/payments/charges', { fence: 1, entity, key }).then(answerOf)));
      expect(up.callsFor(key)).toHaveLength(1);
      const original = answers.filter((a) => a.status === 201 && !a.replayed);
      expect(original).toHaveLength(1);
      const counts = { inProgress: 0, replayed: 0 };
      for (const a of answers) {
        if (a === original[0]) continue;
        if (a.status === 409) {
          expect(a.code).toBe('idempotency-in-progress');
          counts.inProgress++;
        } else {
          // Byte-identical replay, whichever replica answered it.
          expect(a).toEqual({ ...original[0], replayed: true });
          counts.replayed++;
        }
      }
      expect(counts.inProgress + counts.replayed).toBe(99);
      console.info(
        `[fencegate] 100 identical requests over 3 replicas: 1 forwarded, ${counts.inProgress} idempotency-in-progress, ${counts.replayed} replayed`,
      );
      // Afterwards every replica replays the stored answer, byte for byte.
      for (const r of replicas)
        expect(await command(r.url, '/payments/charges', { fence: 1, entity, key }).then(answerOf)).toEqual({ ...original[0], replayed: true });
      expect(up.callsFor(key)).toHaveLength(1);
      const rows = await sql('SELECT state, status FROM idempotency_records WHERE key = $1', [key]);
      expect(rows).toEqual([{ state: 'completed', status: 201 }]);
    } finally {
      up.behave(null);
    }
  });

  it('fences 1…500 shuffled over 20 entities: per entity the upstream sees non-decreasing fences, one at a time, and every refusal is a stale-fence row', async () => {
    const fences = shuffled(Array.from({ length: 500 }, (_, i) => i + 1));
    const entityAt = (i: number) => `race-${run}-${i % 20}`;
    // A few milliseconds upstream widen any window in which two could overlap.
    up.behave((c) => (c.entity?.startsWith(`race-${run}-`) ? { kind: 'delay', ms: 3 } : undefined));
    let answers: Answer[];
    try {
      answers = await Promise.all(
        fences.map((f, i) => command(at(i), '/payments/charges', { fence: f, entity: entityAt(i), key: `race-${run}-${f}` }).then(answerOf)),
      );
    } finally {
      up.behave(null);
    }

    const refused: { entity: string; fence: number }[] = [];
    fences.forEach((f, i) => {
      const a = answers[i]!;
      if (a.status === 201) return;
      expect(a.code, `fence ${f}: ${a.body}`).toBe('stale-fence');
      refused.push({ entity: entityAt(i), fence: f });
    });
    let forwarded = 0;
    for (let e = 0; e < 20; e++) {
      const entity = `race-${run}-${e}`;
      const seen = up.calls.filter((c) => c.entity === entity).map((c) => Number(c.fence));
      forwarded += seen.length;
      expect(decreasingPairs(seen), `upstream order for ${entity}: ${seen.join(',')}`).toEqual([]);
      expect(up.maxInflight(entity), entity).toBe(1);
      // The highest fence of an entity can never be stale: it always goes through.
      const highest = Math.max(...fences.filter((_, i) => entityAt(i) === entity));
      expect(seen).toContain(highest);
      expect(await fenceOf(entity)).toBe(String(highest));
    }
    expect(forwarded + refused.length).toBe(500);
    console.info(`[fencegate] fences 1…500 over 20 entities and 3 replicas: ${forwarded} forwarded in order, ${refused.length} refused stale-fence`);
    expect(refused.length).toBeGreaterThan(0);

    // The rejection log, written by all three replicas: one row per refusal, no more, no less.
    const logged = await sql<{ entity: string; fence: string }>(
      `SELECT entity, presented_fence::text AS fence FROM rejections WHERE reason = 'stale-fence' AND entity LIKE $1`,
      [`race-${run}-%`],
    );
    expect(logged).toHaveLength(refused.length);
    const key = (r: { entity: string; fence: number | string }) => `${r.entity}#${r.fence}`;
    expect(logged.map(key).sort()).toEqual(refused.map(key).sort());
  });

  it('serial mode across replicas: Prefer: wait and the serial wait are woken by a holder on another replica; a held slot is busy everywhere', async () => {
    const entity = `tool-job:serial-${run}`;
    const [k1, k2, k3] = ['a', 'b', 'c'].map((k) => `serial-${run}-${k}`) as [string, string, string];

    // 1. The same key, Prefer: wait, on another replica than the holder.
    const gate1 = up.gate();
    up.behave((c) => (c.key === k1 ? { kind: 'hold', gate: gate1.promise } : undefined));
    const holder = command(replicas[0]!.url, '/payments/charges', { fence: 1, entity, key: k1 }).then(answerOf);
    await up.waitFor(() => up.callsFor(k1).length === 1, 'the holder upstream');
    // A newer fence with the same key: its admission raises the entity's
    // fence (visible in the table) and then waits for the record.
    const sameKey = command(replicas[1]!.url, '/payments/charges', { fence: 2, entity, key: k1, headers: { prefer: 'wait=30' } }).then(answerOf);
    await until(async () => (await fenceOf(entity)) === '2', 'the waiter admitted (fence raised to 2)');
    gate1.open();
    const [a, b] = await Promise.all([holder, sameKey]);
    expect(a.status).toBe(201);
    expect(b).toEqual({ ...a, replayed: true });
    expect(up.callsFor(k1)).toHaveLength(1);

    // 2. Another key on a third replica queues for the entity's slot.
    const gate2 = up.gate();
    up.behave((c) => (c.key === k2 ? { kind: 'hold', gate: gate2.promise } : undefined));
    const second = command(replicas[1]!.url, '/payments/charges', { fence: 3, entity, key: k2 }).then(answerOf);
    await up.waitFor(() => up.callsFor(k2).length === 1, 'the second holder upstream');
    const queued = command(replicas[2]!.url, '/payments/charges', { fence: 4, entity, key: k3 }).then(answerOf);
    await until(async () => (await fenceOf(entity)) === '4', 'the queued request admitted (fence raised to 4)');
    // The slot is held by replica 1: replica 0 says busy at once on the no-wait route.
    const busyRes = await command(replicas[0]!.url, '/nowait/charges', { fence: 4, entity, key: `serial-${run}-d` });
    expect(busyRes.status).toBe(409);
    expect(busyRes.headers.get('retry-after')).toMatch(/^\d+$/);
    expect((await answerOf(busyRes)).code).toBe('entity-busy');
    expect(up.callsFor(k3)).toEqual([]);
    gate2.open();
    const [c, d] = await Promise.all([second, queued]);
    expect([c.status, d.status]).toEqual([201, 201]);
    expect(up.calls.filter((x) => x.entity === entity).map((x) => x.key)).toEqual([k1, k2, k3]);
    expect(up.maxInflight(entity)).toBe(1);
  });

  it('negative control: the same fence race through a child whose store drops the fence → the upstream sees decreasing pairs, nothing is refused', async () => {
    // Fewer than above (60 over 6 entities): without the check every request
    // queues for its entity, and a shuffled ten per entity are out of order all the same.
    const fences = shuffled(Array.from({ length: 60 }, (_, i) => i + 1));
    const entityAt = (i: number) => `unfenced-${run}-${i % 6}`;
    const answers = await Promise.all(
      fences.map((f, i) => command(control.url, '/payments/charges', { fence: f, entity: entityAt(i), key: `unfenced-${run}-${f}` }).then(answerOf)),
    );
    expect(answers.filter((a) => a.status !== 201)).toEqual([]);
    const pairs = [0, 1, 2, 3, 4, 5].flatMap((e) => decreasingPairs(up.calls.filter((c) => c.entity === `unfenced-${run}-${e}`).map((c) => Number(c.fence))));
    expect(pairs.length).toBeGreaterThan(0);
    expect(await sql(`SELECT 1 FROM rejections WHERE entity LIKE $1`, [`unfenced-${run}-%`])).toEqual([]);
  });

  it('kill -9 of a replica mid-request: after the lock expires another replica records outcome_unknown (on the retry, or by its sweeper); nothing stays in_progress', async () => {
    const victim = replicas[2]!;
    const keys = [`crash-${run}-retried`, `crash-${run}-swept`] as const;
    const entities = [`tool-job:crash-${run}-0`, `tool-job:crash-${run}-1`] as const;
    up.behave((c) => (keys.includes(c.key as (typeof keys)[number]) ? { kind: 'hang' } : undefined));
    const lost = keys.map((key, i) => command(victim.url, '/crash/charges', { fence: 1, entity: entities[i]!, key }).then(answerOf, transportFailure));
    await up.waitFor(() => keys.every((k) => up.callsFor(k).length === 1), 'both requests upstream');
    victim.proc.kill('SIGKILL');
    expect((await victim.exited).signal).toBe('SIGKILL');
    replicas = replicas.slice(0, 2);
    up.behave(null);
    // The callers of the dead replica lost their connection: no answer at all.
    for (const a of await Promise.all(lost)) expect(a.status).toBe(0);
    // Killed before its 3 s upstream timeout: the dead replica recorded nothing.
    const states = async () =>
      (await sql<{ key: string; state: string }>('SELECT key, state FROM idempotency_records WHERE key = ANY($1) ORDER BY key', [[...keys]])).map(
        (r) => r.state,
      );
    expect(await states()).toEqual(['in_progress', 'in_progress']);

    // The retry, on a survivor: 409 in-progress while the dead lock lives, then outcome-unknown (never forwarded again).
    const retries: string[] = [];
    await until(
      async () => {
        const a = await command(replicas[0]!.url, '/crash/charges', { fence: 1, entity: entities[0], key: keys[0] }).then(answerOf);
        retries.push(String(a.code));
        return a.code === 'outcome-unknown';
      },
      'the retry to be told outcome-unknown',
      { everyMs: 200, timeoutMs: 30_000 },
    );
    expect(
      retries.slice(0, -1).every((c) => c === 'idempotency-in-progress'),
      retries.join(','),
    ).toBe(true);
    console.info(`[fencegate] kill -9: the retry on a survivor was answered idempotency-in-progress ${retries.length - 1} time(s), then outcome-unknown`);
    // The other record nobody retries: a survivor's sweeper settles it.
    await until(async () => (await states())[1] === 'outcome_unknown', 'the sweeper to mark the dead record', { everyMs: 200, timeoutMs: 30_000 });
    expect(await states()).toEqual(['outcome_unknown', 'outcome_unknown']);
    for (const k of keys) expect(up.callsFor(k)).toHaveLength(1);
    expect(await sql(`SELECT reason FROM rejections WHERE idempotency_key = $1`, [keys[0]])).toContainEqual({ reason: 'outcome-unknown' });

    // The dead replica's serial slot expired with its lock: the entity is usable again.
    expect((await command(replicas[1]!.url, '/crash/charges', { fence: 2, entity: entities[1], key: `crash-${run}-next` })).status).toBe(201);
    // G4 across the whole run: every record completed or outcome_unknown, none in progress.
    expect(await sql(`SELECT key FROM idempotency_records WHERE state = 'in_progress'`)).toEqual([]);
  });
});
