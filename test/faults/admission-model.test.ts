import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { SqliteGatewayStore } from '../../src/store/sqlite/gateway-store.js';
import type { Admission, AdmitInput, FinishInput, GatewayStore, Mode, UnknownPolicy } from '../../src/store/types.js';
import { withoutFenceCheck } from '../helpers/store-wrappers.js';

// Model-based test of the admission state machine (DESIGN §3 steps 5 and 7):
// the GatewayStore interface on SQLite against a reference model written
// from the design text alone, a few lines per rule. Commands are admissions,
// finishes, lock expiries (a dead gateway: rows backdated, G6) and sweeps;
// a batch command issues several of them at once and fast-check's scheduler
// decides the order in which they reach the store, so concurrent requests
// interleave in every order it picks. After each command the whole state
// (fences, records, serial slots, rejection counts) must equal the model's.
//
// The SQLite store applies the pure rules of src/core/admission.ts, which
// every store is held to by test/store/admission-conformance.ts; this model
// is the independent check of those rules: written from the design text,
// not from the code, so a rule changed in `decide` fails here.

const RUNS = Number(process.env.FENCEGATE_FC_RUNS ?? 40);
const SCOPE = 'route';
const LOCK_MS = 600_000; // locks expire only when a command expires them

// --- the reference model ---------------------------------------------------------

interface Req {
  key: string | null;
  entity: string | null;
  fence: bigint | null;
  fp: string;
  mode: Mode;
  onUnknown: UnknownPolicy;
}

type State = 'in_progress' | 'completed' | 'outcome_unknown';
interface MRecord {
  fp: string;
  state: State;
  owner: string;
  lockExpired: boolean;
  /** The owner whose answer was stored (what a replay returns). */
  answer?: string;
}
interface MSlot {
  owner: string;
  expired: boolean;
}
/** A request that was forwarded and not finished yet. */
interface Inflight {
  owner: string;
  key: string | null;
  entity: string | null;
}

class Model {
  fences = new Map<string, bigint>();
  records = new Map<string, MRecord>();
  slots = new Map<string, MSlot>();
  rejections: Record<string, number> = {};
  inflight: Inflight[] = [];

  private log(reason: string) {
    this.rejections[reason] = (this.rejections[reason] ?? 0) + 1;
  }

  /** DESIGN §3.5, a–h. */
  admit(r: Req, owner: string): Admission {
    // a. The fence first, always; equal is fine; a passing fence is raised whatever follows.
    if (r.entity !== null && r.fence !== null) {
      const current = this.fences.get(r.entity);
      if (current !== undefined && r.fence < current) {
        this.log('stale-fence');
        return { outcome: 'stale-fence', currentFence: current };
      }
      this.fences.set(r.entity, r.fence);
    }
    let takeover = false;
    if (r.key !== null) {
      const rec = this.records.get(r.key);
      if (rec !== undefined) {
        // d. Another request under this key.
        if (rec.fp !== r.fp) {
          this.log('idempotency-key-reused');
          return { outcome: 'idempotency-key-reused' };
        }
        // c. Replay.
        if (rec.state === 'completed') return { outcome: 'replay', response: { status: 201, headers: [], body: Buffer.from(rec.answer!) } };
        // e. In progress, lock alive.
        if (rec.state === 'in_progress' && !rec.lockExpired) return { outcome: 'idempotency-in-progress', retryAfterMs: 0 };
        // f. In progress, its gateway died: outcome unknown (this sticks, whatever follows).
        if (rec.state === 'in_progress') rec.state = 'outcome_unknown';
        // g. Outcome unknown: refused, unless the upstream is idempotent.
        if (r.onUnknown === 'reject') {
          this.log('outcome-unknown');
          return { outcome: 'outcome-unknown' };
        }
        takeover = true;
      }
    }
    // h. Serial: one request in flight per entity (an expired slot is free).
    if (r.mode === 'serial' && r.entity !== null) {
      const slot = this.slots.get(r.entity);
      if (slot !== undefined && !slot.expired) return { outcome: 'entity-busy', retryAfterMs: 0 };
      this.slots.set(r.entity, { owner, expired: false });
    }
    if (r.key !== null) this.records.set(r.key, { fp: r.fp, state: 'in_progress', owner, lockExpired: false });
    this.inflight.push({ owner, key: r.key, entity: r.entity });
    return { outcome: 'forward', takeover };
  }

  /** DESIGN §3.7: conditional on the owner token; a record only marked unknown still belongs to its owner. */
  finish(f: Inflight, outcome: 'completed' | 'released' | 'unknown'): boolean {
    this.inflight = this.inflight.filter((i) => i !== f);
    let recorded = true;
    if (f.key !== null) {
      const rec = this.records.get(f.key);
      recorded = rec !== undefined && rec.owner === f.owner && rec.state !== 'completed';
      if (recorded) {
        if (outcome === 'completed') Object.assign(rec!, { state: 'completed', answer: f.owner, lockExpired: false });
        else if (outcome === 'released') this.records.delete(f.key);
        else Object.assign(rec!, { state: 'outcome_unknown', lockExpired: false });
      } else {
        this.log('late-finish');
      }
    }
    if (f.entity !== null && this.slots.get(f.entity)?.owner === f.owner) this.slots.delete(f.entity);
    return recorded;
  }

  /** The gateway holding `key` died: its lock and its entity's slot expire. */
  expire(key: string) {
    const rec = this.records.get(key);
    if (rec?.state === 'in_progress') rec.lockExpired = true;
    const inflight = this.inflight.find((i) => i.key === key);
    if (inflight?.entity) {
      const slot = this.slots.get(inflight.entity);
      if (slot) slot.expired = true;
    }
  }

  /** The sweeper: in-progress records with an expired lock become outcome_unknown (G4). */
  sweep() {
    for (const rec of this.records.values()) if (rec.state === 'in_progress' && rec.lockExpired) rec.state = 'outcome_unknown';
  }
}

// --- the real store -------------------------------------------------------------

interface Real {
  /** What the commands call (the store, or a wrapper around it in the negative control). */
  store: GatewayStore;
  /** The real SQLite store underneath, whose tables are compared. */
  sqlite: SqliteGatewayStore;
  owners: number;
}

/** Every outcome the model decided, so a run can show it exercised them all. */
const seen = new Map<string, number>();
const tally = (a: Admission) => {
  const k = a.outcome === 'forward' && a.takeover ? 'forward (takeover)' : a.outcome;
  seen.set(k, (seen.get(k) ?? 0) + 1);
};

function admitInput(r: Req, owner: string): AdmitInput {
  return {
    scope: SCOPE,
    key: r.key,
    entity: r.entity,
    fence: r.fence,
    fingerprint: r.fp,
    mode: r.mode,
    ownerToken: owner,
    lockMs: LOCK_MS,
    retentionMs: 86_400_000,
    onUnknown: r.onUnknown,
    audit: { requestId: owner, clientRequestId: null, caller: null, method: 'POST', path: '/x', payloadSha256: 'ab' },
  };
}

function finishInput(f: Inflight, outcome: 'completed' | 'released' | 'unknown'): FinishInput {
  const base = {
    scope: SCOPE,
    key: f.key,
    entity: f.entity,
    ownerToken: f.owner,
    audit: { requestId: f.owner, clientRequestId: null, caller: null, method: 'POST', path: '/x', payloadSha256: 'ab' },
  };
  if (outcome === 'completed') return { ...base, outcome, response: { status: 201, headers: [], body: Buffer.from(f.owner) }, retentionMs: 86_400_000 };
  return { ...base, outcome };
}

/** The same decision, compared: outcome, and what matters in it. */
function expectSame(real: Admission, model: Admission, what: string) {
  expect(real.outcome, what).toBe(model.outcome);
  if (real.outcome === 'stale-fence' && model.outcome === 'stale-fence') expect(real.currentFence, what).toBe(model.currentFence);
  if (real.outcome === 'replay' && model.outcome === 'replay')
    expect(Buffer.from(real.response.body).toString(), `${what}: the replay is the completing owner's answer`).toBe(
      Buffer.from(model.response.body).toString(),
    );
  if (real.outcome === 'forward' && model.outcome === 'forward') expect(real.takeover, what).toBe(model.takeover);
}

/** The whole state, read from the tables, must be the model's. */
function expectState(real: Real, m: Model) {
  const db = real.sqlite.db;
  const now = Number((db.prepare("SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS now").get() as { now: number }).now);
  const fences = Object.fromEntries(
    (
      db.prepare('SELECT entity, fence FROM fence_entities WHERE fence IS NOT NULL ORDER BY entity').safeIntegers(true).all() as {
        entity: string;
        fence: bigint;
      }[]
    ).map((r) => [r.entity, r.fence]),
  );
  expect(fences, 'fences').toEqual(Object.fromEntries([...m.fences].sort()));
  const records = Object.fromEntries(
    (db.prepare('SELECT key, fingerprint, state, owner_token FROM idempotency_records ORDER BY key').all() as any[]).map((r) => [
      r.key,
      { fp: r.fingerprint, state: r.state, owner: r.owner_token },
    ]),
  );
  expect(records, 'records').toEqual(Object.fromEntries([...m.records].sort().map(([k, r]) => [k, { fp: r.fp, state: r.state, owner: r.owner }])));
  const slots = Object.fromEntries(
    (db.prepare('SELECT entity, inflight_owner, inflight_until FROM fence_entities WHERE inflight_owner IS NOT NULL ORDER BY entity').all() as any[]).map(
      (r) => [r.entity, { owner: r.inflight_owner, expired: r.inflight_until <= now }],
    ),
  );
  expect(slots, 'serial slots').toEqual(Object.fromEntries([...m.slots].sort()));
  const rejections = Object.fromEntries(
    (db.prepare('SELECT reason, count(*) AS n FROM rejections GROUP BY reason').all() as any[]).map((r) => [r.reason, r.n]),
  );
  expect(rejections, 'rejection log').toEqual(m.rejections);
}

// --- commands ----------------------------------------------------------------------

const reqArb: fc.Arbitrary<Req> = fc
  .record({
    key: fc.constantFrom('k1', 'k2', 'k3', 'k1', 'k2', null),
    entity: fc.constantFrom('e1', 'e2', 'e1', null),
    fence: fc.option(fc.bigInt({ min: 0n, max: 4n }), { freq: 5 }),
    fp: fc.constantFrom('fpA', 'fpA', 'fpB'),
    mode: fc.constantFrom<Mode>('serial', 'serial', 'concurrent'),
    onUnknown: fc.constantFrom<UnknownPolicy>('reject', 'retry'),
  })
  .map((r) => (r.entity === null ? { ...r, fence: null } : r));

const finishOutcome = fc.constantFrom('completed', 'completed', 'released', 'unknown') as fc.Arbitrary<'completed' | 'released' | 'unknown'>;

class AdmitCommand implements fc.AsyncCommand<Model, Real> {
  constructor(readonly req: Req) {}
  check = () => true;
  async run(m: Model, r: Real) {
    const owner = `o${++r.owners}`;
    const expected = m.admit(this.req, owner);
    tally(expected);
    expectSame(await r.store.admit(admitInput(this.req, owner)), expected, this.toString());
    expectState(r, m);
  }
  toString = () => `admit(${JSON.stringify(this.req, (_k, v) => (typeof v === 'bigint' ? Number(v) : v))})`;
}

class FinishCommand implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly pick: number,
    readonly outcome: 'completed' | 'released' | 'unknown',
  ) {}
  check = (m: Readonly<Model>) => m.inflight.length > 0;
  async run(m: Model, r: Real) {
    const f = m.inflight[this.pick % m.inflight.length]!;
    const recorded = m.finish(f, this.outcome);
    expect((await r.store.finish(finishInput(f, this.outcome))).recorded, this.toString()).toBe(recorded);
    expectState(r, m);
  }
  toString = () => `finish(#${this.pick}, ${this.outcome})`;
}

class ExpireCommand implements fc.AsyncCommand<Model, Real> {
  constructor(readonly key: string) {}
  check = (m: Readonly<Model>) => m.records.get(this.key)?.state === 'in_progress';
  async run(m: Model, r: Real) {
    const entity = m.inflight.find((i) => i.key === this.key)?.entity ?? null;
    m.expire(this.key);
    // The gateway that held it died: backdate its lock and its entity's slot (G6: never fake the clock).
    r.sqlite.db.prepare("UPDATE idempotency_records SET locked_until = 0 WHERE key = ? AND state = 'in_progress'").run(this.key);
    if (entity !== null) r.sqlite.db.prepare('UPDATE fence_entities SET inflight_until = 0 WHERE entity = ? AND inflight_owner IS NOT NULL').run(entity);
    expectState(r, m);
  }
  toString = () => `expire(${this.key})`;
}

class SweepCommand implements fc.AsyncCommand<Model, Real> {
  check = () => true;
  async run(m: Model, r: Real) {
    m.sweep();
    await r.store.sweep({ rejectionRetentionMs: 86_400_000 });
    expectState(r, m);
  }
  toString = () => 'sweep()';
}

type BatchItem = { kind: 'admit'; req: Req } | { kind: 'finish'; pick: number; outcome: 'completed' | 'released' | 'unknown' };

/**
 * Several requests at once. The scheduler releases them to the store in an
 * order of its choosing; the model replays them in exactly that order, and
 * every answer must match (the store's decisions are serialisable, §3.5).
 */
class BatchCommand implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly items: BatchItem[],
    readonly s: fc.Scheduler,
  ) {}
  check = () => true;
  async run(m: Model, r: Real) {
    // Finishes pick distinct requests that were in flight when the batch began.
    const available = [...m.inflight];
    const calls: Promise<void>[] = [];
    const order: string[] = [];
    for (const item of this.items) {
      let target: Inflight | undefined;
      if (item.kind === 'finish') {
        if (available.length === 0) continue;
        target = available.splice(item.pick % available.length, 1)[0]!;
      }
      const f = target;
      calls.push(
        this.s.schedule(Promise.resolve(item.kind), item.kind).then(async () => {
          // Model and store see the items in the same order: the one the scheduler chose.
          if (item.kind === 'admit') {
            const owner = `o${++r.owners}`;
            order.push(`admit ${owner}`);
            const expected = m.admit(item.req, owner);
            tally(expected);
            expectSame(
              await r.store.admit(admitInput(item.req, owner)),
              expected,
              `batch admit ${JSON.stringify(item.req, (_k, v) => (typeof v === 'bigint' ? Number(v) : v))} after [${order.join(', ')}]`,
            );
          } else {
            order.push(`finish ${f!.owner}`);
            const recorded = m.finish(f!, item.outcome);
            expect((await r.store.finish(finishInput(f!, item.outcome))).recorded, `batch finish ${f!.owner}`).toBe(recorded);
          }
        }),
      );
    }
    await this.s.waitAll();
    await Promise.all(calls);
    expectState(r, m);
  }
  toString = () => `batch(${this.items.map((i) => i.kind).join(', ')})`;
}

const commands = [
  reqArb.map((req) => new AdmitCommand(req)),
  fc.tuple(fc.nat(10), finishOutcome).map(([pick, outcome]) => new FinishCommand(pick, outcome)),
  fc.constantFrom('k1', 'k2', 'k3').map((k) => new ExpireCommand(k)),
  fc.constant(new SweepCommand()),
  fc
    .tuple(
      fc.array(
        fc.oneof(
          reqArb.map((req): BatchItem => ({ kind: 'admit', req })),
          fc.tuple(fc.nat(10), finishOutcome).map(([pick, outcome]): BatchItem => ({ kind: 'finish', pick, outcome })),
        ),
        { minLength: 2, maxLength: 5 },
      ),
      fc.scheduler(),
    )
    .map(([items, s]) => new BatchCommand(items, s)),
];

/** Runs the property on fresh stores; `wrap` puts a test-only wrapper in front of the real one. */
async function modelProperty(groupCommit: boolean, numRuns: number, wrap: (s: GatewayStore) => GatewayStore = (x) => x): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-model-'));
  let n = 0;
  try {
    await fc.assert(
      fc.asyncProperty(fc.commands(commands, { maxCommands: 60, size: 'large' }), async (cmds) => {
        const sqlite = new SqliteGatewayStore({ path: join(dir, `model-${++n}.db`), synchronous: 'NORMAL', groupCommit });
        try {
          await fc.asyncModelRun(() => ({ model: new Model(), real: { store: wrap(sqlite), sqlite, owners: 0 } }), cmds);
        } finally {
          await sqlite.close();
        }
      }),
      { numRuns },
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe('admission state machine: GatewayStore (SQLite) against a reference model', () => {
  it.each([
    ['group commit', true],
    ['one transaction per decision', false],
  ])('%s: every decision and the whole state equal the model, under scheduler-chosen interleavings', { timeout: 120_000 }, async (_name, groupCommit) => {
    seen.clear();
    await modelProperty(groupCommit, RUNS);
    // The runs reached every branch of §3.5 (a test that never refuses proves nothing about refusals).
    expect([...seen.keys()].sort()).toEqual(
      ['entity-busy', 'forward', 'forward (takeover)', 'idempotency-in-progress', 'idempotency-key-reused', 'outcome-unknown', 'replay', 'stale-fence'].sort(),
    );
  });

  it('negative control: the same property against a store that never sees the fence fails', { timeout: 120_000 }, async () => {
    await expect(modelProperty(true, RUNS, withoutFenceCheck)).rejects.toThrow(/Property failed/);
  });
});
