/**
 * Grouped statements on one PostgreSQL store: claim(), complete() and
 * completeAndClaim() calls that arrive while one of their kind is in flight
 * go out together, as one CLAIM_MANY, COMPLETE_MANY or COMPLETE_CLAIM_MANY
 * (src/lease/postgres/group.ts). They must keep
 * every guarantee of the one-at-a-time statements: each job claimed once per
 * lease, dead jobs failed and reported once, rising tokens under a shared
 * fence key, and a result stored only for a lease still held.
 *
 * Calls started in the same tick group deterministically: the first goes out
 * alone, the rest wait for it and share the next statement. Rows written by
 * one statement share its now(), which is how the tests see that a group
 * really formed.
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import * as q from '../../src/lease/postgres/queries.js';
import type { JobStore, Lease } from '../../src/lease/types.js';
import { POSTGRES_URL, postgresDatabase, type TestDatabase } from './helpers/stores.js';

describe.skipIf(!POSTGRES_URL)('grouped claims and completes on one PostgreSQL store', () => {
  let db: TestDatabase;
  let store: JobStore;

  beforeAll(async () => {
    db = await postgresDatabase();
    store = await db.open({ leaseMs: 120_000 });
  });
  afterAll(async () => {
    await db?.dispose();
  });

  const seed = (kind: string, n: number) =>
    db.sql(
      `INSERT INTO tool_jobs (kind, idempotency_key, payload, payload_sha256, max_attempts)
       SELECT $1, $1 || '-' || i, jsonb_build_object('n', i), '-', 3 FROM generate_series(1, $2::int) i`,
      [kind, n],
    );

  /** `loops` concurrent claim loops on the one store, until nothing is left. */
  const claimAll = async (kind: string, workerId: string, loops: number) =>
    (
      await Promise.all(
        Array.from({ length: loops }, async () => {
          const got: Lease[] = [];
          for (;;) {
            const { lease } = await store.claim({ workerId, kinds: [kind] });
            if (!lease) return got;
            got.push(lease);
          }
        }),
      )
    ).flat();

  test('20 claim loops on one store: every job exactly once; after expiry exactly once more, token+1, previous owner kept', async () => {
    await seed('g-once', 500);
    const first = await claimAll('g-once', 'gw1', 20);
    expect(first).toHaveLength(500);
    expect(new Set(first.map((l) => l.id)).size).toBe(500);
    expect(first.every((l) => l.fencingToken === 1 && l.attempt === 1)).toBe(true);
    // Grouping happened: far fewer claim statements (distinct now()) than jobs.
    const [once] = await db.sql<{ statements: string }>("SELECT count(DISTINCT first_claimed_at) AS statements FROM tool_jobs WHERE kind = 'g-once'");
    expect(Number(once!.statements)).toBeLessThan(250);

    await db.sql("UPDATE tool_jobs SET lease_until = now() - interval '1 hour' WHERE kind = 'g-once'");
    const second = await claimAll('g-once', 'gw2', 20);
    expect(second).toHaveLength(500);
    expect(new Set(second.map((l) => l.id)).size).toBe(500);
    expect(second.every((l) => l.fencingToken === 2 && l.previousOwnerId === 'gw1')).toBe(true);
    // The old leases are gone, grouped or not.
    const stale = await Promise.all(first.slice(0, 20).map((l) => store.complete(l, 'stale')));
    expect(stale.every((r) => !r.ok)).toBe(true);
  });

  test('dead jobs met by a grouped claim are failed and reported exactly once; the callers still get every live job', async () => {
    // Ids alternate dead (attempts used up) and live.
    await db.sql(
      `INSERT INTO tool_jobs (kind, idempotency_key, payload, payload_sha256, max_attempts, attempt)
       SELECT 'g-dead', 'g-dead-' || i, '{}', '-', CASE WHEN i % 2 = 0 THEN 1 ELSE 3 END, CASE WHEN i % 2 = 0 THEN 1 ELSE 0 END
         FROM generate_series(1, 20) i`,
    );
    const results = await Promise.all(Array.from({ length: 12 }, () => store.claim({ workerId: 'gw3', kinds: ['g-dead'] })));
    const leases = results.flatMap((r) => (r.lease ? [r.lease] : []));
    const failed = results.flatMap((r) => r.failed);
    expect(leases).toHaveLength(10);
    expect(new Set(leases.map((l) => l.id)).size).toBe(10);
    expect(failed).toHaveLength(10);
    expect(new Set(failed.map((f) => f.id)).size).toBe(10);
    expect(failed.every((f) => f.reason === 'max_attempts')).toBe(true);
    expect(await store.claim({ workerId: 'gw3', kinds: ['g-dead'] })).toEqual({ lease: null, failed: [] });
    const rows = await db.sql<{ state: string; n: string }>("SELECT state, count(*) AS n FROM tool_jobs WHERE kind = 'g-dead' GROUP BY state ORDER BY state");
    expect(rows).toEqual([
      { state: 'failed', n: '10' },
      { state: 'running', n: '10' },
    ]);
  });

  test('jobs sharing a custom fence key and claimed in one group get distinct tokens above the key’s last one', async () => {
    const earlier = await store.enqueue({ kind: 'g-key', idempotencyKey: 'g-key-0', payload: {}, fenceKey: 'acct-9' });
    const { lease: e } = await store.claim({ workerId: 'gw4', kinds: ['g-key'] });
    expect(e?.id).toBe(earlier.job.id);
    expect(await store.complete(e!, null)).toEqual({ ok: true });
    for (let i = 1; i <= 6; i++) await store.enqueue({ kind: 'g-key', idempotencyKey: `g-key-${i}`, payload: {}, fenceKey: 'acct-9' });

    const leases = (await Promise.all(Array.from({ length: 6 }, () => store.claim({ workerId: 'gw4', kinds: ['g-key'] })))).map((r) => r.lease!);
    const tokens = leases.map((l) => l.fencingToken);
    expect(new Set(tokens).size).toBe(6);
    expect(Math.min(...tokens)).toBeGreaterThan(e!.fencingToken);
    const [keyed] = await db.sql<{ statements: string }>(
      "SELECT count(DISTINCT first_claimed_at) AS statements FROM tool_jobs WHERE kind = 'g-key' AND id <> $1",
      [earlier.job.id],
    );
    expect(Number(keyed!.statements)).toBe(2); // one alone, five together

    // Negative control: the grouped claim without the rank hands equal tokens
    // to jobs of one key claimed together.
    for (let i = 1; i <= 3; i++) await store.enqueue({ kind: 'g-key2', idempotencyKey: `g-key2-${i}`, payload: {}, fenceKey: 'acct-10' });
    const unranked = q.CLAIM_MANY.replace('CASE WHEN j.fence_key IS NULL THEN 1 ELSE p.nth END', '1');
    expect(unranked).not.toBe(q.CLAIM_MANY);
    const rows = await db.sql<{ fencing_token: string }>(unranked, ['gw5', ['g-key2'], 1000, '{}', 3]);
    expect(rows).toHaveLength(3);
    expect(new Set(rows.map((r) => r.fencing_token)).size).toBe(1);
  });

  test('a grouped complete stores the results of leases still held and refuses the stale ones in the same group', async () => {
    await seed('g-done', 6);
    const mine = (await Promise.all(Array.from({ length: 6 }, () => store.claim({ workerId: 'gw6', kinds: ['g-done'] })))).map((r) => r.lease!);
    // Two of them expire and go to another owner (token 2).
    const lostIds = [mine[2]!.id, mine[4]!.id];
    await db.sql("UPDATE tool_jobs SET lease_until = now() - interval '1 hour' WHERE id = ANY ($1::bigint[])", [lostIds]);
    const other = await Promise.all(lostIds.map(() => store.claim({ workerId: 'gw7', kinds: ['g-done'] })));
    expect(other.map((r) => r.lease?.fencingToken)).toEqual([2, 2]);

    const answers = await Promise.all(mine.map((l) => store.complete(l, { by: 'gw6', id: l.id })));
    expect(answers.map((a) => a.ok)).toEqual([true, true, false, true, false, true]);
    const rows = await db.sql<{ id: string; state: string; owner_id: string; result: unknown; finished_at: Date | null }>(
      "SELECT id, state, owner_id, result, finished_at FROM tool_jobs WHERE kind = 'g-done' ORDER BY id",
    );
    for (const r of rows) {
      if (lostIds.includes(Number(r.id))) expect(r).toMatchObject({ state: 'running', owner_id: 'gw7', result: null });
      else expect(r).toMatchObject({ state: 'succeeded', owner_id: 'gw6', result: { by: 'gw6', id: Number(r.id) } });
    }
    // One alone, the other three together. Counted in SQL at the column's
    // microsecond precision: two statements can fall in one millisecond, and
    // a JavaScript Date would merge them.
    const [finished] = await db.sql<{ statements: string }>(
      "SELECT count(DISTINCT finished_at) AS statements FROM tool_jobs WHERE kind = 'g-done' AND finished_at IS NOT NULL",
    );
    expect(Number(finished!.statements)).toBe(2);

    // Negative control: the grouped complete without the ownership columns
    // lets the stale owner's result overwrite the new owner's job.
    const unconditional = q.COMPLETE_MANY.replace(
      "AND j.owner_id = x.owner_id AND j.fencing_token = x.fencing_token\n  AND j.state = 'running' AND j.lease_until > clock_timestamp()",
      '',
    );
    expect(unconditional).not.toBe(q.COMPLETE_MANY);
    await db.sql(unconditional, [[mine[2]!.id], ['gw6'], [mine[2]!.fencingToken], [JSON.stringify({ by: 'gw6 (stale)' })]]);
    const [overwritten] = await db.sql<{ result: unknown }>('SELECT result FROM tool_jobs WHERE id = $1', [mine[2]!.id]);
    expect(overwritten!.result).toEqual({ by: 'gw6 (stale)' });
  });

  test('grouped completeAndClaim: each slot whose complete matched claims one job, the stale ones in the group claim nothing, all in one statement', async () => {
    await seed('g-next', 12);
    const mine = (await Promise.all(Array.from({ length: 6 }, () => store.claim({ workerId: 'gw9', kinds: ['g-next'] })))).map((r) => r.lease!);
    // Two of them go to another owner (token 2).
    const lostIds = [mine[1]!.id, mine[3]!.id];
    await db.sql("UPDATE tool_jobs SET lease_until = now() - interval '1 hour' WHERE id = ANY ($1::bigint[])", [lostIds]);
    const other = await Promise.all(lostIds.map(() => store.claim({ workerId: 'gw10', kinds: ['g-next'] })));
    expect(other.map((r) => r.lease?.fencingToken)).toEqual([2, 2]);

    const claim = { workerId: 'gw9', kinds: ['g-next'] };
    const answers = await Promise.all(mine.map((l) => store.completeAndClaim!(l, { id: l.id }, claim)));
    expect(answers.map((a) => a.complete.ok)).toEqual([true, false, true, false, true, true]);
    expect(answers.map((a) => a.claim.lease !== null)).toEqual([true, false, true, false, true, true]);
    const next = answers.flatMap((a) => (a.claim.lease ? [a.claim.lease] : []));
    expect(new Set(next.map((l) => l.id)).size).toBe(4);
    expect(next.every((l) => l.fencingToken === 1 && l.ownerId === 'gw9' && !mine.some((m) => m.id === l.id))).toBe(true);
    const rows = await db.sql<{ state: string; n: string }>("SELECT state, count(*) AS n FROM tool_jobs WHERE kind = 'g-next' GROUP BY state ORDER BY state");
    // 12 jobs: 4 succeeded, 2 running under gw10, 4 newly running under gw9, 2 left.
    expect(rows).toEqual([
      { state: 'queued', n: '2' },
      { state: 'running', n: '6' },
      { state: 'succeeded', n: '4' },
    ]);
    // The first call alone, the other five together: each statement claimed
    // at the very now() it completed at.
    const [statements] = await db.sql<{ completes: string; together: string }>(
      `SELECT count(DISTINCT finished_at) AS completes,
              count(*) FILTER (WHERE first_claimed_at IN (SELECT finished_at FROM tool_jobs WHERE kind = 'g-next' AND finished_at IS NOT NULL)
                                 AND owner_id = 'gw9' AND state = 'running') AS together
         FROM tool_jobs WHERE kind = 'g-next'`,
    );
    expect(Number(statements!.completes)).toBe(2);
    expect(Number(statements!.together)).toBe(4);
  });

  test('plain claims and completeAndClaim calls of one claim share the group: one statement claims for both, never two claims in flight', async () => {
    await seed('g-mix', 10);
    const claim = { workerId: 'gw13', kinds: ['g-mix'] };
    const mine = (await Promise.all(Array.from({ length: 3 }, () => store.claim(claim)))).map((r) => r.lease!);
    await db.sql("UPDATE tool_jobs SET lease_until = now() - interval '1 hour' WHERE id = $1", [mine[1]!.id]);
    expect((await store.claim({ workerId: 'gw14', kinds: ['g-mix'] })).lease?.id).toBe(mine[1]!.id);

    const [alone, c0, plain1, c1, c2, plain2] = await Promise.all([
      store.claim(claim),
      store.completeAndClaim!(mine[0]!, 0, claim),
      store.claim(claim),
      store.completeAndClaim!(mine[1]!, 1, claim),
      store.completeAndClaim!(mine[2]!, 2, claim),
      store.claim(claim),
    ]);
    expect([c0!.complete.ok, c1!.complete.ok, c2!.complete.ok]).toEqual([true, false, true]);
    expect(c1!.claim).toEqual({ lease: null, failed: [] });
    const leases = [alone!.lease, c0!.claim.lease, plain1!.lease, c2!.claim.lease, plain2!.lease];
    expect(leases.every((l) => l !== null && l.ownerId === 'gw13' && l.fencingToken === 1)).toBe(true);
    expect(new Set(leases.map((l) => l!.id)).size).toBe(5);
    // The first call alone; the other five in one statement, which completed two and claimed four.
    const [together] = await db.sql<{ n: string }>(
      `SELECT count(*) AS n FROM tool_jobs
        WHERE kind = 'g-mix' AND state = 'running' AND owner_id = 'gw13'
          AND first_claimed_at IN (SELECT finished_at FROM tool_jobs WHERE kind = 'g-mix' AND finished_at IS NOT NULL)`,
    );
    expect(Number(together!.n)).toBe(4);
  });

  test('a result jsonb refuses fails only its own call: the neighbours in its group (a complete, a claim) go again alone and succeed', async () => {
    await seed('g-poison', 8);
    const claim = { workerId: 'gw15', kinds: ['g-poison'] };
    const [a, b, c] = (await Promise.all(Array.from({ length: 3 }, () => store.claim(claim)))).map((r) => r.lease!);
    // The first call alone; the next three share one statement, which fails as a whole.
    const settled = await Promise.allSettled([
      store.claim(claim),
      store.completeAndClaim!(a!, { s: 'bad\u0000' }, claim),
      store.completeAndClaim!(b!, { s: 'good' }, claim),
      store.claim(claim),
    ]);
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'rejected', 'fulfilled', 'fulfilled']);
    expect((settled[1] as PromiseRejectedResult).reason).toMatchObject({ code: '22P05' });
    const neighbour = (settled[2] as PromiseFulfilledResult<Awaited<ReturnType<NonNullable<JobStore['completeAndClaim']>>>>).value;
    expect(neighbour.complete).toEqual({ ok: true });
    expect(neighbour.claim.lease).not.toBeNull();
    expect((settled[3] as PromiseFulfilledResult<Awaited<ReturnType<JobStore['claim']>>>).value.lease).not.toBeNull();
    expect((await store.get(a!.id))?.state).toBe('running');
    expect((await store.get(b!.id))?.state).toBe('succeeded');
    // The same through complete()'s own group.
    const completes = await Promise.allSettled([store.complete(c!, 'first'), store.complete(a!, { s: 'bad\u0000' }), store.complete(c!, 'again')]);
    expect(completes.map((s) => s.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect((await store.get(c!.id))?.result).toBe('first');
    expect((await store.get(a!.id))?.state).toBe('running');
  });

  test('negative controls of COMPLETE_CLAIM_MANY: without the ownership columns a stale lease completes; with a claim per lease instead of per completed one, it claims', async () => {
    await seed('g-nc', 8);
    const stale = async (text: string) => {
      const { lease } = await store.claim({ workerId: 'gw11', kinds: ['g-nc'] });
      await db.sql("UPDATE tool_jobs SET lease_until = now() - interval '1 hour' WHERE id = $1", [lease!.id]);
      const taken = (await store.claim({ workerId: 'gw12', kinds: ['g-nc'] })).lease!;
      expect(taken.id).toBe(lease!.id);
      const rows = await db.sql<{ done: string[] | null; id: string | null }>(text, [
        'gw11',
        ['g-nc'],
        60_000,
        '{}',
        [lease!.id],
        ['gw11'],
        [lease!.fencingToken],
        [JSON.stringify('stale')],
        0,
      ]);
      return { completed: rows[0]!.done ?? [], claimed: rows.filter((r) => r.id !== null).length };
    };
    expect(await stale(q.COMPLETE_CLAIM_MANY)).toEqual({ completed: [], claimed: 0 });

    const unconditional = q.COMPLETE_CLAIM_MANY.replace(
      "AND j.owner_id = x.owner_id AND j.fencing_token = x.fencing_token\n  AND j.state = 'running' AND j.lease_until > clock_timestamp()",
      '',
    );
    expect(unconditional).not.toBe(q.COMPLETE_CLAIM_MANY);
    const overwrote = await stale(unconditional);
    expect(overwrote.completed).toHaveLength(1);
    expect(overwrote.claimed).toBe(1);

    const perLease = q.COMPLETE_CLAIM_MANY.replaceAll('(SELECT count(*) FROM done)', 'cardinality($5::bigint[])');
    expect(perLease).not.toBe(q.COMPLETE_CLAIM_MANY);
    expect(await stale(perLease)).toEqual({ completed: [], claimed: 1 });
  });

  test('the grouped claim’s generic plan reads the primary key for the picked ids only, never the whole table', async () => {
    // Once a prepared statement goes generic, LIMIT $5 is an unknown row
    // count; without the id array the planner hash-joined the picks against a
    // sequential scan of tool_jobs at this size.
    await seed('g-plan', 20_000);
    await db.sql('ANALYZE tool_jobs');
    const client = new pg.Client({ connectionString: (db.descriptor as { postgres: string }).postgres });
    await client.connect();
    try {
      await client.query('SET plan_cache_mode = force_generic_plan');
      const seqScans = async (name: string, text: string, types = 'int', values = '8') => {
        await client.query(`PREPARE ${name}(text, text[], bigint, jsonb, ${types}) AS ${text}`);
        const { rows } = await client.query(`EXPLAIN (FORMAT JSON) EXECUTE ${name}('gw8', '{g-plan}', 1000, '{}', ${values})`);
        const nodes: { 'Node Type': string; 'Relation Name'?: string }[] = [];
        const walk = (n: { 'Node Type': string; 'Relation Name'?: string; Plans?: unknown[] }) => {
          nodes.push(n);
          for (const c of (n.Plans ?? []) as (typeof n)[]) walk(c);
        };
        walk(rows[0]['QUERY PLAN'][0].Plan);
        return nodes.filter((n) => n['Node Type'] === 'Seq Scan' && n['Relation Name'] === 'tool_jobs').length;
      };
      expect(await seqScans('claim_many', q.CLAIM_MANY)).toBe(0);
      // The same for the claim inside COMPLETE_CLAIM_MANY, whose LIMIT is a subquery.
      expect(
        await seqScans('complete_claim_many', q.COMPLETE_CLAIM_MANY, 'bigint[], text[], bigint[], jsonb[], int', "'{1,2}', '{gw8,gw8}', '{1,1}', '{1,2}', 1"),
      ).toBe(0);
      // Negative control: the same statement without the id array.
      const unguarded = q.CLAIM_MANY.replace('\n  AND j.id = ANY (ARRAY(SELECT id FROM pick))', '');
      expect(unguarded).not.toBe(q.CLAIM_MANY);
      expect(await seqScans('claim_many_unguarded', unguarded)).toBeGreaterThan(0);
    } finally {
      await client.end();
    }
  });
});
