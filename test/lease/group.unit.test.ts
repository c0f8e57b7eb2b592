/**
 * The lease store's group commit (src/lease/postgres/group.ts) with a fake
 * statement: which calls share a statement. Callers that call again as soon
 * as they are answered (a worker slot with a quick job) join the next
 * statement together, instead of half of them waiting for the one after.
 */
import { expect, test } from 'vitest';
import { firstStatement, StatementGroup } from '../../src/lease/postgres/group.js';

/** The statements' sizes when four callers make five calls each, each as soon as the previous one is answered. */
async function batchesOf(rejoins: ((input: number) => boolean) | undefined): Promise<number[]> {
  const batches: number[] = [];
  const group = new StatementGroup(
    async (inputs: number[]) => {
      batches.push(inputs.length);
      await new Promise((resolve) => setTimeout(resolve, 5)); // the round trip
      return inputs;
    },
    100,
    undefined,
    rejoins,
  );
  await Promise.all(
    Array.from({ length: 4 }, async (_, caller) => {
      for (let i = 0; i < 5; i++) expect(await group.submit(caller)).toBe(caller);
    }),
  );
  return batches;
}

test('callers that call again once answered share the next statement when the group expects them to', async () => {
  // The first call alone; the other three wait for it, and the first
  // caller's second call joins them; then all four go together.
  expect(await batchesOf(() => true)).toEqual([1, 4, 4, 4, 4, 3]);
  // Control: a group that does not expect them. The callers split in two
  // halves that take turns: twice the statements.
  expect(await batchesOf(undefined)).toEqual([1, 3, 1, 3, 1, 3, 1, 3, 1, 3]);
});

/**
 * Three calls in one group (after a first lone one) whose statement fails
 * when it holds the input 2, with `fault`: as the statement itself
 * (`firstStatement`, as the stores send their first statement) or, with
 * `afterCommit`, after the statement committed (reading its rows).
 */
async function poisoned(fault: () => Error, afterCommit = false) {
  const statements: number[][] = [];
  const group = new StatementGroup(async (inputs: number[]) => {
    const rows = await firstStatement(async () => {
      statements.push(inputs);
      if (!afterCommit && inputs.includes(2)) throw fault();
      return inputs;
    });
    if (afterCommit && inputs.includes(2)) throw fault();
    return rows;
  }, 100);
  const settled = await Promise.allSettled([0, 1, 2, 3].map((i) => group.submit(i)));
  return { statements, settled: settled.map((s) => s.status), reasons: settled.map((s) => (s.status === 'rejected' ? s.reason : null)) };
}

test('a statement that fails for one element’s data goes again one call at a time: only that call fails', async () => {
  const dataFault = () => Object.assign(new Error('unsupported Unicode escape sequence'), { code: '22P05' });
  const run = await poisoned(dataFault);
  expect({ statements: run.statements, settled: run.settled }).toEqual({
    statements: [[0], [1, 2, 3], [1], [2], [3]],
    settled: ['fulfilled', 'fulfilled', 'rejected', 'fulfilled'],
  });
  // The faulty call is told the server's own error.
  expect((run.reasons[2] as { code?: string }).code).toBe('22P05');
});

test('control: a fault after the statement committed never sends the calls again (a complete or a claim made twice)', async () => {
  const dataFault = () => Object.assign(new Error('unsupported Unicode escape sequence'), { code: '22P05' });
  for (const fault of [dataFault, () => new RangeError('not a safe integer'), () => new TypeError("Cannot set properties of undefined (setting 'lease')")]) {
    const run = await poisoned(fault, true);
    expect(run.statements).toEqual([[0], [1, 2, 3]]);
    expect(run.settled).toEqual(['fulfilled', 'rejected', 'rejected', 'rejected']);
  }
});

test('control: a statement that fails as a round trip (connection lost, timeout) rejects every call of its group, once', async () => {
  const lost = await poisoned(() => new Error('Connection terminated unexpectedly'));
  expect({ statements: lost.statements, settled: lost.settled }).toEqual({
    statements: [[0], [1, 2, 3]],
    settled: ['fulfilled', 'rejected', 'rejected', 'rejected'],
  });
  // A driver error without a SQLSTATE (a value it could not serialise) is not taken for a refused statement either.
  expect((await poisoned(() => new RangeError('Invalid string length'))).statements).toEqual([[0], [1, 2, 3]]);
  const timeout = () => Object.assign(new Error('canceling statement due to statement timeout'), { code: '57014' });
  expect((await poisoned(timeout)).statements).toEqual([[0], [1, 2, 3]]);
});
