/**
 * THE admission conformance property (CONTRIBUTING.md convention 5):
 * every store (SQLite in both modes, PostgreSQL, D1 under workerd) is driven
 * with random command sequences, and each answer and each resulting state
 * (fences, serial slots, records, the rejection log) must equal what the
 * pure rules of src/core/admission.ts (`decide`, `finish`, `sweepRecord`,
 * `releaseUnsent`) give for the same commands, applied to a world of plain
 * data.
 *
 * Commands: admissions, finishes, lock expiries (a dead gateway: its rows
 * backdated in SQL, DESIGN §2 G6, never a faked clock), retention expiries,
 * sweeps, and batches that issue several admissions and finishes at once
 * (fast-check's scheduler picks the order they are sent in); with
 * `release`, for the stores that have `releaseUnsent`, releases of an
 * admission whose answer was lost too (DESIGN §8.2: an earlier admission,
 * forwarded or not, whose request is then never finished). A batch must be
 * explained by SOME serial order of its items (the stores promise
 * serialisable decisions, DESIGN §3.5): for SQLite that is the order they
 * were sent in; PostgreSQL and D1 may run them in another.
 *
 * Portable: runs in Node and in workerd (no Node APIs). Times in the world
 * are the test's `Date.now()`, the store's are the database clock; they are
 * compared only as "still live?" (locks and retention are 10 minutes and a
 * day, expiry is reached by backdating to 0), never as durations. The one
 * rule that compares two times of one record, the release's "created by
 * this admission" (its lock ends exactly `lockMs` after its creation), needs
 * a takeover to read another clock value than the creation it took over:
 * an admission starts only once both clocks (whole milliseconds) moved on
 * from the last admission's end.
 */
import fc from 'fast-check';
import { expect } from 'vitest';
import {
  decide,
  finish,
  releaseUnsent,
  sweepRecord,
  type AdmissionState,
  type EntityRow,
  type IdempotencyRecord,
  type LoggedRejection,
} from '../../src/core/admission.js';
import type { Admission, AdmitInput, FinishInput, GatewayStore, Mode, UnknownPolicy, UnsentRelease } from '../../src/store/types.js';
import { delegate } from '../helpers/delegate.js';

export const SCOPE = 'route';
export const LOCK_MS = 600_000;
const RETENTION_MS = 86_400_000;

/** The tables as a backend reads them (SQL of its dialect), times already turned into "live?" by the database clock. */
export interface TableSnapshot {
  entities: { entity: string; fence: string | null; owner: string | null; slotLive: boolean | null }[];
  records: {
    key: string;
    fingerprint: string;
    state: string;
    owner: string;
    lockLive: boolean | null;
    fresh: boolean;
    entity: string | null;
    fence: string | null;
    status: number | null;
    body: string | null;
    /** The attempt's request id, and whether its lock end is kept and (in progress) is the lock (DESIGN §3.12). */
    requestId: string | null;
    attemptKept: boolean;
    attemptIsLock: boolean | null;
  }[];
  rejections: { reason: string; entity: string | null; key: string | null; presented: string | null; current: string | null }[];
}

export interface AdmissionHarness {
  /** The store under test (the property may wrap it: negative controls). */
  store: GatewayStore;
  /** All rows of the four tables the rules touch. */
  snapshot(): Promise<TableSnapshot>;
  /** The gateway holding `key` died: its in_progress record's lock and `entity`'s slot move to time 0. */
  expire(key: string, entity: string | null): Promise<void>;
  /** A completed record's retention moves to time 0. */
  age(key: string): Promise<void>;
  close(): Promise<void>;
}

/** Opens a harness on empty tables, once per property run. */
export type AdmissionBackend = () => Promise<AdmissionHarness>;

// --- the world: plain data, changed only by the pure rules -----------------------

interface Inflight {
  owner: string;
  key: string | null;
  entity: string | null;
}

interface Req {
  key: string | null;
  entity: string | null;
  fence: bigint | null;
  fp: string;
  mode: Mode;
  onUnknown: UnknownPolicy;
}

/** `interim`: a finish `unknown` that keeps an interim answer (DESIGN §3.7). */
type Outcome = 'completed' | 'released' | 'unknown' | 'interim';

class World {
  entities = new Map<string, EntityRow>();
  records = new Map<string, IdempotencyRecord>();
  rejections: TableSnapshot['rejections'] = [];
  inflight: Inflight[] = [];
  /** Every admission so far, whatever its answer: what a release may be for. */
  admitted: AdmitInput[] = [];
  owners = 0;

  clone(): World {
    const w = new World();
    w.entities = new Map(this.entities);
    w.records = new Map(this.records);
    w.rejections = [...this.rejections];
    w.inflight = [...this.inflight];
    w.admitted = [...this.admitted];
    w.owners = this.owners;
    return w;
  }

  private slice(key: string | null, entity: string | null): AdmissionState {
    return { entity: entity === null ? null : (this.entities.get(entity) ?? null), record: key === null ? null : (this.records.get(key) ?? null) };
  }

  private store(key: string | null, entity: string | null, next: AdmissionState, rejection: LoggedRejection | null) {
    if (entity !== null && next.entity !== null) this.entities.set(entity, next.entity);
    if (key !== null) {
      if (next.record === null) this.records.delete(key);
      else this.records.set(key, next.record);
    }
    if (rejection !== null) {
      const str = (v: bigint | null) => (v === null ? null : v.toString());
      this.rejections.push({ reason: rejection.reason, entity, key, presented: str(rejection.presentedFence), current: str(rejection.currentFence) });
    }
  }

  admit(input: AdmitInput): Admission {
    const d = decide(this.slice(input.key, input.entity), input, Date.now());
    this.store(input.key, input.entity, d.next, d.rejection);
    if (d.admission.outcome === 'forward') this.inflight.push({ owner: input.ownerToken, key: input.key, entity: input.entity });
    this.admitted.push(input);
    return d.admission;
  }

  /** The admission's answer was lost: released, and its request never finished (the gateway answered 503). */
  release(input: AdmitInput): UnsentRelease & { branches: string[] } {
    this.inflight = this.inflight.filter((i) => i.owner !== input.ownerToken);
    const was = this.slice(input.key, input.entity);
    const r = releaseUnsent(was, input);
    this.store(input.key, input.entity, r.next, null);
    const branches: string[] = [];
    if (r.slot) branches.push('release: slot freed');
    if (r.record) branches.push(r.next.record === null ? 'release: record deleted' : 'release: record back to outcome_unknown');
    else if (was.record?.owner === input.ownerToken && was.record.state === 'outcome_unknown') branches.push('release: outcome_unknown kept');
    if (!r.slot && !r.record) branches.push('release: nothing held');
    return { slot: r.slot, record: r.record, branches };
  }

  finish(input: FinishInput): boolean {
    this.inflight = this.inflight.filter((i) => i.owner !== input.ownerToken);
    const f = finish(this.slice(input.key, input.entity), input, Date.now());
    this.store(input.key, input.entity, f.next, f.rejection);
    return f.recorded;
  }

  expire(key: string, entity: string | null) {
    const r = this.records.get(key);
    if (r?.state === 'in_progress') this.records.set(key, { ...r, lockedUntil: 0 });
    const e = entity === null ? undefined : this.entities.get(entity);
    if (e?.slot) this.entities.set(entity!, { ...e, slot: { ...e.slot, until: 0 } });
  }

  age(key: string) {
    const r = this.records.get(key);
    if (r?.state === 'completed') this.records.set(key, { ...r, expiresAt: 0 });
  }

  sweep() {
    const now = Date.now();
    for (const [key, r] of this.records) {
      const next = sweepRecord(r, now);
      if (next === null) this.records.delete(key);
      else this.records.set(key, next);
    }
  }

  /** The world in the shape of `TableSnapshot`, sorted as `normalise` sorts. */
  snapshot(): TableSnapshot {
    const now = Date.now();
    const str = (v: bigint | null) => (v === null ? null : v.toString());
    const live = (until: number | null) => (until === null ? null : until > now);
    return normalise({
      entities: [...this.entities].map(([entity, e]) => ({
        entity,
        fence: str(e.fence),
        owner: e.slot?.owner ?? null,
        slotLive: e.slot ? live(e.slot.until) : null,
      })),
      records: [...this.records].map(([key, r]) => ({
        key,
        fingerprint: r.fingerprint,
        state: r.state,
        owner: r.owner,
        lockLive: live(r.lockedUntil),
        fresh: r.expiresAt > now,
        entity: r.entity,
        fence: str(r.fence),
        status: r.response?.status ?? null,
        body: r.response === null ? null : new TextDecoder().decode(r.response.body),
        requestId: r.requestId,
        attemptKept: r.attemptUntil !== null,
        attemptIsLock: r.attemptUntil === null || r.lockedUntil === null ? null : r.attemptUntil === r.lockedUntil,
      })),
      rejections: this.rejections,
    });
  }
}

/** Sorted rows with booleans and numbers as the world has them (backends return 0/1, strings, bigints). */
export function normalise(s: TableSnapshot): TableSnapshot {
  const bool = (v: unknown) => (v === null || v === undefined ? null : Boolean(Number(v)));
  const text = (v: unknown) => (v === null || v === undefined ? null : String(v));
  const by =
    <T>(f: (x: T) => string) =>
    (a: T, b: T) =>
      f(a) < f(b) ? -1 : f(a) > f(b) ? 1 : 0;
  return {
    entities: s.entities.map((e) => ({ entity: e.entity, fence: text(e.fence), owner: text(e.owner), slotLive: bool(e.slotLive) })).sort(by((e) => e.entity)),
    records: s.records
      .map((r) => ({
        key: r.key,
        fingerprint: r.fingerprint,
        state: r.state,
        owner: r.owner,
        lockLive: bool(r.lockLive),
        fresh: bool(r.fresh)!,
        entity: text(r.entity),
        fence: text(r.fence),
        status: r.status === null || r.status === undefined ? null : Number(r.status),
        body: text(r.body),
        requestId: text(r.requestId),
        attemptKept: bool(r.attemptKept)!,
        attemptIsLock: bool(r.attemptIsLock),
      }))
      .sort(by((r) => r.key)),
    rejections: s.rejections
      .map((r) => ({ reason: r.reason, entity: text(r.entity), key: text(r.key), presented: text(r.presented), current: text(r.current) }))
      .sort(by((r) => JSON.stringify(r))),
  };
}

// --- inputs -------------------------------------------------------------------------

const audit = (owner: string) => ({ requestId: owner, clientRequestId: null, caller: null, method: 'POST', path: '/x', payloadSha256: 'ab' });

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
    retentionMs: RETENTION_MS,
    onUnknown: r.onUnknown,
    audit: audit(owner),
  };
}

function finishInput(f: Inflight, outcome: Outcome): FinishInput {
  const base = { scope: SCOPE, key: f.key, entity: f.entity, ownerToken: f.owner, audit: audit(f.owner) };
  if (outcome === 'completed')
    return { ...base, outcome, response: { status: 201, headers: [], body: new TextEncoder().encode(f.owner) }, retentionMs: RETENTION_MS };
  if (outcome === 'interim')
    return {
      ...base,
      outcome: 'unknown',
      interim: { status: 202, headers: [['location', `/ops/${f.owner}`]], body: new TextEncoder().encode(`interim ${f.owner}`) },
    };
  return { ...base, outcome };
}

/** Why two answers differ, or null when they are the same decision. */
function differs(real: Admission, model: Admission): string | null {
  if (real.outcome !== model.outcome) return `outcome ${real.outcome}, rules say ${model.outcome}`;
  if (real.outcome === 'stale-fence' && model.outcome === 'stale-fence' && real.currentFence !== model.currentFence)
    return `current fence ${real.currentFence}, rules say ${model.currentFence}`;
  if (real.outcome === 'replay' && model.outcome === 'replay') {
    const body = (a: typeof real) => new TextDecoder().decode(a.response.body);
    if (real.response.status !== model.response.status || body(real) !== body(model))
      return `replayed ${real.response.status} ${body(real)}, rules say ${model.response.status} ${body(model)}`;
  }
  if (real.outcome === 'outcome-unknown' && model.outcome === 'outcome-unknown') {
    const interim = (a: typeof real) => (a.interim === undefined ? null : `${a.interim.status} ${new TextDecoder().decode(a.interim.body)}`);
    if (interim(real) !== interim(model)) return `interim ${interim(real)}, rules say ${interim(model)}`;
  }
  if (real.outcome === 'forward' && model.outcome === 'forward' && real.takeover !== model.takeover)
    return `takeover ${real.takeover}, rules say ${model.takeover}`;
  if ((real.outcome === 'idempotency-in-progress' || real.outcome === 'entity-busy') && 'retryAfterMs' in model) {
    // Both clocks read "the lock is live": Retry-After lies within the lock.
    if (!(real.retryAfterMs > 0 && real.retryAfterMs <= LOCK_MS)) return `retryAfterMs ${real.retryAfterMs} outside (0, ${LOCK_MS}]`;
  }
  return null;
}

const show = (v: unknown) => JSON.stringify(v, (_k, x) => (typeof x === 'bigint' ? Number(x) : x));

// --- commands -------------------------------------------------------------------------

interface Real {
  h: AdmissionHarness;
  store: GatewayStore;
  seen: Set<string>;
  /** `Date.now()` when the last admission ended. */
  lastAdmission: number;
}

/** Waits until the clocks' millisecond moved on from the last admission's end (see the header: the release's creation test). */
async function nextMillisecond(r: Real): Promise<void> {
  while (Date.now() <= r.lastAdmission) await new Promise((resolve) => setTimeout(resolve, 1));
}

const tally = (seen: Set<string>, a: Admission) =>
  seen.add(
    a.outcome === 'forward' && a.takeover
      ? 'forward (takeover)'
      : a.outcome === 'outcome-unknown' && a.interim !== undefined
        ? 'outcome-unknown (interim)'
        : a.outcome,
  );

async function expectState(r: Real, w: World, what: string) {
  expect(normalise(await r.h.snapshot()), `state after ${what}`).toEqual(w.snapshot());
}

class AdmitCommand implements fc.AsyncCommand<World, Real> {
  constructor(readonly req: Req) {}
  check = () => true;
  async run(w: World, r: Real) {
    await nextMillisecond(r);
    const input = admitInput(this.req, `o${++w.owners}`);
    const expected = w.admit(input);
    tally(r.seen, expected);
    const why = differs(await r.store.admit(input), expected);
    r.lastAdmission = Date.now();
    expect(why, this.toString()).toBeNull();
    await expectState(r, w, this.toString());
  }
  toString = () => `admit(${show(this.req)})`;
}

class FinishCommand implements fc.AsyncCommand<World, Real> {
  constructor(
    readonly pick: number,
    readonly outcome: Outcome,
  ) {}
  check = (w: Readonly<World>) => w.inflight.length > 0;
  async run(w: World, r: Real) {
    const input = finishInput(w.inflight[this.pick % w.inflight.length]!, this.outcome);
    const recorded = w.finish(input);
    expect((await r.store.finish(input)).recorded, this.toString()).toBe(recorded);
    await expectState(r, w, this.toString());
  }
  toString = () => `finish(#${this.pick}, ${this.outcome})`;
}

/**
 * The answer of an earlier admission was lost: `releaseUnsent` with its own
 * input. The pick chooses among the requests in flight (they hold what a
 * release frees), the owners of records in progress (taken over, or created
 * and then expired), the owners of `outcome_unknown` records, or the last
 * four admissions whatever their answer, the most recent first; an empty
 * choice falls back to the last.
 */
class ReleaseCommand implements fc.AsyncCommand<World, Real> {
  constructor(readonly pick: number) {}
  check = (w: Readonly<World>) => w.admitted.length > 0;
  async run(w: World, r: Real) {
    const records = [...w.records.values()];
    const owning = (states: string[]) => new Set(records.filter((rec) => states.includes(rec.state)).map((rec) => rec.owner));
    const inProgress = owning(['in_progress']);
    const unknown = owning(['outcome_unknown']);
    const pools = [
      w.admitted.filter((a) => w.inflight.some((i) => i.owner === a.ownerToken)),
      w.admitted.filter((a) => inProgress.has(a.ownerToken)),
      w.admitted.filter((a) => unknown.has(a.ownerToken)),
      w.admitted.slice(-4),
    ];
    const pool = pools[this.pick % 4]!.length > 0 ? pools[this.pick % 4]! : pools[3]!;
    const input = pool[pool.length - 1 - (Math.floor(this.pick / 4) % pool.length)]!;
    const { branches, ...expected } = w.release(input);
    expect(await r.store.releaseUnsent!(input), `${this.toString()} of ${input.ownerToken}`).toEqual(expected);
    for (const b of branches) r.seen.add(b);
    await expectState(r, w, `${this.toString()} of ${input.ownerToken}`);
  }
  toString = () => `release(#${this.pick})`;
}

class ExpireCommand implements fc.AsyncCommand<World, Real> {
  constructor(readonly key: string) {}
  check = (w: Readonly<World>) => w.records.get(this.key)?.state === 'in_progress';
  async run(w: World, r: Real) {
    const entity = w.inflight.find((i) => i.key === this.key)?.entity ?? null;
    w.expire(this.key, entity);
    await r.h.expire(this.key, entity);
    await expectState(r, w, this.toString());
  }
  toString = () => `expire(${this.key})`;
}

class AgeCommand implements fc.AsyncCommand<World, Real> {
  constructor(readonly key: string) {}
  check = (w: Readonly<World>) => w.records.get(this.key)?.state === 'completed';
  async run(w: World, r: Real) {
    w.age(this.key);
    await r.h.age(this.key);
    await expectState(r, w, this.toString());
  }
  toString = () => `age(${this.key})`;
}

class SweepCommand implements fc.AsyncCommand<World, Real> {
  check = () => true;
  async run(w: World, r: Real) {
    w.sweep();
    await r.store.sweep({ rejectionRetentionMs: RETENTION_MS });
    await expectState(r, w, 'sweep()');
  }
  toString = () => 'sweep()';
}

type BatchItem = { kind: 'admit'; req: Req } | { kind: 'finish'; pick: number; outcome: Outcome };
type Bound = { kind: 'admit'; input: AdmitInput } | { kind: 'finish'; input: FinishInput };

function* permutations<T>(xs: T[]): Generator<T[]> {
  if (xs.length <= 1) return yield xs;
  for (let i = 0; i < xs.length; i++) for (const rest of permutations([...xs.slice(0, i), ...xs.slice(i + 1)])) yield [xs[i]!, ...rest];
}

/**
 * Several requests at once, sent in the order fast-check's scheduler picks.
 * The answers and the state after must be those of the rules applied in
 * one serial order of the items: the order they were sent in first, then
 * any other (a store with a pool may run them in another order).
 */
class BatchCommand implements fc.AsyncCommand<World, Real> {
  constructor(
    readonly items: BatchItem[],
    readonly s: fc.Scheduler,
  ) {}
  check = () => true;
  async run(w: World, r: Real) {
    await nextMillisecond(r);
    // Finishes pick distinct requests that were in flight when the batch began.
    const available = [...w.inflight];
    const bound: Bound[] = [];
    for (const item of this.items) {
      if (item.kind === 'admit') bound.push({ kind: 'admit', input: admitInput(item.req, `o${++w.owners}`) });
      else if (available.length > 0) bound.push({ kind: 'finish', input: finishInput(available.splice(item.pick % available.length, 1)[0]!, item.outcome) });
    }
    const sent: number[] = [];
    const answers = new Map<number, Admission | boolean>();
    await Promise.all([
      ...bound.map((b, i) =>
        this.s.schedule(Promise.resolve(i)).then(async () => {
          sent.push(i);
          answers.set(i, b.kind === 'admit' ? await r.store.admit(b.input) : (await r.store.finish(b.input)).recorded);
        }),
      ),
      this.s.waitAll(),
    ]);
    r.lastAdmission = Date.now();
    const real = normalise(await r.h.snapshot());
    const order = (xs: number[]) =>
      xs.map((i) => (bound[i]!.kind === 'admit' ? `admit ${bound[i]!.input.ownerToken}` : `finish ${bound[i]!.input.ownerToken}`)).join(', ');
    let first: string | null = null;
    const candidates = [sent, ...permutations(bound.map((_b, i) => i))];
    for (const perm of candidates) {
      const trial = w.clone();
      const trialSeen: Admission[] = [];
      let why: string | null = null;
      for (const i of perm) {
        const b = bound[i]!;
        const got = answers.get(i)!;
        if (b.kind === 'admit') {
          const expected = trial.admit(b.input);
          trialSeen.push(expected);
          why = differs(got as Admission, expected);
        } else {
          const recorded = trial.finish(b.input);
          if (got !== recorded) why = `recorded ${got}, rules say ${recorded}`;
        }
        if (why !== null) {
          why = `${why} at ${b.kind} ${b.input.ownerToken}`;
          break;
        }
      }
      if (why === null) {
        try {
          expect(real).toEqual(trial.snapshot());
        } catch {
          why = 'the state after differs';
        }
      }
      if (why === null) {
        // Adopt this order: the world is now the one it explains.
        Object.assign(w, trial);
        for (const a of trialSeen) tally(r.seen, a);
        // The world's admissions read its clock just now.
        r.lastAdmission = Date.now();
        return;
      }
      first ??= `${why} (in the order sent: ${order(perm)})`;
    }
    // No serial order explains it: show the order they were sent in.
    const trial = w.clone();
    for (const i of sent) {
      const b = bound[i]!;
      if (b.kind === 'admit') trial.admit(b.input);
      else trial.finish(b.input);
    }
    expect(real, `${this.toString()}: no serial order explains the answers and the state; ${first}`).toEqual(trial.snapshot());
    expect.fail(`${this.toString()}: no serial order explains the answers; ${first}`);
  }
  toString = () => `batch(${this.items.map((i) => (i.kind === 'admit' ? `admit ${show(i.req)}` : `finish #${i.pick} ${i.outcome}`)).join('; ')})`;
}

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

const finishOutcome = fc.constantFrom<Outcome>('completed', 'completed', 'released', 'unknown', 'interim');
const keyArb = fc.constantFrom('k1', 'k2', 'k3');

const baseCommands = [
  reqArb.map((req) => new AdmitCommand(req)),
  fc.tuple(fc.nat(10), finishOutcome).map(([pick, outcome]) => new FinishCommand(pick, outcome)),
  keyArb.map((k) => new ExpireCommand(k)),
  keyArb.map((k) => new AgeCommand(k)),
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

/**
 * With `release`, the first run: one sequence that reaches every branch of
 * `releaseUnsent` on every store, whatever the random runs after it reach.
 * The picks: 0 a request in flight, 1 an owner of a record in progress,
 * 2 an owner of an outcome_unknown record, 3 the last admission.
 */
function releaseExample(): fc.AsyncCommand<World, Real>[] {
  const retry: Req = { key: 'k1', entity: 'e1', fence: 1n, fp: 'fpA', mode: 'serial', onUnknown: 'retry' };
  return [
    new AdmitCommand(retry), // o1 forwarded: record k1 and slot e1
    new FinishCommand(0, 'unknown'), // k1 outcome_unknown, still o1's
    new ReleaseCommand(2), // o1 on a retry route: created or taken over, no one can tell: kept
    new AdmitCommand(retry), // o2 takes k1 over, and slot e1
    new ReleaseCommand(1), // o2: the taken-over record back to outcome_unknown, the slot freed
    new AdmitCommand({ key: 'k2', entity: 'e2', fence: null, fp: 'fpA', mode: 'serial', onUnknown: 'reject' }), // o3
    new ReleaseCommand(0), // o3: record deleted, slot freed
    new ReleaseCommand(3), // o3 again: nothing held
    new AdmitCommand({ key: 'k3', entity: null, fence: null, fp: 'fpA', mode: 'concurrent', onUnknown: 'retry' }), // o4
    new ReleaseCommand(0), // o4 on a retry route, a record it created: deleted
  ];
}

/** With `release`: releases too, two commands in eight (and ten more commands a run). */
const releaseArb = fc.nat(31).map((pick) => new ReleaseCommand(pick));
const releaseCommands = [releaseArb, releaseArb];

/** Every answer the rules can give: a run that never reached one proves nothing about it. */
export const ALL_OUTCOMES = [
  'entity-busy',
  'forward',
  'forward (takeover)',
  'idempotency-in-progress',
  'idempotency-key-reused',
  'outcome-unknown',
  'outcome-unknown (interim)',
  'replay',
  'stale-fence',
];

/** Every branch of `releaseUnsent` (DESIGN §8.2), reached when the property runs releases. */
export const RELEASE_BRANCHES = [
  'release: nothing held',
  'release: outcome_unknown kept',
  'release: record back to outcome_unknown',
  'release: record deleted',
  'release: slot freed',
];

export interface PropertyOptions {
  numRuns: number;
  maxCommands?: number;
  /** A test-only wrapper in front of the store (negative controls). */
  wrap?: (s: GatewayStore) => GatewayStore;
  /** Stop at the first failure, without shrinking (negative controls: only "it fails" matters). */
  endOnFailure?: boolean;
  /**
   * Releases of lost admissions among the commands (the store must have
   * `releaseUnsent`). A run of its own: releases free what would otherwise
   * become `outcome_unknown`, so mixed into the plain property they would
   * make its rarer answers rarer still.
   */
  release?: boolean;
}

/** Runs the property; resolves with the outcomes the runs reached, rejects on the first counterexample. */
export async function admissionProperty(backend: AdmissionBackend, options: PropertyOptions): Promise<string[]> {
  const seen = new Set<string>();
  const release = options.release ?? false;
  const commands: fc.Arbitrary<fc.AsyncCommand<World, Real>>[] = release ? [...baseCommands, ...releaseCommands] : baseCommands;
  await fc.assert(
    fc.asyncProperty(fc.commands(commands, { maxCommands: options.maxCommands ?? (release ? 70 : 60), size: 'large' }), async (cmds) => {
      const h = await backend();
      try {
        const store = options.wrap ? options.wrap(h.store) : h.store;
        if (release && typeof store.releaseUnsent !== 'function') throw new Error('the property runs releases, and this store has no releaseUnsent');
        await fc.asyncModelRun(() => ({ model: new World(), real: { h, store, seen, lastAdmission: 0 } }), cmds);
      } finally {
        await h.close();
      }
    }),
    { numRuns: options.numRuns, endOnFailure: options.endOnFailure, examples: release ? [[releaseExample()]] : [] },
  );
  return [...seen].sort();
}

// --- negative controls: one rule changed, in front of a real store ---------------------
/** The store never sees the fence (DESIGN §3.5 a switched off). */
export const hideFence = (inner: GatewayStore): GatewayStore => delegate(inner, { admit: (i) => inner.admit({ ...i, fence: null }), ...releaseOf(inner) });
/** The store never sees a fingerprint other than the first one (DESIGN §3.5 d switched off). */
export const dropFingerprint = (inner: GatewayStore): GatewayStore =>
  delegate(inner, { admit: (i) => inner.admit({ ...i, fingerprint: 'fpA' }), ...releaseOf(inner) });
/** `releaseUnsent` passed through as it is, when the store has it (delegate() passes only the required methods). */
export const releaseOf = (inner: GatewayStore): Partial<GatewayStore> =>
  inner.releaseUnsent === undefined ? {} : { releaseUnsent: (i) => inner.releaseUnsent!(i) };
