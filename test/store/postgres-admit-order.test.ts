import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAdmit } from '../../src/store/postgres/admit.js';
import { createPostgresStore, type PostgresGatewayStore } from '../../src/store/postgres/index.js';
import { poolQuery, qualifier, type PgContext } from '../../src/store/postgres/query.js';
import type { AdmitInput } from '../../src/store/types.js';
import { createTestSchema, holdEntity as holdRow, POSTGRES_URL, type TestSchema } from '../helpers/postgres.js';
import { admitInput } from '../store/helpers/inputs.js';

/**
 * Arrival order per entity and key across groups (DESIGN §8.2): an admission
 * left to run alone (it met another session's row lock) is not overtaken by a
 * later admission of its entity that goes out in the next group or alone. The
 * re-run is made slow the way bad luck does it: its statement waits (for a
 * pool connection, a slow network) while the later request's does not.
 */
let schema: TestSchema;
let store: PostgresGatewayStore;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const fresh = (over: Partial<AdmitInput> = {}) =>
  admitInput({ key: `k-${randomUUID()}`, entity: `e-${randomUUID()}`, ownerToken: `o-${randomUUID()}`, ...over });

const holdEntity = (entity: string) => holdRow(schema, entity);

/** The negative control: the group forgets every element's names, so nothing waits behind a pending re-run. */
function forgetNames(admit: ReturnType<typeof createAdmit>) {
  (admit.group as unknown as { chain: (i: AdmitInput) => string[] }).chain = () => [];
}

async function earlierThenLater(ordered: boolean) {
  const a = fresh(); // arrives first, meets another session's row lock, is left alone
  const z = fresh();
  const b = fresh({ entity: a.entity }); // arrives after A, same entity (serial)
  const base = poolQuery(schema.pool as never, () => false);
  let bSent!: () => void;
  const bOut = new Promise<void>((resolve) => (bSent = resolve));
  const ctx: PgContext = {
    table: qualifier(null),
    async query(text, values, prepared) {
      // A's re-run (the plain statement carrying A's owner token) is slow to
      // go out: it waits until B's statement has gone, or, when B is held
      // behind A (the order kept), 2 s.
      if (!text.includes('fencegate_admit_many(') && values[6] === a.ownerToken) await Promise.race([bOut, sleep(2_000)]);
      if (values[6] === b.ownerToken) bSent();
      return base(text, values, prepared);
    },
  };
  const admit = createAdmit(ctx, { budgetMs: null }); // no budget: only the held row defers
  if (!ordered) forgetNames(admit);
  const held = await holdEntity(a.entity!);
  const answerA = admit(a);
  await admit(z); // A's group has returned: A was queued before B is even sent
  expect(admit.group.stats).toMatchObject({ grouped: 2, deferred: 1 });
  await held.release();
  const answerB = await admit(b);
  return { a: await answerA, b: answerB };
}

describe.skipIf(!POSTGRES_URL)('arrival order of a deferred admission across groups', () => {
  beforeAll(async () => {
    schema = await createTestSchema('fg_rv_order');
    store = await createPostgresStore({ connectionString: schema.url, poolSize: 4 });
  });
  afterAll(async () => {
    await store?.close();
    await schema?.drop();
  });

  it('the earlier request of an entity, left alone, is decided before a later one of that entity', async () => {
    const { a, b } = await earlierThenLater(true);
    expect(a).toEqual({ outcome: 'forward', takeover: false });
    expect(b).toMatchObject({ outcome: 'entity-busy' });
  });

  it('negative control: without the names, the later request overtakes the earlier one', async () => {
    const { a, b } = await earlierThenLater(false);
    expect(b).toEqual({ outcome: 'forward', takeover: false });
    expect(a).toMatchObject({ outcome: 'entity-busy' });
  });
});
