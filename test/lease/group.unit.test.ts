/**
 * The lease store's group commit (src/lease/postgres/group.ts) with a fake
 * statement: which calls share a statement. Callers that call again as soon
 * as they are answered (a worker slot with a quick job) join the next
 * statement together, instead of half of them waiting for the one after.
 */
import { expect, test } from 'vitest';
import { StatementGroup } from '../../src/lease/postgres/group.js';

test('callers answered by a statement and calling again at once share the next one', async () => {
  const batches: number[] = [];
  const group = new StatementGroup(async (inputs: number[]) => {
    batches.push(inputs.length);
    await new Promise((resolve) => setTimeout(resolve, 5)); // the round trip
    return inputs;
  }, 100);
  // Four callers, five calls each, each call made as soon as the previous one is answered.
  await Promise.all(
    Array.from({ length: 4 }, async (_, caller) => {
      for (let i = 0; i < 5; i++) expect(await group.submit(caller)).toBe(caller);
    }),
  );
  // The first call alone; the other three wait for it, and the first caller's
  // second call joins them; then all four go together. (Without the group's
  // turn of the event loop after each answer: 1, 3, 1, 3, …, ten statements.)
  expect(batches).toEqual([1, 4, 4, 4, 4, 3]);
});
