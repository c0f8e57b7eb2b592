/**
 * The lease store's group commit (src/lease/postgres/group.ts) with a fake
 * statement: which calls share a statement. Callers that call again as soon
 * as they are answered (a worker slot with a quick job) join the next
 * statement together, instead of half of them waiting for the one after.
 */
import { expect, test } from 'vitest';
import { StatementGroup } from '../../src/lease/postgres/group.js';

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
