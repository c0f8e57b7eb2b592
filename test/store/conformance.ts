/**
 * THE store conformance suite (CONTRIBUTING.md convention 5): every backend of
 * `GatewayStore` (SQLite, PostgreSQL, D1) must pass it, through the
 * interface only. Backend-specific powers (moving rows into the past, a
 * second replica on the same database) come through the harness the factory
 * returns, so the suite body uses nothing but the interface, `setTimeout`,
 * `TextEncoder` and `crypto.randomUUID` (it also runs under workerd).
 *
 * Expiry is reached with short real lock / retention values (a few ms, then
 * a short sleep) or by backdating rows in SQL: never by faking a clock.
 * No test asserts a duration.
 *
 * The safety checks (`checkStaleFence`, `checkFenceRace`, `checkSingleForward`,
 * `checkSerialExclusive`) return the violations they saw instead of asserting,
 * so that the suite can also run them against wrappers that switch a check
 * off (negative controls, CONTRIBUTING.md convention 7) and see them fail.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CUT_MARKER, REJECTION_TEXT_LIMITS as LIMITS, cutText } from '../../src/store/bounds.js';
import {
  entityTopic,
  recordTopic,
  type Admission,
  type AdmitInput,
  type AuditInfo,
  type CommandInput,
  type CommandQuery,
  type CommandRow,
  type FinishInput,
  type GatewayStore,
  type RejectionRow,
  type ResolveInput,
  type StoredResponse,
} from '../../src/store/types.js';

export interface ConformanceHarness {
  store: GatewayStore;
  /** Moves these rejection rows `ms` into the past (backend SQL on `at`). */
  backdateRejections(ids: string[], ms: number): Promise<void>;
  /**
   * Moves the time `column` of the rows of `table` whose `where.column`
   * equals `where.value` `ms` into the past (backend SQL), to reach a
   * retention without waiting for it.
   */
  backdate(table: BackdateTable, column: string, ms: number, where: { column: string; value: string }): Promise<void>;
  /** Makes the record of `key` one written before the attempt's lock end and request id were kept (both NULL, migration 0010). */
  forgetAttempt(key: string): Promise<void>;
  /** Opens another store on the same database, as another gateway replica would. The suite closes it. */
  openReplica(): Promise<GatewayStore>;
  /** Closes whatever the harness opened (the suite closes `store` itself first). */
  close(): Promise<void>;
}

export type HarnessFactory = () => Promise<ConformanceHarness>;
export type BackdateTable = 'idempotency_records' | 'fence_entities' | 'fence_history' | 'operator_actions' | 'rejections' | 'commands';

// ---------------------------------------------------------------------------
// Small helpers (portable: no Node APIs)

export const uid = (): string => globalThis.crypto.randomUUID();
export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
/** Longer than any lock / retention the suite sets to reach expiry ("a few ms"). */
const PAST_EXPIRY_MS = 40;
const SHORT = 3;

export function audit(over: Partial<AuditInfo> = {}): AuditInfo {
  return {
    requestId: `req-${uid()}`,
    clientRequestId: null,
    caller: null,
    method: 'POST',
    path: '/payments/charges?currency=eur',
    payloadSha256: 'ab'.repeat(32),
    ...over,
  };
}

/** An admission input with sane defaults: serial, fenced, keyed, long lock and retention. */
export function command(over: Partial<AdmitInput> = {}): AdmitInput {
  return {
    scope: 'payments',
    key: `key-${uid()}`,
    entity: `entity-${uid()}`,
    fence: 1n,
    fingerprint: 'fp-1',
    mode: 'serial',
    ownerToken: `owner-${uid()}`,
    lockMs: 30_000,
    retentionMs: 3_600_000,
    onUnknown: 'reject',
    audit: audit(),
    ...over,
  };
}

export function response(over: Partial<StoredResponse> = {}): StoredResponse {
  return {
    status: 201,
    headers: [
      ['content-type', 'application/json'],
      ['location', '/charges/1'],
    ],
    body: new TextEncoder().encode('{"id":"ch_1"}'),
    ...over,
  };
}

type Outcome = FinishInput['outcome'];
export function finishOf(input: AdmitInput, outcome: Outcome, res: StoredResponse = response()): FinishInput {
  const base = { scope: input.scope, key: input.key, entity: input.entity, ownerToken: input.ownerToken, audit: input.audit };
  if (outcome === 'completed') return { ...base, outcome, response: res, retentionMs: input.retentionMs };
  return { ...base, outcome };
}

/** The command-log row of `input`'s outcome (DESIGN §4.1 `commands`), as the gateway's settle stage builds it. */
export function commandRowOf(input: AdmitInput, over: Partial<CommandInput> = {}): CommandInput {
  return {
    route: 'payments',
    scope: input.scope,
    entity: input.entity,
    fence: input.fence,
    idempotencyKey: input.key,
    outcome: 'completed',
    decision: 'forwarded',
    status: 201,
    upstreamMs: 12.5,
    audit: input.audit,
    ...over,
  };
}

async function commandsOf(store: GatewayStore, filter: Omit<CommandQuery, 'limit' | 'cursor'>): Promise<CommandRow[]> {
  const all: CommandRow[] = [];
  let cursor: string | undefined;
  for (;;) {
    const page = await store.listCommands({ ...filter, limit: 1000, cursor });
    all.push(...page.items);
    if (page.nextCursor === null) return all;
    cursor = page.nextCursor;
  }
}

async function rejectionsOf(store: GatewayStore, filter: { entity?: string; reason?: string; caller?: string; tool?: string }): Promise<RejectionRow[]> {
  const all: RejectionRow[] = [];
  let cursor: string | undefined;
  for (;;) {
    const page = await store.listRejections({ ...filter, limit: 1000, cursor });
    all.push(...page.items);
    if (page.nextCursor === null) return all;
    cursor = page.nextCursor;
  }
}

/** Store wrappers that switch one check off, for negative controls. */
export const broken = {
  /** Drops the fence: G1 is gone. */
  withoutFence: (store: GatewayStore): GatewayStore => wrap(store, (i) => ({ ...i, fence: null })),
  /** Drops the Idempotency-Key: G2 is gone. */
  withoutKey: (store: GatewayStore): GatewayStore => wrap(store, (i) => ({ ...i, key: null })),
  /** Forces concurrent mode: G3 is gone. */
  concurrent: (store: GatewayStore): GatewayStore => wrap(store, (i) => ({ ...i, mode: 'concurrent' })),
  /** Drops a release's `notBefore`: a reconciler's "not found" would release an attempt still in flight (DESIGN §3.12). */
  withoutNotBefore: (store: GatewayStore): GatewayStore =>
    new Proxy(store, {
      get(target, prop) {
        if (prop === 'resolveRecord')
          return (input: ResolveInput) =>
            target.resolveRecord({ ...input, resolution: input.resolution.outcome === 'released' ? { outcome: 'released' } : input.resolution });
        const v = Reflect.get(target, prop, target);
        return typeof v === 'function' ? v.bind(target) : v;
      },
    }),
  /**
   * The bound before the attempt's own lock end was kept (DESIGN §3.12): a
   * release with `notBefore` trusted once `legacyBoundMs` passed since the
   * record's created_at (its first admission), whatever lock its last
   * attempt was sent under. Read here with this process's clock; the point
   * is which time it measures from.
   */
  createdAtBound: (store: GatewayStore): GatewayStore =>
    new Proxy(store, {
      get(target, prop) {
        if (prop === 'resolveRecord')
          return async (input: ResolveInput) => {
            const r = input.resolution;
            if (r.outcome !== 'released' || r.notBefore === undefined) return target.resolveRecord(input);
            const rec = (await target.getRecords(input.key)).find((x) => x.scope === input.scope);
            if (rec !== undefined && rec.createdAt.getTime() + r.notBefore.legacyBoundMs > Date.now()) return { ok: false, reason: 'too-early' };
            return target.resolveRecord({ ...input, resolution: { outcome: 'released' } });
          };
        const v = Reflect.get(target, prop, target);
        return typeof v === 'function' ? v.bind(target) : v;
      },
    }),
};

function wrap(store: GatewayStore, edit: (input: AdmitInput) => AdmitInput): GatewayStore {
  return new Proxy(store, {
    get(target, prop) {
      if (prop === 'admit') return (input: AdmitInput) => target.admit(edit(input));
      if (prop === 'finish') return (input: FinishInput) => target.finish(edit(input as unknown as AdmitInput) as unknown as FinishInput);
      const v = Reflect.get(target, prop, target);
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
}

/** A deterministic shuffle (mulberry32), so a failure reproduces. */
export function shuffled<T>(items: T[], seed = 42): T[] {
  let a = seed >>> 0;
  const rnd = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(rnd() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

// ---------------------------------------------------------------------------
// Safety checks that return violations (used by the suite and its negative controls)

/**
 * G1, sequentially: after fence 5 completed a key, fence 4 is refused, both
 * with that key (no replay for a stale owner) and with a fresh one, and
 * both refusals are in the rejection log.
 */
export async function checkStaleFence(store: GatewayStore): Promise<string[]> {
  const v: string[] = [];
  const entity = `stale-${uid()}`;
  const key = `key-${uid()}`;
  const first = command({ entity, key, fence: 5n });
  const a = await store.admit(first);
  if (a.outcome !== 'forward') return [`fence 5 on a fresh entity: expected forward, got ${a.outcome}`];
  await store.finish(finishOf(first, 'completed'));
  const sameKey = await store.admit(command({ entity, key, fence: 4n }));
  if (sameKey.outcome !== 'stale-fence') v.push(`fence 4 after 5, same (completed) key: expected stale-fence, got ${sameKey.outcome}`);
  else if (sameKey.currentFence !== 5n) v.push(`stale-fence reported current fence ${sameKey.currentFence}, expected 5`);
  const fresh = await store.admit(command({ entity, fence: 4n }));
  if (fresh.outcome !== 'stale-fence') v.push(`fence 4 after 5, fresh key: expected stale-fence, got ${fresh.outcome}`);
  const logged = await rejectionsOf(store, { entity, reason: 'stale-fence' });
  if (logged.length !== 2) v.push(`expected 2 stale-fence rows in the rejection log, found ${logged.length}`);
  return v;
}

export interface FenceRaceResult {
  violations: string[];
  admitted: number;
  refused: number;
}

/**
 * G1 under real parallelism: `fences` (shuffled) are admitted by `workers`
 * concurrent callers on one entity. We cannot see commit order from outside,
 * but we can see real-time order: an admission that resolved `forward` has
 * committed, so any admission that STARTED after it resolved and carries a
 * lower fence must be refused. Also: every refusal names a current fence
 * above its own that was really admitted, every refusal is in the rejection
 * log, and the entity ends at the highest fence.
 */
export async function checkFenceRace(store: GatewayStore, fences: bigint[], workers = 8, entity = `race-${uid()}`): Promise<FenceRaceResult> {
  const v: string[] = [];
  let seq = 0;
  const results: { fence: bigint; start: number; end: number; admission: Admission }[] = [];
  const queue = [...fences];
  await Promise.all(
    Array.from({ length: workers }, async () => {
      for (let fence = queue.shift(); fence !== undefined; fence = queue.shift()) {
        const start = ++seq;
        const admission = await store.admit(command({ entity, fence, key: null, mode: 'concurrent' }));
        results.push({ fence, start, end: ++seq, admission });
      }
    }),
  );
  const admitted = results.filter((r) => r.admission.outcome === 'forward');
  const refused = results.filter((r) => r.admission.outcome === 'stale-fence');
  if (admitted.length + refused.length !== results.length) v.push('an admission answered neither forward nor stale-fence');
  const admittedFences = new Set(admitted.map((r) => r.fence));
  for (const a of admitted) {
    for (const b of results) {
      if (b.start > a.end && b.fence < a.fence && b.admission.outcome === 'forward') {
        v.push(`fence ${b.fence} was forwarded although fence ${a.fence} had been admitted before it started`);
      }
    }
  }
  for (const r of refused) {
    const current = (r.admission as { currentFence: bigint }).currentFence;
    if (!(current > r.fence)) v.push(`fence ${r.fence} refused with current fence ${current}, which is not higher`);
    if (!admittedFences.has(current)) v.push(`fence ${r.fence} refused with current fence ${current}, which was never admitted`);
  }
  const max = fences.reduce((m, f) => (f > m ? f : m), -1n);
  const info = await store.getEntity(entity);
  if (info?.fence !== max.toString()) v.push(`the entity ends at fence ${info?.fence ?? 'none'}, expected ${max}`);
  const logged = await rejectionsOf(store, { entity, reason: 'stale-fence' });
  if (logged.length !== refused.length) v.push(`${refused.length} refusals but ${logged.length} stale-fence rows in the log`);
  for (const row of logged) {
    if (!(BigInt(row.currentFence ?? '-1') > BigInt(row.presentedFence ?? '-1')))
      v.push(`rejection ${row.id}: presented ${row.presentedFence} not below current ${row.currentFence}`);
  }
  return { violations: [...new Set(v)], admitted: admitted.length, refused: refused.length };
}

/** G2 under real parallelism: `n` identical admissions of one key → exactly one forward, the rest in progress. */
export async function checkSingleForward(
  store: GatewayStore,
  n: number,
  over: Partial<AdmitInput> = {},
): Promise<{ violations: string[]; outcomes: Record<string, number>; winner: AdmitInput | null }> {
  const base = command(over);
  const outcomes: Record<string, number> = {};
  let winner: AdmitInput | null = null;
  await Promise.all(
    Array.from({ length: n }, async () => {
      const input = { ...base, ownerToken: `owner-${uid()}`, audit: audit() };
      const a = await store.admit(input);
      outcomes[a.outcome] = (outcomes[a.outcome] ?? 0) + 1;
      if (a.outcome === 'forward') winner = input;
    }),
  );
  const v: string[] = [];
  if (outcomes.forward !== 1) v.push(`${outcomes.forward ?? 0} of ${n} identical admissions were forwarded, expected exactly 1`);
  if ((outcomes['idempotency-in-progress'] ?? 0) !== n - 1) v.push(`expected ${n - 1} idempotency-in-progress, got ${JSON.stringify(outcomes)}`);
  return { violations: v, outcomes, winner };
}

/**
 * G3 under real parallelism: `workers` callers each push `rounds` requests
 * (distinct keys) through one serial entity, waiting on `waitForChange` when
 * busy. A caller counts itself in flight from its `forward` until just
 * before its finish, so a correct store never shows two at once.
 */
export async function checkSerialExclusive(
  store: GatewayStore,
  workers = 4,
  rounds = 5,
  entity = `serial-${uid()}`,
): Promise<{ violations: string[]; maxInFlight: number; forwarded: number }> {
  const v: string[] = [];
  let inFlight = 0;
  let maxInFlight = 0;
  let forwarded = 0;
  await Promise.all(
    Array.from({ length: workers }, async () => {
      for (let round = 0; round < rounds; round++) {
        const input = command({ entity, fence: null });
        for (let attempt = 0; ; attempt++) {
          if (attempt > 500) {
            v.push('a request never got the serial slot');
            return;
          }
          const a = await store.admit(input);
          if (a.outcome === 'forward') break;
          if (a.outcome !== 'entity-busy') {
            v.push(`unexpected ${a.outcome}`);
            return;
          }
          await store.waitForChange(entityTopic(entity), 1_000);
        }
        forwarded++;
        inFlight++;
        maxInFlight = Math.max(maxInFlight, inFlight);
        await sleep(1);
        inFlight--;
        await store.finish(finishOf(input, 'completed'));
      }
    }),
  );
  if (maxInFlight > 1) v.push(`${maxInFlight} requests were in flight upstream at once for one serial entity`);
  return { violations: v, maxInFlight, forwarded };
}

// ---------------------------------------------------------------------------
// The suite

/**
 * A resolution names the attempt the operator saw by its createdAt: after a
 * release, a retry with the key is admitted and also ends outcome_unknown
 * (a NEW record); resolving with the first attempt's createdAt must leave
 * that record alone. Returns the violations; `withCreatedAt: false` is the
 * negative control (the resolution names no attempt).
 */
export async function checkResolveAttempt(store: GatewayStore, withCreatedAt = true): Promise<string[]> {
  const violations: string[] = [];
  const first = command({ entity: null, fence: null, mode: 'concurrent' });
  const unknown = async (input: AdmitInput) => {
    if ((await store.admit(input)).outcome !== 'forward') violations.push('the attempt was not forwarded');
    await store.finish(finishOf(input, 'unknown'));
    const [rec] = await store.getRecords(input.key!);
    return rec!;
  };
  const seen = await unknown(first);
  const released = await store.resolveRecord({
    scope: first.scope,
    key: first.key!,
    createdAt: seen.createdAt,
    resolution: { outcome: 'released' },
    operator: 'ops',
    note: null,
    requestId: `req-${uid()}`,
  });
  if (!released.ok) violations.push(`resolving the attempt seen was refused: ${released.reason}`);
  await sleep(5); // another millisecond: the retry's created_at differs
  const retry = await unknown({ ...first, ownerToken: `owner-${uid()}`, audit: audit() });
  // What the store itself hands out is what a resolution names an attempt by.
  const listed = (await store.listRecords({ state: 'outcome_unknown', limit: 1000 })).items.find((r) => r.key === first.key);
  if (listed?.createdAt.getTime() !== retry.createdAt.getTime()) violations.push('listRecords and getRecords disagree on createdAt');
  for (const resolution of [{ outcome: 'released' } as const, { outcome: 'completed', response: response(), retentionMs: 60_000 } as const]) {
    const stale = await store.resolveRecord({
      scope: first.scope,
      key: first.key!,
      ...(withCreatedAt ? { createdAt: seen.createdAt } : {}),
      resolution,
      operator: 'ops',
      note: null,
      requestId: `req-${uid()}`,
    });
    if (stale.ok) violations.push(`a ${resolution.outcome} resolution of the stale attempt settled the retry's record`);
    else if (stale.reason !== 'changed' || stale.createdAt.getTime() !== retry.createdAt.getTime()) violations.push(`stale attempt: ${JSON.stringify(stale)}`);
    const now = await store.getRecords(first.key!);
    if (now.length !== 1 || now[0]!.state !== 'outcome_unknown' || now[0]!.createdAt.getTime() !== retry.createdAt.getTime()) {
      violations.push(`the retry's record was changed: ${JSON.stringify(now.map((r) => r.state))}`);
      return violations;
    }
  }
  const right = await store.resolveRecord({
    scope: first.scope,
    key: first.key!,
    createdAt: listed!.createdAt,
    resolution: { outcome: 'completed', response: response(), retentionMs: 60_000 },
    operator: 'ops',
    note: null,
    requestId: `req-${uid()}`,
  });
  if (!right.ok) violations.push(`resolving the retry by its own createdAt was refused: ${JSON.stringify(right)}`);
  if ((await store.getRecords(first.key!))[0]?.state !== 'completed') violations.push('the retry was not completed');
  const logged = (await store.listOperatorActions({ limit: 1000 })).items.filter((a) => a.key === first.key).map((a) => a.action);
  if (logged.join() !== 'resolve-completed,resolve-released') violations.push(`operator actions: ${logged.join()}`);
  return violations;
}

/** A reconciler's release of `input`'s record with `notBefore` (DESIGN §3.12), by the attempt (createdAt) as the store lists it now. */
async function releaseLater(store: GatewayStore, input: AdmitInput, notBefore: { settleMs: number; legacyBoundMs: number }) {
  const rec = (await store.getRecords(input.key!)).find((r) => r.scope === input.scope);
  return store.resolveRecord({
    scope: input.scope,
    key: input.key!,
    ...(rec === undefined ? {} : { createdAt: rec.createdAt }),
    resolution: { outcome: 'released', notBefore },
    operator: 'reconciler',
    note: null,
    requestId: `req-${uid()}`,
  });
}

/**
 * A reconciler's release (`notBefore`, DESIGN §3.12): asked for before the
 * database clock is `settleMs` past the attempt's own lock end, it is
 * `too-early`, the record stays outcome_unknown and nothing is logged; once
 * the attempt's lock end is old enough (attempt_until and created_at
 * backdated in SQL, convention 2) it is released and logged. Returns the
 * violations; `broken.withoutNotBefore` is the negative control.
 */
export async function checkNotBeforeRelease(store: GatewayStore, h: ConformanceHarness): Promise<string[]> {
  const violations: string[] = [];
  const input = command({ entity: null, fence: null, mode: 'concurrent' });
  if ((await store.admit(input)).outcome !== 'forward') violations.push('the attempt was not forwarded');
  await store.finish(finishOf(input, 'unknown'));
  const nb = { settleMs: 60_000, legacyBoundMs: 60_000 };
  const early = await releaseLater(store, input, nb);
  if (early.ok || early.reason !== 'too-early')
    violations.push(`a release before notBefore was not refused too-early: ${JSON.stringify(early.ok ? early.action.action : early)}`);
  const kept = await store.getRecords(input.key!);
  if (kept.length !== 1 || kept[0]!.state !== 'outcome_unknown')
    violations.push(`a release before notBefore changed the record: ${JSON.stringify(kept.map((r) => r.state))}`);
  const loggedEarly = (await store.listOperatorActions({ limit: 1000 })).items.filter((a) => a.key === input.key);
  if (loggedEarly.length !== 0) violations.push(`a release before notBefore was logged: ${loggedEarly.map((a) => a.action).join()}`);
  if (kept.length !== 1) return violations;
  // Two minutes pass.
  await h.backdate('idempotency_records', 'created_at', 120_000, { column: 'key', value: input.key! });
  await h.backdate('idempotency_records', 'attempt_until', 120_000, { column: 'key', value: input.key! });
  const late = await releaseLater(store, input, nb);
  if (!late.ok) violations.push(`a release past notBefore was refused: ${JSON.stringify(late)}`);
  else if (late.action.action !== 'resolve-released' || late.action.operator !== 'reconciler')
    violations.push(`logged as ${late.action.action} by ${late.action.operator}`);
  if ((await store.getRecords(input.key!)).length !== 0) violations.push('the record is still there after a release past notBefore');
  return violations;
}

/**
 * DESIGN §3.12, the not-found bound from the attempt itself: a record whose
 * last attempt was sent later than its created_at, or under a longer lock,
 * is never released before `settleMs` past THAT attempt's lock end, even
 * when its created_at plus the route's (shortened) bound has long passed.
 * Two such attempts: one whose lock was extended (`extendLock`, a long
 * upstream call), one taken over by a retry (onUnknown: retry, as a route
 * had before `reconcile` was given to it). Time passes by backdating
 * created_at and attempt_until in SQL. `broken.createdAtBound` (the bound
 * from created_at) is the negative control: it releases both too early.
 */
export async function checkAttemptBound(store: GatewayStore, h: ConformanceHarness): Promise<string[]> {
  const v: string[] = [];
  const pass = async (input: AdmitInput, ms: number) => {
    for (const column of ['created_at', 'attempt_until']) await h.backdate('idempotency_records', column, ms, { column: 'key', value: input.key! });
  };
  // The route's bound now: a 30 s lock (timeoutMs + lockMarginMs) and 30 s settle time.
  const nb = { settleMs: 30_000, legacyBoundMs: 60_000 };

  const extended = command({ entity: null, fence: null, mode: 'concurrent', lockMs: 30_000 });
  if ((await store.admit(extended)).outcome !== 'forward') return ['the extended attempt was not forwarded'];
  if (!(await store.extendLock({ scope: extended.scope, key: extended.key, owner: extended.ownerToken, ms: 600_000 }))) v.push('extendLock answered false');
  await store.finish(finishOf(extended, 'unknown'));
  await pass(extended, 120_000); // past created_at + 60 s, well within the extended lock's end + 30 s
  const r1 = await releaseLater(store, extended, nb);
  if (r1.ok || r1.reason !== 'too-early')
    v.push(`an extended attempt was released before its own lock end + settle: ${JSON.stringify(r1.ok ? 'released' : r1)}`);
  if ((await store.getRecords(extended.key!)).length === 1) {
    await pass(extended, 600_000);
    const r1late = await releaseLater(store, extended, nb);
    if (!r1late.ok) v.push(`the extended attempt past its own lock end + settle was not released: ${JSON.stringify(r1late)}`);
  }

  const first = command({ entity: null, fence: null, mode: 'concurrent', lockMs: SHORT, onUnknown: 'retry' });
  await store.admit(first);
  await sleep(PAST_EXPIRY_MS);
  await pass(first, 600_000); // the first attempt ten minutes ago
  const taker = command({ entity: null, fence: null, mode: 'concurrent', key: first.key, lockMs: 30_000, onUnknown: 'retry' });
  if ((await store.admit(taker)).outcome !== 'forward') return [...v, 'the takeover was not forwarded'];
  await store.finish(finishOf(taker, 'unknown'));
  await pass(first, 20_000); // 20 s after the takeover: its lock (30 s) has not even ended
  const r2 = await releaseLater(store, first, nb);
  if (r2.ok || r2.reason !== 'too-early')
    v.push(`a taken-over attempt was released before its own lock end + settle: ${JSON.stringify(r2.ok ? 'released' : r2)}`);
  if ((await store.getRecords(first.key!)).length === 1) {
    await pass(first, 60_000);
    const r2late = await releaseLater(store, first, nb);
    if (!r2late.ok) v.push(`the taken-over attempt past its own lock end + settle was not released: ${JSON.stringify(r2late)}`);
  }
  return v;
}

export async function checkExtendedLock(store: GatewayStore, h: ConformanceHarness, extend = true): Promise<string[]> {
  const v: string[] = [];
  const input = command({ lockMs: 30_000 });
  if ((await store.admit(input)).outcome !== 'forward') return ['the attempt was not forwarded'];
  if (extend) {
    const ok = await store.extendLock({ scope: input.scope, key: input.key, entity: input.entity, owner: input.ownerToken, ms: 600_000 });
    if (!ok) v.push('extendLock of a live attempt answered false');
  }
  // A minute passes (the lock and the slot backdated in SQL, convention 2):
  // past the admission's 30 s lock, within the extended 10 min.
  await h.backdate('idempotency_records', 'locked_until', 60_000, { column: 'key', value: input.key! });
  await h.backdate('fence_entities', 'inflight_until', 60_000, { column: 'entity', value: input.entity! });
  const retry = await store.admit({ ...input, ownerToken: `owner-${uid()}`, audit: audit() });
  if (retry.outcome !== 'idempotency-in-progress') v.push(`a retry after the admission's lock: expected idempotency-in-progress, got ${retry.outcome}`);
  const other = await store.admit(command({ entity: input.entity, fence: input.fence }));
  if (other.outcome !== 'entity-busy') v.push(`another request for the serial entity: expected entity-busy, got ${other.outcome}`);
  const done = await store.finish(finishOf(input, 'completed'));
  if (!done.recorded) v.push("the owner's finish after the extension was not recorded");
  return v;
}

export function describeGatewayStoreConformance(name: string, makeHarness: HarnessFactory): void {
  describe(`GatewayStore conformance: ${name}`, () => {
    let h: ConformanceHarness;
    let store: GatewayStore;
    beforeAll(async () => {
      h = await makeHarness();
      store = h.store;
    });
    afterAll(async () => {
      await store?.close();
      await store?.close(); // idempotent
      await h?.close();
    });

    describe('admission (DESIGN §3.5)', () => {
      it('b. a new key is forwarded and leaves an in_progress record with its lock and retention', async () => {
        const input = command({ fence: 7n, lockMs: 30_000, retentionMs: 3_600_000 });
        expect(await store.admit(input)).toEqual({ outcome: 'forward', takeover: false });
        const [rec, ...more] = await store.getRecords(input.key!);
        expect(more).toEqual([]);
        expect(rec).toMatchObject({
          scope: 'payments',
          key: input.key,
          state: 'in_progress',
          fingerprint: 'fp-1',
          entity: input.entity,
          fence: '7',
          status: null,
        });
        expect(rec!.lockedUntil!.getTime() - rec!.createdAt.getTime()).toBe(30_000);
        expect(rec!.expiresAt.getTime() - rec!.createdAt.getTime()).toBe(3_600_000);
        expect(rec).not.toHaveProperty('body');
      });

      it('a. an admitted fence becomes the entity fence; an equal fence is admitted again', async () => {
        const entity = `e-${uid()}`;
        expect((await store.admit(command({ entity, fence: 3n, mode: 'concurrent' }))).outcome).toBe('forward');
        expect((await store.admit(command({ entity, fence: 3n, mode: 'concurrent' }))).outcome).toBe('forward');
        expect((await store.admit(command({ entity, fence: 9n, mode: 'concurrent' }))).outcome).toBe('forward');
        const info = await store.getEntity(entity);
        expect(info).toMatchObject({ entity, fence: '9', inflight: null });
        expect(info!.acceptedAt).toBeInstanceOf(Date);
        expect(Number.isNaN(info!.acceptedAt.getTime())).toBe(false);
      });

      it('a. accepted_at moves when the fence is raised or an equal fence is forwarded, never on a refused admission', async () => {
        const HOUR = 3_600_000;
        const entity = `e-${uid()}`;
        const at = async () => (await store.getEntity(entity))!.acceptedAt.getTime();
        // Backdated an hour after each step, so that a move is plain whatever the clock's resolution.
        const backdate = async () => {
          await h.backdate('fence_entities', 'accepted_at', HOUR, { column: 'entity', value: entity });
          return at();
        };
        const first = command({ entity, fence: 5n, mode: 'concurrent' });
        expect((await store.admit(first)).outcome).toBe('forward');
        await store.finish(finishOf(first, 'completed'));
        let then = await backdate();
        // Refused at the current fence (the key's other request, its stored answer, a stale fence):
        // the fence was not accepted again, the time stays.
        expect((await store.admit(command({ entity, fence: 5n, key: first.key, fingerprint: 'fp-other', mode: 'concurrent' }))).outcome).toBe(
          'idempotency-key-reused',
        );
        expect((await store.admit(command({ entity, fence: 5n, key: first.key, mode: 'concurrent' }))).outcome).toBe('replay');
        expect((await store.admit(command({ entity, fence: 4n, mode: 'concurrent' }))).outcome).toBe('stale-fence');
        expect(await at()).toBe(then);
        // An equal fence forwarded: accepted again.
        expect((await store.admit(command({ entity, fence: 5n, mode: 'concurrent' }))).outcome).toBe('forward');
        expect(await at()).toBeGreaterThan(then + HOUR / 2);
        then = await backdate();
        // A raise: accepted.
        expect((await store.admit(command({ entity, fence: 6n, mode: 'concurrent' }))).outcome).toBe('forward');
        expect(await at()).toBeGreaterThan(then + HOUR / 2);
      });

      it('a. a stale fence is refused with the current fence and logged with every audit field', async () => {
        const entity = `e-${uid()}`;
        await store.admit(command({ entity, fence: 10n, mode: 'concurrent' }));
        const stale = command({
          entity,
          fence: 9n,
          audit: audit({ caller: 'worker-a', method: 'PUT', path: '/payments/x?y=1', payloadSha256: 'cd'.repeat(32), clientRequestId: 'client-9' }),
        });
        expect(await store.admit(stale)).toEqual({ outcome: 'stale-fence', currentFence: 10n });
        const [row, ...more] = await rejectionsOf(store, { entity });
        expect(more).toEqual([]);
        expect(row).toMatchObject({
          reason: 'stale-fence',
          entity,
          presentedFence: '9',
          currentFence: '10',
          idempotencyKey: stale.key,
          caller: 'worker-a',
          method: 'PUT',
          path: '/payments/x?y=1',
          payloadSha256: 'cd'.repeat(32),
          requestId: stale.audit.requestId,
          clientRequestId: 'client-9',
        });
        expect(row!.at).toBeInstanceOf(Date);
        expect(typeof row!.id).toBe('string');
        // A refusal writes no record and takes no slot.
        expect(await store.getRecords(stale.key!)).toEqual([]);
        expect((await store.getEntity(entity))!.inflight).toBeNull();
      });

      it('a. the fence check comes first: a stale fence gets no replay, a newer fence with a completed key does', async () => {
        expect(await checkStaleFence(store)).toEqual([]);
        const entity = `e-${uid()}`;
        const first = command({ entity, fence: 41n });
        await store.admit(first);
        await store.finish(finishOf(first, 'completed', response({ body: new TextEncoder().encode('paid') })));
        const w2 = await store.admit(command({ entity, key: first.key, fence: 42n }));
        expect(w2.outcome).toBe('replay');
        expect(new TextDecoder().decode((w2 as { response: StoredResponse }).response.body)).toBe('paid');
        expect((await store.getEntity(entity))!.fence).toBe('42');
        expect(await store.admit(command({ entity, key: first.key, fence: 41n }))).toEqual({ outcome: 'stale-fence', currentFence: 42n });
      });

      it('a. fences span 0 … 2^63−1', async () => {
        const entity = `e-${uid()}`;
        const max = 2n ** 63n - 1n;
        expect((await store.admit(command({ entity, fence: 0n, mode: 'concurrent' }))).outcome).toBe('forward');
        expect((await store.admit(command({ entity, fence: max, mode: 'concurrent' }))).outcome).toBe('forward');
        expect((await store.getEntity(entity))!.fence).toBe(max.toString());
        expect(await store.admit(command({ entity, fence: max - 1n, mode: 'concurrent' }))).toEqual({ outcome: 'stale-fence', currentFence: max });
        const [row] = await rejectionsOf(store, { entity });
        expect(row).toMatchObject({ presentedFence: (max - 1n).toString(), currentFence: max.toString() });
      });

      it('a. the fence is raised in the same transaction even when the request is then refused (busy, reused key)', async () => {
        const entity = `e-${uid()}`;
        const holder = command({ entity, fence: 1n });
        expect((await store.admit(holder)).outcome).toBe('forward');
        expect((await store.admit(command({ entity, fence: 2n }))).outcome).toBe('entity-busy');
        expect((await store.getEntity(entity))!.fence).toBe('2');
        expect((await store.admit(command({ entity, key: holder.key, fingerprint: 'other', fence: 3n }))).outcome).toBe('idempotency-key-reused');
        expect((await store.getEntity(entity))!.fence).toBe('3');
        // The holder's own owner is now stale for new commands.
        expect((await store.admit(command({ entity, fence: 1n }))).outcome).toBe('stale-fence');
      });

      it('c. a completed key with the same fingerprint replays status, headers and exact bytes', async () => {
        const every = new Uint8Array(256 * 3);
        for (let i = 0; i < every.length; i++) every[i] = (i * 7 + 3) % 256;
        const stored = response({
          status: 202,
          headers: [
            ['content-type', 'application/octet-stream'],
            ['etag', '"v1"'],
            ['x-multi', 'a, b'],
            ['location', '/ä/ü'],
          ],
          body: every,
        });
        const input = command();
        await store.admit(input);
        expect(await store.finish(finishOf(input, 'completed', stored))).toEqual({ recorded: true });
        for (let i = 0; i < 2; i++) {
          const replay = await store.admit({ ...input, ownerToken: `owner-${uid()}`, audit: audit() });
          expect(replay.outcome).toBe('replay');
          const res = (replay as { response: StoredResponse }).response;
          expect(res.status).toBe(202);
          expect(res.headers).toEqual(stored.headers);
          expect(res.body).toBeInstanceOf(Uint8Array);
          expect(Array.from(res.body)).toEqual(Array.from(every));
        }
        const [rec] = await store.getRecords(input.key!);
        expect(rec).toMatchObject({ state: 'completed', status: 202, lockedUntil: null });
      });

      it('c. an empty body and no headers replay as such', async () => {
        const input = command({ entity: null, fence: null });
        await store.admit(input);
        await store.finish(finishOf(input, 'completed', { status: 204, headers: [], body: new Uint8Array(0) }));
        const replay = await store.admit({ ...input, ownerToken: `owner-${uid()}` });
        expect(replay).toEqual({ outcome: 'replay', response: { status: 204, headers: [], body: new Uint8Array(0) } });
      });

      it('d. a known key with another fingerprint is refused and logged; the record is untouched', async () => {
        const input = command({ fence: 4n });
        await store.admit(input);
        const other = command({ entity: input.entity, key: input.key, fence: 4n, fingerprint: 'fp-other' });
        expect(await store.admit(other)).toEqual({ outcome: 'idempotency-key-reused' });
        const [row] = await rejectionsOf(store, { entity: input.entity! });
        expect(row).toMatchObject({
          reason: 'idempotency-key-reused',
          presentedFence: '4',
          currentFence: null,
          idempotencyKey: input.key,
          requestId: other.audit.requestId,
        });
        const [rec] = await store.getRecords(input.key!);
        expect(rec).toMatchObject({ state: 'in_progress', fingerprint: 'fp-1' });
        // Also against a completed record.
        await store.finish(finishOf(input, 'completed'));
        expect(await store.admit({ ...other, ownerToken: `owner-${uid()}` })).toEqual({ outcome: 'idempotency-key-reused' });
      });

      it('e. a key in progress with a live lock answers in-progress with a retry hint within the lock', async () => {
        const input = command({ lockMs: 20_000 });
        await store.admit(input);
        const again = await store.admit({ ...input, ownerToken: `owner-${uid()}`, audit: audit() });
        expect(again.outcome).toBe('idempotency-in-progress');
        const { retryAfterMs } = again as { retryAfterMs: number };
        expect(retryAfterMs).toBeGreaterThan(0);
        expect(retryAfterMs).toBeLessThanOrEqual(20_000);
        expect(await rejectionsOf(store, { entity: input.entity! })).toEqual([]);
        expect((await store.getRecords(input.key!))[0]!.state).toBe('in_progress');
      });

      it('f. a key in progress whose lock expired becomes outcome_unknown, refused and logged (onUnknown: reject)', async () => {
        const input = command({ lockMs: SHORT });
        await store.admit(input);
        await sleep(PAST_EXPIRY_MS);
        const retry = command({ entity: input.entity, key: input.key, fence: 1n });
        expect(await store.admit(retry)).toEqual({ outcome: 'outcome-unknown' });
        const [rec] = await store.getRecords(input.key!);
        expect(rec).toMatchObject({ state: 'outcome_unknown', lockedUntil: null });
        const [row] = await rejectionsOf(store, { entity: input.entity!, reason: 'outcome-unknown' });
        expect(row).toMatchObject({ idempotencyKey: input.key, presentedFence: '1', requestId: retry.audit.requestId });
        // And stays refused.
        expect(await store.admit({ ...retry, ownerToken: `owner-${uid()}` })).toEqual({ outcome: 'outcome-unknown' });
      });

      it("f+g. with onUnknown: retry an expired lock is taken over by the new owner; the old owner's finish is late", async () => {
        const first = command({ lockMs: SHORT, fence: 1n });
        await store.admit(first);
        await sleep(PAST_EXPIRY_MS);
        const second = command({ entity: first.entity, key: first.key, fence: 2n, onUnknown: 'retry' });
        expect(await store.admit(second)).toEqual({ outcome: 'forward', takeover: true });
        const [rec] = await store.getRecords(first.key!);
        expect(rec).toMatchObject({ state: 'in_progress', fence: '2' });
        expect(rec!.lockedUntil).not.toBeNull();
        // The new owner holds the record: a third caller sees it in progress.
        expect((await store.admit({ ...second, ownerToken: `owner-${uid()}` })).outcome).toBe('idempotency-in-progress');
        // The old owner wakes up: discarded and logged.
        expect(await store.finish(finishOf(first, 'completed', response({ body: new TextEncoder().encode('old') })))).toEqual({ recorded: false });
        const [late] = await rejectionsOf(store, { entity: first.entity!, reason: 'late-finish' });
        expect(late).toMatchObject({
          idempotencyKey: first.key,
          requestId: first.audit.requestId,
          clientRequestId: null,
          presentedFence: null,
          currentFence: null,
          method: 'POST',
        });
        expect((await store.getRecords(first.key!))[0]!.state).toBe('in_progress');
        // The new owner's finish lands.
        expect(await store.finish(finishOf(second, 'completed', response({ body: new TextEncoder().encode('new') })))).toEqual({ recorded: true });
        const replay = await store.admit({ ...second, ownerToken: `owner-${uid()}` });
        expect(new TextDecoder().decode((replay as { response: StoredResponse }).response.body)).toBe('new');
      });

      it('g. outcome_unknown is refused (reject) or taken over (retry) with a new owner token', async () => {
        const first = command();
        await store.admit(first);
        expect(await store.finish(finishOf(first, 'unknown'))).toEqual({ recorded: true });
        expect((await store.getRecords(first.key!))[0]).toMatchObject({ state: 'outcome_unknown', lockedUntil: null });
        expect(await store.admit(command({ entity: first.entity, key: first.key }))).toEqual({ outcome: 'outcome-unknown' });
        const taker = command({ entity: first.entity, key: first.key, onUnknown: 'retry' });
        expect(await store.admit(taker)).toEqual({ outcome: 'forward', takeover: true });
        // Only the new token finishes it.
        expect(await store.finish(finishOf(first, 'released'))).toEqual({ recorded: false });
        expect(await store.finish(finishOf(taker, 'completed'))).toEqual({ recorded: true });
        expect((await store.getRecords(first.key!))[0]!.state).toBe('completed');
      });

      it('g. a takeover that finds the entity busy leaves the record outcome_unknown for a later retry', async () => {
        const entity = `e-${uid()}`;
        const first = command({ entity });
        await store.admit(first);
        await store.finish(finishOf(first, 'unknown'));
        const holder = command({ entity });
        await store.admit(holder);
        expect((await store.admit(command({ entity, key: first.key, onUnknown: 'retry' }))).outcome).toBe('entity-busy');
        expect((await store.getRecords(first.key!))[0]!.state).toBe('outcome_unknown');
        await store.finish(finishOf(holder, 'completed'));
        expect(await store.admit(command({ entity, key: first.key, onUnknown: 'retry' }))).toEqual({ outcome: 'forward', takeover: true });
      });

      it('a late finish of a record only marked outcome_unknown (nobody took it over) completes it', async () => {
        const first = command({ lockMs: SHORT });
        await store.admit(first);
        await sleep(PAST_EXPIRY_MS);
        expect(await store.admit(command({ entity: first.entity, key: first.key }))).toEqual({ outcome: 'outcome-unknown' });
        expect(await store.finish(finishOf(first, 'completed', response({ body: new TextEncoder().encode('late') })))).toEqual({ recorded: true });
        const replay = await store.admit(command({ entity: first.entity, key: first.key }));
        expect(replay.outcome).toBe('replay');
        expect(new TextDecoder().decode((replay as { response: StoredResponse }).response.body)).toBe('late');
        expect(await rejectionsOf(store, { entity: first.entity!, reason: 'late-finish' })).toEqual([]);
      });

      it('a completed record past its retention is treated as absent', async () => {
        const input = command({ retentionMs: SHORT, entity: null, fence: null });
        await store.admit(input);
        await store.finish(finishOf(input, 'completed'));
        await sleep(PAST_EXPIRY_MS);
        const reuse = command({ key: input.key, entity: null, fence: null, fingerprint: 'fp-new' });
        expect(await store.admit(reuse)).toEqual({ outcome: 'forward', takeover: false });
        const [rec, ...more] = await store.getRecords(input.key!);
        expect(more).toEqual([]);
        expect(rec).toMatchObject({ state: 'in_progress', fingerprint: 'fp-new' });
      });

      it('h. serial mode: a second request for a busy entity is refused before any record is written', async () => {
        const entity = `e-${uid()}`;
        const holder = command({ entity, lockMs: 20_000 });
        expect((await store.admit(holder)).outcome).toBe('forward');
        const info = await store.getEntity(entity);
        expect(info!.inflight).not.toBeNull();
        expect(info!.inflight!.until).toBeInstanceOf(Date);
        const busy = command({ entity });
        const a = await store.admit(busy);
        expect(a.outcome).toBe('entity-busy');
        expect((a as { retryAfterMs: number }).retryAfterMs).toBeGreaterThan(0);
        expect((a as { retryAfterMs: number }).retryAfterMs).toBeLessThanOrEqual(20_000);
        expect(await store.getRecords(busy.key!)).toEqual([]);
        // Freed by the holder's finish.
        await store.finish(finishOf(holder, 'completed'));
        expect((await store.getEntity(entity))!.inflight).toBeNull();
        expect((await store.admit(busy)).outcome).toBe('forward');
      });

      it("h. only the holder frees the slot; a dead holder's expired slot is taken by the next request", async () => {
        const entity = `e-${uid()}`;
        const holder = command({ entity, lockMs: SHORT });
        await store.admit(holder);
        const stranger = command({ entity });
        // A finish by someone who never held the slot changes nothing.
        expect(await store.finish(finishOf(stranger, 'released'))).toEqual({ recorded: false });
        await sleep(PAST_EXPIRY_MS);
        expect((await store.getEntity(entity))!.inflight).toBeNull();
        const next = command({ entity, lockMs: 20_000 });
        expect((await store.admit(next)).outcome).toBe('forward');
        // The dead holder's late finish does not free the new holder's slot.
        await store.finish(finishOf(holder, 'completed'));
        expect((await store.admit(command({ entity }))).outcome).toBe('entity-busy');
      });

      it('h. concurrent mode takes no slot', async () => {
        const entity = `e-${uid()}`;
        expect((await store.admit(command({ entity, mode: 'concurrent' }))).outcome).toBe('forward');
        expect((await store.admit(command({ entity, mode: 'concurrent' }))).outcome).toBe('forward');
        expect((await store.getEntity(entity))!.inflight).toBeNull();
      });

      it('without a key: forwarded with no record, still fenced and serialised', async () => {
        const entity = `e-${uid()}`;
        const first = command({ entity, key: null, fence: 5n });
        expect(await store.admit(first)).toEqual({ outcome: 'forward', takeover: false });
        expect((await store.admit(command({ entity, key: null, fence: 6n }))).outcome).toBe('entity-busy');
        expect((await store.admit(command({ entity, key: null, fence: 4n }))).outcome).toBe('stale-fence');
        expect(await store.finish(finishOf(first, 'completed'))).toEqual({ recorded: true });
        expect((await store.admit(command({ entity, key: null, fence: 6n }))).outcome).toBe('forward');
      });

      it('without a fence: serial mode keeps a fence-less entity row for the slot; a fence raises it later', async () => {
        const entity = `e-${uid()}`;
        const first = command({ entity, fence: null });
        expect((await store.admit(first)).outcome).toBe('forward');
        expect(await store.getEntity(entity)).toMatchObject({ entity, fence: null });
        expect((await store.admit(command({ entity, fence: null }))).outcome).toBe('entity-busy');
        await store.finish(finishOf(first, 'completed'));
        expect((await store.admit(command({ entity, fence: 0n }))).outcome).toBe('forward');
        expect((await store.getEntity(entity))!.fence).toBe('0');
      });

      it('without an entity: idempotency only, no entity row', async () => {
        const input = command({ entity: null, fence: null });
        expect((await store.admit(input)).outcome).toBe('forward');
        expect((await store.admit({ ...input, ownerToken: `owner-${uid()}` })).outcome).toBe('idempotency-in-progress');
        expect(await store.finish(finishOf(input, 'completed'))).toEqual({ recorded: true });
        expect((await store.admit({ ...input, ownerToken: `owner-${uid()}` })).outcome).toBe('replay');
      });

      it('a refusal on an entity nobody used leaves no entity row behind', async () => {
        // A record made without an entity, then replayed / refused for an entity in serial mode.
        const input = command({ entity: null, fence: null });
        await store.admit(input);
        const entity = `e-${uid()}`;
        expect((await store.admit({ ...input, entity, ownerToken: `owner-${uid()}` })).outcome).toBe('idempotency-in-progress');
        expect((await store.admit({ ...input, entity, fingerprint: 'x', ownerToken: `owner-${uid()}` })).outcome).toBe('idempotency-key-reused');
        await store.finish(finishOf(input, 'completed'));
        expect((await store.admit({ ...input, entity, ownerToken: `owner-${uid()}` })).outcome).toBe('replay');
        expect(await store.getEntity(entity)).toBeNull();
      });

      it('scopes keep keys apart; any text (U+0000, private use, quotes, non-ASCII) round-trips', async () => {
        const key = `k\u0000'"\\\uE000\uE0000é😀-${uid()}`;
        const entity = `ent\u0000\uE000'"\\ü-${uid()}`;
        const a = command({ key, entity, scope: 'payments\u0000caller-1', audit: audit({ caller: 'caller\u00001', path: '/p?q=\u0000' }) });
        const b = command({ key, entity: null, fence: null, scope: 'payments\u0000caller-2', fingerprint: 'fp-b' });
        expect((await store.admit(a)).outcome).toBe('forward');
        expect((await store.admit(b)).outcome).toBe('forward');
        const recs = await store.getRecords(key);
        expect(recs.map((r) => [r.scope, r.key, r.entity, r.fingerprint])).toEqual([
          ['payments\u0000caller-1', key, entity, 'fp-1'],
          ['payments\u0000caller-2', key, null, 'fp-b'],
        ]);
        expect((await store.getEntity(entity))!.entity).toBe(entity);
        expect(
          await store.admit(command({ key, entity, scope: 'payments\u0000caller-1', fence: 0n, audit: audit({ caller: 'caller\u00001' }) })),
        ).toMatchObject({ outcome: 'stale-fence' });
        const [row] = await rejectionsOf(store, { entity, caller: 'caller\u00001' });
        expect(row).toMatchObject({ entity, idempotencyKey: key, caller: 'caller\u00001' });
        await store.finish(finishOf(a, 'completed', response({ headers: [['x-odd', 'v\uE000é']] })));
        const replay = await store.admit({ ...a, ownerToken: `owner-${uid()}` });
        expect((replay as { response: StoredResponse }).response.headers).toEqual([['x-odd', 'v\uE000é']]);
      });
    });

    describe('finish (DESIGN §3.7)', () => {
      it('released deletes the record and frees the slot: the same key may be sent again', async () => {
        const input = command();
        await store.admit(input);
        expect(await store.finish(finishOf(input, 'released'))).toEqual({ recorded: true });
        expect(await store.getRecords(input.key!)).toEqual([]);
        expect((await store.getEntity(input.entity!))!.inflight).toBeNull();
        expect((await store.admit({ ...input, ownerToken: `owner-${uid()}` })).outcome).toBe('forward');
      });

      it('unknown keeps the record as outcome_unknown and frees the slot', async () => {
        const input = command();
        await store.admit(input);
        expect(await store.finish(finishOf(input, 'unknown'))).toEqual({ recorded: true });
        expect((await store.getRecords(input.key!))[0]).toMatchObject({ state: 'outcome_unknown' });
        expect((await store.getEntity(input.entity!))!.inflight).toBeNull();
        expect((await store.admit(command({ entity: input.entity }))).outcome).toBe('forward');
      });

      it('completed sets the replay retention from the finish', async () => {
        const input = command({ retentionMs: 1_000 });
        await store.admit(input);
        await store.finish({ ...finishOf(input, 'completed'), retentionMs: 7_200_000 } as FinishInput);
        const [rec] = await store.getRecords(input.key!);
        expect(rec!.expiresAt.getTime() - rec!.createdAt.getTime()).toBeGreaterThanOrEqual(7_200_000);
      });

      it('a finish with a token that does not own the record is discarded and logged', async () => {
        const input = command();
        await store.admit(input);
        const impostor = { ...input, ownerToken: `owner-${uid()}`, audit: audit({ caller: 'ghost' }) };
        expect(await store.finish(finishOf(impostor, 'completed'))).toEqual({ recorded: false });
        expect(await store.finish(finishOf(impostor, 'released'))).toEqual({ recorded: false });
        expect(await store.finish(finishOf(impostor, 'unknown'))).toEqual({ recorded: false });
        const rows = await rejectionsOf(store, { entity: input.entity!, reason: 'late-finish' });
        expect(rows).toHaveLength(3);
        expect(rows[0]).toMatchObject({ caller: 'ghost', idempotencyKey: input.key, entity: input.entity });
        expect((await store.getRecords(input.key!))[0]).toMatchObject({ state: 'in_progress' });
        expect((await store.getEntity(input.entity!))!.inflight).not.toBeNull();
        // A finish of a record that no longer exists is late too.
        await store.finish(finishOf(input, 'released'));
        expect(await store.finish(finishOf(input, 'completed'))).toEqual({ recorded: false });
      });

      it('a keyless finish records nothing and is always recorded: true', async () => {
        const input = command({ key: null });
        await store.admit(input);
        expect(await store.finish(finishOf(input, 'unknown'))).toEqual({ recorded: true });
        expect((await store.getEntity(input.entity!))!.inflight).toBeNull();
      });
    });

    describe('extendLock (DESIGN §3.6)', () => {
      const extend = (input: AdmitInput, ms: number, over: { owner?: string; entity?: string | null } = {}) =>
        store.extendLock({
          scope: input.scope,
          key: input.key,
          entity: over.entity === undefined ? input.entity : over.entity,
          owner: over.owner ?? input.ownerToken,
          ms,
        });

      it("moves a live attempt's lock and its serial slot to database now + ms; never shortens them", async () => {
        const input = command({ lockMs: 30_000 });
        await store.admit(input);
        const [before] = await store.getRecords(input.key!);
        const slotBefore = (await store.getEntity(input.entity!))!.inflight!.until.getTime();
        expect(await extend(input, 600_000)).toBe(true);
        const [after] = await store.getRecords(input.key!);
        expect(after!.state).toBe('in_progress');
        expect(after!.lockedUntil!.getTime()).toBeGreaterThanOrEqual(before!.createdAt.getTime() + 600_000);
        const slot = (await store.getEntity(input.entity!))!.inflight!.until.getTime();
        expect(slot).toBeGreaterThanOrEqual(slotBefore + 500_000);
        // A shorter extension keeps the longer lock: greatest of the two.
        expect(await extend(input, 1)).toBe(true);
        expect((await store.getRecords(input.key!))[0]!.lockedUntil!.getTime()).toBe(after!.lockedUntil!.getTime());
        expect((await store.getEntity(input.entity!))!.inflight!.until.getTime()).toBe(slot);
        // Only the lock: the record's retention and creation stay.
        expect((await store.getRecords(input.key!))[0]).toMatchObject({ createdAt: before!.createdAt, expiresAt: before!.expiresAt });
      });

      it('false, and nothing moves, for another owner token', async () => {
        const input = command({ lockMs: 30_000 });
        await store.admit(input);
        const [before] = await store.getRecords(input.key!);
        const slot = (await store.getEntity(input.entity!))!.inflight!.until.getTime();
        expect(await extend(input, 600_000, { owner: `owner-${uid()}` })).toBe(false);
        expect((await store.getRecords(input.key!))[0]!.lockedUntil).toEqual(before!.lockedUntil);
        expect((await store.getEntity(input.entity!))!.inflight!.until.getTime()).toBe(slot);
      });

      it('false once the attempt is finished (completed, unknown, released) or resolved', async () => {
        for (const outcome of ['completed', 'unknown', 'released'] as const) {
          const input = command();
          await store.admit(input);
          await store.finish(finishOf(input, outcome));
          expect(await extend(input, 600_000), outcome).toBe(false);
          if (outcome === 'unknown') expect((await store.getRecords(input.key!))[0]).toMatchObject({ state: 'outcome_unknown', lockedUntil: null });
        }
      });

      it('false for the attempt taken over; true for the new owner', async () => {
        const first = command({ lockMs: SHORT });
        await store.admit(first);
        await sleep(PAST_EXPIRY_MS);
        const second = command({ entity: first.entity, key: first.key, onUnknown: 'retry' });
        expect(await store.admit(second)).toEqual({ outcome: 'forward', takeover: true });
        expect(await extend(first, 600_000)).toBe(false);
        expect(await extend(second, 600_000)).toBe(true);
      });

      it('an expired lock is never revived: false, and a retry still finds the attempt dead', async () => {
        const input = command({ lockMs: SHORT });
        await store.admit(input);
        await sleep(PAST_EXPIRY_MS);
        expect(await extend(input, 600_000)).toBe(false);
        expect(await store.admit(command({ entity: input.entity, key: input.key }))).toEqual({ outcome: 'outcome-unknown' });
      });

      it('a keyless serial request: its slot alone; another owner or no slot: false', async () => {
        const input = command({ key: null, lockMs: 30_000 });
        await store.admit(input);
        const slot = (await store.getEntity(input.entity!))!.inflight!.until.getTime();
        expect(await extend(input, 600_000, { owner: `owner-${uid()}` })).toBe(false);
        expect(await extend(input, 600_000)).toBe(true);
        expect((await store.getEntity(input.entity!))!.inflight!.until.getTime()).toBeGreaterThanOrEqual(slot + 500_000);
        expect(await extend(input, 600_000, { entity: null })).toBe(false);
        await store.finish(finishOf(input, 'completed'));
        expect(await extend(input, 600_000)).toBe(false);
      });

      it('a retry and another request for the entity stay refused past the admission lock; the owner still finishes', async () => {
        expect(await checkExtendedLock(store, h)).toEqual([]);
      });
    });

    describe('an interim answer of an outcome_unknown record (DESIGN §3.7)', () => {
      const interimOf = (text: string): StoredResponse => ({
        status: 202,
        headers: [
          ['content-type', 'application/json'],
          ['location', '/operations/op_1'],
        ],
        body: new TextEncoder().encode(text),
      });
      const text = (r: StoredResponse | null | undefined) => (r == null ? null : new TextDecoder().decode(r.body));

      it('kept with the record: every retry answers outcome-unknown carrying it; getInterim reads it for that attempt only', async () => {
        const input = command();
        await store.admit(input);
        const interim = interimOf('{"operation":"op_1","status":"running"}');
        expect(await store.finish({ ...finishOf(input, 'unknown'), interim } as FinishInput)).toEqual({ recorded: true });
        const [rec] = await store.getRecords(input.key!);
        expect(rec).toMatchObject({ state: 'outcome_unknown', lockedUntil: null, interim: true });
        expect(rec).not.toHaveProperty('body');
        const listed = (await store.listRecords({ state: 'outcome_unknown', limit: 1000 })).items.find((r) => r.key === input.key);
        expect(listed?.interim).toBe(true);
        for (let i = 0; i < 2; i++) {
          const again = await store.admit(command({ entity: input.entity, key: input.key }));
          expect(again.outcome).toBe('outcome-unknown');
          const got = (again as { interim?: StoredResponse }).interim;
          expect(got?.status).toBe(202);
          expect(got?.headers).toEqual(interim.headers);
          expect(text(got)).toBe('{"operation":"op_1","status":"running"}');
        }
        // Still logged as outcome-unknown refusals (G5).
        expect(await rejectionsOf(store, { entity: input.entity!, reason: 'outcome-unknown' })).toHaveLength(2);
        const ref = { scope: input.scope, key: input.key!, createdAt: rec!.createdAt };
        expect(text(await store.getInterim(ref))).toBe('{"operation":"op_1","status":"running"}');
        expect(await store.getInterim({ ...ref, createdAt: new Date(rec!.createdAt.getTime() - 1) })).toBeNull();
        expect(await store.getInterim({ ...ref, scope: 'elsewhere' })).toBeNull();
      });

      it('without an interim nothing is carried; an unknown finish without one drops one kept before', async () => {
        const input = command({ entity: null, fence: null, mode: 'concurrent' });
        await store.admit(input);
        await store.finish(finishOf(input, 'unknown'));
        const [rec] = await store.getRecords(input.key!);
        expect(rec!.interim).toBe(false);
        expect(await store.admit(command({ entity: null, fence: null, key: input.key }))).toEqual({ outcome: 'outcome-unknown' });
        expect(await store.getInterim({ scope: input.scope, key: input.key!, createdAt: rec!.createdAt })).toBeNull();
        // The owner's finish may still say more: first an interim, then none.
        await store.finish({ ...finishOf(input, 'unknown'), interim: interimOf('x') } as FinishInput);
        expect((await store.getRecords(input.key!))[0]!.interim).toBe(true);
        await store.finish(finishOf(input, 'unknown'));
        expect((await store.getRecords(input.key!))[0]!.interim).toBe(false);
        expect(await store.admit(command({ entity: null, fence: null, key: input.key }))).toEqual({ outcome: 'outcome-unknown' });
      });

      it('carried only until interimRetentionMs (database clock); the record stays outcome_unknown', async () => {
        const input = command();
        await store.admit(input);
        await store.finish({ ...finishOf(input, 'unknown'), interim: interimOf('soon gone'), interimRetentionMs: SHORT } as FinishInput);
        await sleep(PAST_EXPIRY_MS);
        const [rec] = await store.getRecords(input.key!);
        expect(rec).toMatchObject({ state: 'outcome_unknown', interim: false });
        expect(await store.admit(command({ entity: input.entity, key: input.key }))).toEqual({ outcome: 'outcome-unknown' });
        expect(await store.getInterim({ scope: input.scope, key: input.key!, createdAt: rec!.createdAt })).toBeNull();
        const long = command();
        await store.admit(long);
        await store.finish({ ...finishOf(long, 'unknown'), interim: interimOf('kept'), interimRetentionMs: 600_000 } as FinishInput);
        const [kept] = await store.getRecords(long.key!);
        expect(kept!.interim).toBe(true);
        expect(kept!.expiresAt.getTime()).toBeGreaterThanOrEqual(kept!.createdAt.getTime() + 600_000 - 1);
      });

      it('resolved completed: the final answer replaces it; released: the record goes', async () => {
        for (const resolution of ['completed', 'released'] as const) {
          const input = command({ entity: null, fence: null, mode: 'concurrent' });
          await store.admit(input);
          await store.finish({ ...finishOf(input, 'unknown'), interim: interimOf('interim') } as FinishInput);
          const [rec] = await store.getRecords(input.key!);
          const resolved = await store.resolveRecord({
            scope: input.scope,
            key: input.key!,
            createdAt: rec!.createdAt,
            resolution:
              resolution === 'completed' ? { outcome: 'completed', response: response({ status: 200 }), retentionMs: 60_000 } : { outcome: 'released' },
            operator: 'ops',
            note: null,
            requestId: `req-${uid()}`,
          });
          expect(resolved.ok).toBe(true);
          const next = await store.admit({ ...input, ownerToken: `owner-${uid()}`, audit: audit() });
          if (resolution === 'completed') {
            expect(next.outcome).toBe('replay');
            const replayed = (next as { response: StoredResponse }).response;
            expect([replayed.status, text(replayed)]).toEqual([200, '{"id":"ch_1"}']);
            expect((await store.getRecords(input.key!))[0]).toMatchObject({ state: 'completed', interim: false });
          } else expect(next).toEqual({ outcome: 'forward', takeover: false });
          expect(await store.getInterim({ scope: input.scope, key: input.key!, createdAt: rec!.createdAt })).toBeNull();
        }
      });

      it("the owner's late completed finish replaces it; a takeover drops it", async () => {
        const input = command({ entity: null, fence: null, mode: 'concurrent' });
        await store.admit(input);
        await store.finish({ ...finishOf(input, 'unknown'), interim: interimOf('interim') } as FinishInput);
        expect(await store.finish(finishOf(input, 'completed'))).toEqual({ recorded: true });
        const replay = await store.admit(command({ entity: null, fence: null, key: input.key }));
        expect(text((replay as { response: StoredResponse }).response)).toBe('{"id":"ch_1"}');

        const first = command({ entity: null, fence: null, mode: 'concurrent' });
        await store.admit(first);
        await store.finish({ ...finishOf(first, 'unknown'), interim: interimOf('interim') } as FinishInput);
        const taker = command({ entity: null, fence: null, key: first.key, onUnknown: 'retry' });
        expect(await store.admit(taker)).toEqual({ outcome: 'forward', takeover: true });
        expect((await store.getRecords(first.key!))[0]).toMatchObject({ state: 'in_progress', status: null, interim: false });
        await store.finish(finishOf(taker, 'unknown'));
        expect(await store.admit(command({ entity: null, fence: null, key: first.key }))).toEqual({ outcome: 'outcome-unknown' });
      });
    });

    describe('command log (DESIGN §4.1 commands)', () => {
      it('a finish writes its row with every field, in its transaction; the outcome names the record', async () => {
        const input = command({ fence: 42n, audit: audit({ caller: 'alice', clientRequestId: 'client-1', tool: null }) });
        await store.admit(input);
        const finish = finishOf(input, 'completed');
        finish.command = commandRowOf(input);
        expect(await store.finish(finish)).toEqual({ recorded: true });
        const rows = await commandsOf(store, { entity: input.entity! });
        expect(rows).toHaveLength(1);
        expect(rows[0]).toMatchObject({
          route: 'payments',
          method: 'POST',
          // Never the query string: the gateway hands the normal path; the store keeps what it is given, bounded.
          path: input.audit.path,
          entity: input.entity,
          fence: '42',
          idempotencyKey: input.key,
          scope: input.scope,
          caller: 'alice',
          tool: null,
          outcome: 'completed',
          decision: 'forwarded',
          status: 201,
          upstreamMs: 12.5,
          requestId: input.audit.requestId,
          clientRequestId: 'client-1',
          payloadSha256: input.audit.payloadSha256,
        });
        expect(rows[0]!.at).toBeInstanceOf(Date);
        expect(Math.abs(rows[0]!.at.getTime() - Date.now())).toBeLessThan(60_000);
      });

      it('released (502 upstream-unavailable) and outcome_unknown (504 upstream-timeout) rows carry their status', async () => {
        const entity = `e-${uid()}`;
        const a = command({ entity });
        await store.admit(a);
        const fa = finishOf(a, 'released');
        fa.command = commandRowOf(a, { outcome: 'released', decision: 'upstream-unavailable', status: 502, upstreamMs: null });
        await store.finish(fa);
        const b = command({ entity });
        await store.admit(b);
        const fb = finishOf(b, 'unknown');
        fb.command = commandRowOf(b, { outcome: 'outcome_unknown', decision: 'upstream-timeout', status: 504 });
        await store.finish(fb);
        const rows = await commandsOf(store, { entity });
        // Newest first.
        expect(rows.map((r) => [r.outcome, r.status, r.decision, r.upstreamMs])).toEqual([
          ['outcome_unknown', 504, 'upstream-timeout', 12.5],
          ['released', 502, 'upstream-unavailable', null],
        ]);
      });

      it('a late finish (taken over or resolved) writes its row as late-finish, beside its rejection', async () => {
        const input = command();
        await store.admit(input);
        const impostor = { ...input, ownerToken: `owner-${uid()}` };
        const f = finishOf(impostor, 'completed');
        f.command = commandRowOf(impostor);
        expect(await store.finish(f)).toEqual({ recorded: false });
        const rows = await commandsOf(store, { key: input.key! });
        expect(rows.map((r) => r.outcome)).toEqual(['late-finish']);
      });

      it('a keyless finish writes its row too; a finish without a row writes none', async () => {
        const keyless = command({ key: null });
        await store.admit(keyless);
        const f = finishOf(keyless, 'completed');
        f.command = commandRowOf(keyless, { scope: keyless.scope });
        await store.finish(f);
        expect((await commandsOf(store, { entity: keyless.entity! })).map((r) => [r.outcome, r.idempotencyKey])).toEqual([['completed', null]]);
        const silent = command();
        await store.admit(silent);
        await store.finish(finishOf(silent, 'completed'));
        expect(await commandsOf(store, { entity: silent.entity! })).toEqual([]);
      });

      it('finishes that arrive together (one group) each write their own row', async () => {
        const entity = `e-${uid()}`;
        const inputs = Array.from({ length: 12 }, (_, i) => command({ entity, mode: 'concurrent', fence: BigInt(i + 1) }));
        for (const i of inputs) expect((await store.admit(i)).outcome).toBe('forward');
        await Promise.all(
          inputs.map((i, n) => {
            const f = finishOf(i, n % 3 === 0 ? 'unknown' : 'completed');
            f.command = commandRowOf(i, n % 3 === 0 ? { outcome: 'outcome_unknown', decision: 'upstream-timeout', status: 504 } : {});
            return store.finish(f);
          }),
        );
        const rows = await commandsOf(store, { entity });
        expect(rows).toHaveLength(12);
        expect(new Set(rows.map((r) => r.requestId))).toEqual(new Set(inputs.map((i) => i.audit.requestId)));
        expect(rows.filter((r) => r.status === 504)).toHaveLength(4);
      });

      it('recordCommand writes a row of its own (entity-busy, payload-too-large: no finish)', async () => {
        const entity = `e-${uid()}`;
        const busy = command({ entity });
        await store.recordCommand(commandRowOf(busy, { scope: null, outcome: 'entity-busy', decision: 'entity-busy', status: 409, upstreamMs: null }));
        const big = command({ entity, key: null, fence: null });
        await store.recordCommand(
          commandRowOf(big, { scope: null, outcome: 'payload-too-large', decision: 'payload-too-large', status: 413, upstreamMs: null }),
        );
        const rows = await commandsOf(store, { entity });
        expect(rows.map((r) => [r.outcome, r.status, r.scope, r.fence])).toEqual([
          ['payload-too-large', 413, null, null],
          ['entity-busy', 409, null, '1'],
        ]);
      });

      it('filters by entity, key, route, caller and time, and pages newest first by a cursor', async () => {
        const entity = `e-${uid()}`;
        const inputs = Array.from({ length: 5 }, (_, i) => command({ entity, audit: audit({ caller: i % 2 === 0 ? 'even' : 'odd' }) }));
        for (const [n, i] of inputs.entries()) await store.recordCommand(commandRowOf(i, { route: n < 2 ? 'refunds' : 'payments' }));
        expect(await commandsOf(store, { entity })).toHaveLength(5);
        expect((await commandsOf(store, { key: inputs[3]!.key! })).map((r) => r.requestId)).toEqual([inputs[3]!.audit.requestId]);
        expect(await commandsOf(store, { entity, route: 'refunds' })).toHaveLength(2);
        expect(await commandsOf(store, { entity, caller: 'even' })).toHaveLength(3);
        expect(await commandsOf(store, { entity, since: new Date(Date.now() + 3_600_000) })).toHaveLength(0);
        expect(await commandsOf(store, { entity, until: new Date(Date.now() + 3_600_000) })).toHaveLength(5);
        const first = await store.listCommands({ entity, limit: 2 });
        expect(first.items.map((r) => r.requestId)).toEqual([inputs[4]!.audit.requestId, inputs[3]!.audit.requestId]);
        const second = await store.listCommands({ entity, limit: 2, cursor: first.nextCursor! });
        expect(second.items.map((r) => r.requestId)).toEqual([inputs[2]!.audit.requestId, inputs[1]!.audit.requestId]);
        const last = await store.listCommands({ entity, limit: 2, cursor: second.nextCursor! });
        expect(last.items).toHaveLength(1);
        expect(last.nextCursor).toBeNull();
      });

      it('keeps NUL in an entity and a scope (entityScope caller, keyScope) as it was given, and bounds the text', async () => {
        const entity = `alice\u0000e-${uid()}`;
        const input = command({ entity, scope: 'payments\u0000alice', audit: audit({ path: `/p/${'x'.repeat(5000)}` }) });
        await store.recordCommand(commandRowOf(input));
        const [row] = await commandsOf(store, { entity });
        expect(row).toMatchObject({ entity, scope: 'payments\u0000alice' });
        expect(row!.path).toHaveLength(LIMITS.path);
        expect(row!.path!.endsWith(CUT_MARKER)).toBe(true);
      });

      it('the sweeper deletes rows older than commandRetention, and only with it', async () => {
        const entity = `e-${uid()}`;
        for (let i = 0; i < 3; i++) await store.recordCommand(commandRowOf(command({ entity })));
        const keep = `e-${uid()}`;
        await store.recordCommand(commandRowOf(command({ entity: keep })));
        await h.backdate('commands', 'at', 7_200_000, { column: 'entity', value: entity });
        // Without a command retention the log is kept.
        await store.sweep({ rejectionRetentionMs: 3_600_000 });
        expect(await commandsOf(store, { entity })).toHaveLength(3);
        const r = await store.sweep({ rejectionRetentionMs: 3_600_000, commandRetentionMs: 3_600_000, batch: 2 });
        expect(r.oldCommands).toBeGreaterThanOrEqual(3);
        expect(r.backlog.oldCommands).toBe(0);
        expect(await commandsOf(store, { entity })).toEqual([]);
        expect(await commandsOf(store, { entity: keep })).toHaveLength(1);
      });
    });

    describe('rejection log', () => {
      it('recordRejection keeps every field (refusals decided before admission)', async () => {
        const entity = `e-${uid()}`;
        const a = audit({ caller: 'svc', method: 'DELETE', path: '/x/y?z', payloadSha256: 'ef'.repeat(32), clientRequestId: 'their-id-1' });
        await store.recordRejection({
          reason: 'invalid-fence-signature',
          entity,
          presentedFence: 2n ** 63n - 1n,
          currentFence: null,
          idempotencyKey: 'k-1',
          audit: a,
        });
        await store.recordRejection({
          reason: 'unauthorized',
          entity,
          presentedFence: null,
          currentFence: 3n,
          idempotencyKey: null,
          audit: { ...a, caller: null },
        });
        const [second, first] = await rejectionsOf(store, { entity });
        expect(first).toMatchObject({
          reason: 'invalid-fence-signature',
          entity,
          presentedFence: (2n ** 63n - 1n).toString(),
          currentFence: null,
          idempotencyKey: 'k-1',
          caller: 'svc',
          method: 'DELETE',
          path: '/x/y?z',
          payloadSha256: 'ef'.repeat(32),
          requestId: a.requestId,
          clientRequestId: 'their-id-1',
        });
        expect(second).toMatchObject({ reason: 'unauthorized', presentedFence: null, currentFence: '3', idempotencyKey: null, caller: null });
        expect(first!.detail ?? null).toBeNull();
        expect(BigInt(second!.id)).toBeGreaterThan(BigInt(first!.id));
        expect(second!.at.getTime()).toBeGreaterThanOrEqual(first!.at.getTime());
      });

      it('recordRejection keeps the detail, and stores an empty payload hash (body never read) as null', async () => {
        const entity = `e-${uid()}`;
        await store.recordRejection({
          reason: 'unauthorized',
          entity,
          presentedFence: null,
          currentFence: null,
          idempotencyKey: null,
          audit: audit({ payloadSha256: '' }),
          detail: 'missing scope fencegate:proxy',
        });
        const [row] = await rejectionsOf(store, { entity });
        expect(row).toMatchObject({ payloadSha256: null, detail: 'missing scope fencegate:proxy' });
      });

      it('pages newest first with a keyset cursor, and filters by entity, reason, caller, since, until', async () => {
        const entity = `e-${uid()}`;
        const caller = `c-${uid()}`;
        const reasons = ['stale-fence', 'fence-expired', 'stale-fence', 'forbidden', 'stale-fence', 'fence-expired', 'unauthorized'] as const;
        for (const [i, reason] of reasons.entries()) {
          await store.recordRejection({
            reason,
            entity,
            presentedFence: BigInt(i),
            currentFence: null,
            idempotencyKey: null,
            audit: audit({ caller: i % 2 === 0 ? caller : null }),
          });
          if (i === 3) await sleep(5);
        }
        const all = await rejectionsOf(store, { entity });
        expect(all.map((r) => r.presentedFence)).toEqual(['6', '5', '4', '3', '2', '1', '0']);
        // Pages of 2: no gaps, no repeats, a null cursor at the end.
        const seen: string[] = [];
        let cursor: string | undefined;
        let pages = 0;
        do {
          const page = await store.listRejections({ entity, limit: 2, cursor });
          expect(page.items.length).toBeLessThanOrEqual(2);
          seen.push(...page.items.map((r) => r.id));
          cursor = page.nextCursor ?? undefined;
          pages++;
        } while (cursor !== undefined);
        expect(seen).toEqual(all.map((r) => r.id));
        expect(pages).toBe(4);
        // An exact last page has no next cursor.
        const exact = await store.listRejections({ entity, limit: 7 });
        expect(exact.items).toHaveLength(7);
        expect(exact.nextCursor).toBeNull();
        expect((await store.listRejections({ entity, limit: 1 })).items.map((r) => r.id)).toEqual([all[0]!.id]);

        expect((await rejectionsOf(store, { entity, reason: 'stale-fence' })).map((r) => r.presentedFence)).toEqual(['4', '2', '0']);
        expect((await rejectionsOf(store, { entity, caller })).map((r) => r.presentedFence)).toEqual(['6', '4', '2', '0']);
        expect((await rejectionsOf(store, { entity, reason: 'fence-expired', caller })).map((r) => r.presentedFence)).toEqual([]);

        const pivot = all.find((r) => r.presentedFence === '4')!.at;
        const since = await store.listRejections({ entity, since: pivot, limit: 100 });
        expect(since.items.map((r) => r.id)).toEqual(all.filter((r) => r.at.getTime() >= pivot.getTime()).map((r) => r.id));
        expect(since.items.length).toBeGreaterThanOrEqual(3);
        const until = await store.listRejections({ entity, until: pivot, limit: 100 });
        expect(until.items.map((r) => r.id)).toEqual(all.filter((r) => r.at.getTime() < pivot.getTime()).map((r) => r.id));
        expect(until.items.length + since.items.length).toBe(7);
        const unknown = await store.listRejections({ entity: `e-${uid()}`, limit: 10 });
        expect(unknown).toEqual({ items: [], nextCursor: null });
      });
    });

    describe('rejection log: the MCP tool (DESIGN §4 rejections.tool)', () => {
      it('an admission refusal and recordRejection keep audit.tool; the tool filter finds them, never a row without one', async () => {
        const entity = `e-${uid()}`;
        const tool = `charge-${uid()}`;
        expect((await store.admit(command({ entity, fence: 5n, mode: 'concurrent' }))).outcome).toBe('forward');
        // stale-fence inside the admission, once from a tools/call and once from a plain route
        expect((await store.admit(command({ entity, fence: 4n, audit: audit({ tool }) }))).outcome).toBe('stale-fence');
        expect((await store.admit(command({ entity, fence: 3n, audit: audit() }))).outcome).toBe('stale-fence');
        await store.recordRejection({
          reason: 'invalid-fence-signature',
          entity,
          presentedFence: null,
          currentFence: null,
          idempotencyKey: null,
          audit: audit({ tool, payloadSha256: '' }),
        });
        await store.recordRejection({
          reason: 'missing-fence',
          entity,
          presentedFence: null,
          currentFence: null,
          idempotencyKey: null,
          audit: audit({ tool: null }),
        });
        const all = await rejectionsOf(store, { entity });
        expect(all.map((r) => [r.reason, r.tool])).toEqual([
          ['missing-fence', null],
          ['invalid-fence-signature', tool],
          ['stale-fence', null],
          ['stale-fence', tool],
        ]);
        const byTool = await rejectionsOf(store, { tool });
        expect(byTool.map((r) => [r.reason, r.presentedFence])).toEqual([
          ['invalid-fence-signature', null],
          ['stale-fence', '4'],
        ]);
        expect(byTool.every((r) => r.entity === entity)).toBe(true);
        expect(await rejectionsOf(store, { entity, tool: `other-${uid()}` })).toEqual([]);
        expect((await rejectionsOf(store, { entity, reason: 'stale-fence', tool })).map((r) => r.presentedFence)).toEqual(['4']);
      });
    });

    describe('getEntity / getRecords', () => {
      it('unknown entity and key: null and []', async () => {
        expect(await store.getEntity(`nobody-${uid()}`)).toBeNull();
        expect(await store.getRecords(`nothing-${uid()}`)).toEqual([]);
      });

      it('getRecords lists a key across scopes, ordered by scope, without the stored body', async () => {
        const key = `shared-${uid()}`;
        for (const scope of ['zeta', 'alpha', 'mid']) {
          const input = command({ key, scope, entity: null, fence: null, fingerprint: `fp-${scope}` });
          await store.admit(input);
          if (scope === 'mid') await store.finish(finishOf(input, 'completed', response({ status: 200 })));
        }
        const recs = await store.getRecords(key);
        expect(recs.map((r) => [r.scope, r.state, r.status, r.fingerprint])).toEqual([
          ['alpha', 'in_progress', null, 'fp-alpha'],
          ['mid', 'completed', 200, 'fp-mid'],
          ['zeta', 'in_progress', null, 'fp-zeta'],
        ]);
        for (const r of recs)
          expect(Object.keys(r).sort()).toEqual([
            'attemptUntil',
            'createdAt',
            'entity',
            'expiresAt',
            'fence',
            'fingerprint',
            'interim',
            'key',
            'lockedUntil',
            'requestId',
            'scope',
            'state',
            'status',
          ]);
      });
    });

    describe('resolveRecord: the attempt the operator saw (createdAt)', () => {
      it('a stale createdAt settles nothing and keeps the later attempt; its own createdAt resolves it', async () => {
        expect(await checkResolveAttempt(store)).toEqual([]);
      });
    });

    describe('resolveRecord: a release not before a time (the reconciler, DESIGN §3.12)', () => {
      it('too early by the database clock: refused, unchanged, unlogged; past it: released and logged', async () => {
        expect(await checkNotBeforeRelease(store, h)).toEqual([]);
      });

      it("measured from the attempt's own lock end: an extended or taken-over attempt is never released early", async () => {
        expect(await checkAttemptBound(store, h)).toEqual([]);
      });

      it('a record that keeps no lock end of its attempt (written before it was kept) is weighed from its created_at', async () => {
        const input = command({ entity: null, fence: null, mode: 'concurrent' });
        await store.admit(input);
        await store.finish(finishOf(input, 'unknown'));
        await h.forgetAttempt(input.key!);
        expect((await store.getRecords(input.key!))[0]).toMatchObject({ attemptUntil: null, requestId: null });
        // settleMs 0 would trust it at once; the fallback from created_at holds it back.
        const early = await releaseLater(store, input, { settleMs: 0, legacyBoundMs: 60_000 });
        expect(early).toEqual({ ok: false, reason: 'too-early' });
        await h.backdate('idempotency_records', 'created_at', 120_000, { column: 'key', value: input.key! });
        expect((await releaseLater(store, input, { settleMs: 0, legacyBoundMs: 60_000 })).ok).toBe(true);
      });
    });

    describe("noteReconcile: the reconciler's last answer (DESIGN §3.12)", () => {
      it('kept with this attempt, by the database clock, the last one wins; listed by listRecords and getRecords', async () => {
        const input = command({ entity: null, fence: null, mode: 'concurrent' });
        await store.admit(input);
        await store.finish(finishOf(input, 'unknown'));
        const [rec] = await store.getRecords(input.key!);
        expect(rec).not.toHaveProperty('lastReconcile');
        const ref = { scope: input.scope, key: input.key!, createdAt: rec!.createdAt };
        await store.noteReconcile({ ...ref, result: 'not-yet-trusted' });
        const [first] = await store.getRecords(input.key!);
        expect(first!.lastReconcile?.result).toBe('not-yet-trusted');
        expect(first!.lastReconcile!.at.getTime()).toBeGreaterThanOrEqual(rec!.createdAt.getTime());
        await store.noteReconcile({ ...ref, result: 'error' });
        const [second] = await store.getRecords(input.key!);
        expect(second!.lastReconcile?.result).toBe('error');
        expect(second!.lastReconcile!.at.getTime()).toBeGreaterThanOrEqual(first!.lastReconcile!.at.getTime());
        const listed = (await store.listRecords({ state: 'outcome_unknown', limit: 1000 })).items.find((r) => r.key === input.key);
        expect(listed?.lastReconcile).toEqual(second!.lastReconcile);
        // Only what it says: the record is otherwise as it was.
        expect(second).toMatchObject({ state: 'outcome_unknown', createdAt: rec!.createdAt, attemptUntil: rec!.attemptUntil });
      });

      it('a no-op for another attempt (createdAt), another scope, a record not outcome_unknown, or no record', async () => {
        const input = command({ entity: null, fence: null, mode: 'concurrent' });
        await store.admit(input);
        const [live] = await store.getRecords(input.key!);
        const ref = { scope: input.scope, key: input.key!, createdAt: live!.createdAt };
        await store.noteReconcile({ ...ref, result: 'unknown' });
        expect((await store.getRecords(input.key!))[0]).not.toHaveProperty('lastReconcile');
        await store.finish(finishOf(input, 'unknown'));
        await store.noteReconcile({ ...ref, createdAt: new Date(live!.createdAt.getTime() - 1), result: 'unknown' });
        await store.noteReconcile({ ...ref, scope: 'elsewhere', result: 'unknown' });
        await store.noteReconcile({ ...ref, key: `none-${uid()}`, result: 'unknown' });
        expect((await store.getRecords(input.key!))[0]).not.toHaveProperty('lastReconcile');
      });
    });

    describe("the attempt's lock end and request id (DESIGN §3.12)", () => {
      it('written with every lock (admission, extendLock, takeover), kept once the outcome is unknown', async () => {
        const input = command({ lockMs: 30_000 });
        await store.admit(input);
        const [admitted] = await store.getRecords(input.key!);
        expect(admitted!.attemptUntil).not.toBeNull();
        expect(admitted!.attemptUntil).toEqual(admitted!.lockedUntil);
        expect(admitted!.requestId).toBe(input.audit.requestId);
        await store.extendLock({ scope: input.scope, key: input.key, entity: input.entity, owner: input.ownerToken, ms: 600_000 });
        const [extended] = await store.getRecords(input.key!);
        expect(extended!.attemptUntil).toEqual(extended!.lockedUntil);
        expect(extended!.attemptUntil!.getTime()).toBeGreaterThan(admitted!.attemptUntil!.getTime());
        await store.finish(finishOf(input, 'unknown'));
        expect((await store.getRecords(input.key!))[0]).toMatchObject({
          lockedUntil: null,
          attemptUntil: extended!.attemptUntil,
          requestId: input.audit.requestId,
        });
        const taker = command({ entity: input.entity, key: input.key, onUnknown: 'retry' });
        await store.admit(taker);
        const [taken] = await store.getRecords(input.key!);
        expect(taken!.requestId).toBe(taker.audit.requestId);
        expect(taken!.attemptUntil).toEqual(taken!.lockedUntil);
        expect(taken!.createdAt).toEqual(admitted!.createdAt);
      });

      it("a crashed attempt's expired lock, found by a retry or by the sweeper, stays its lock end", async () => {
        for (const by of ['retry', 'sweep'] as const) {
          const input = command({ lockMs: SHORT, entity: null, fence: null, mode: 'concurrent' });
          await store.admit(input);
          const [admitted] = await store.getRecords(input.key!);
          await sleep(PAST_EXPIRY_MS);
          if (by === 'retry') expect((await store.admit({ ...input, ownerToken: `owner-${uid()}`, audit: audit() })).outcome).toBe('outcome-unknown');
          else await store.sweep({ rejectionRetentionMs: 86_400_000 });
          const [rec] = await store.getRecords(input.key!);
          expect(rec, by).toMatchObject({ state: 'outcome_unknown', lockedUntil: null, attemptUntil: admitted!.lockedUntil, requestId: input.audit.requestId });
        }
      });

      it('a record written before they were kept takes its lock end from the lock when its outcome becomes unknown', async () => {
        const input = command({ entity: null, fence: null, mode: 'concurrent', lockMs: 30_000 });
        await store.admit(input);
        const [admitted] = await store.getRecords(input.key!);
        await h.forgetAttempt(input.key!);
        await store.finish(finishOf(input, 'unknown'));
        expect((await store.getRecords(input.key!))[0]).toMatchObject({ attemptUntil: admitted!.lockedUntil, requestId: null });
      });
    });

    describe('sweep', () => {
      it('deletes expired completed records, turns dead in_progress locks into outcome_unknown, keeps live ones', async () => {
        const expired = command({ retentionMs: SHORT, entity: null, fence: null });
        const kept = command({ entity: null, fence: null });
        const dead = command({ lockMs: SHORT, entity: null, fence: null });
        const alive = command({ entity: null, fence: null });
        for (const c of [expired, kept, dead, alive]) expect((await store.admit(c)).outcome).toBe('forward');
        await store.finish(finishOf(expired, 'completed'));
        await store.finish(finishOf(kept, 'completed'));
        await sleep(PAST_EXPIRY_MS);
        const r = await store.sweep({ rejectionRetentionMs: 3_600_000 });
        expect(r.expiredRecords).toBeGreaterThanOrEqual(1);
        expect(r.unknownRecords).toBeGreaterThanOrEqual(1);
        expect(await store.getRecords(expired.key!)).toEqual([]);
        expect((await store.getRecords(kept.key!))[0]!.state).toBe('completed');
        expect((await store.getRecords(dead.key!))[0]).toMatchObject({ state: 'outcome_unknown', lockedUntil: null });
        expect((await store.getRecords(alive.key!))[0]!.state).toBe('in_progress');
        // G4: the dead one now answers outcome-unknown instead of waiting forever.
        expect(await store.admit({ ...dead, ownerToken: `owner-${uid()}` })).toEqual({ outcome: 'outcome-unknown' });
        // Nothing left to do.
        const again = await store.sweep({ rejectionRetentionMs: 3_600_000 });
        expect(again.expiredRecords + again.unknownRecords).toBe(0);
      });

      it('deletes rejections older than the retention (rows backdated), one batch per call with maxBatches: 1', async () => {
        const entity = `e-${uid()}`;
        for (let i = 0; i < 5; i++) {
          await store.recordRejection({ reason: 'fence-expired', entity, presentedFence: BigInt(i), currentFence: null, idempotencyKey: null, audit: audit() });
        }
        const rows = await rejectionsOf(store, { entity });
        const old = rows.filter((r) => Number(r.presentedFence) < 3).map((r) => r.id);
        await h.backdateRejections(old, 2 * 3_600_000);
        let deleted = 0;
        for (let i = 0; i < 20; i++) {
          const r = await store.sweep({ rejectionRetentionMs: 3_600_000, batch: 1, maxBatches: 1 });
          expect(r.oldRejections).toBeLessThanOrEqual(1);
          deleted += r.oldRejections;
          if (r.oldRejections === 0) break;
        }
        expect(deleted).toBeGreaterThanOrEqual(3);
        expect((await rejectionsOf(store, { entity })).map((r) => r.presentedFence)).toEqual(['4', '3']);
      });

      it('batches record sweeps too (maxBatches: 1)', async () => {
        const inputs = Array.from({ length: 3 }, () => command({ lockMs: SHORT, entity: null, fence: null }));
        for (const c of inputs) await store.admit(c);
        await sleep(PAST_EXPIRY_MS);
        for (let i = 0; i < 50; i++) {
          const r = await store.sweep({ rejectionRetentionMs: 3_600_000, batch: 1, maxBatches: 1 });
          expect(r.unknownRecords).toBeLessThanOrEqual(1);
          expect(r.expiredRecords).toBeLessThanOrEqual(1);
          if (r.unknownRecords + r.expiredRecords === 0) break;
        }
        for (const c of inputs) expect((await store.getRecords(c.key!))[0]!.state).toBe('outcome_unknown');
      });

      /** N rows past retention of each record kind and of rejections, on a fresh entity; returns what to look for. */
      async function pastRetention(n: number) {
        const entity = `backlog-${uid()}`;
        const expired = Array.from({ length: n }, () => command({ entity: null, fence: null, retentionMs: SHORT }));
        const dead = Array.from({ length: n }, () => command({ entity: null, fence: null, lockMs: SHORT }));
        for (const c of expired) {
          await store.admit(c);
          await store.finish(finishOf(c, 'completed'));
        }
        for (const c of dead) await store.admit(c);
        for (let i = 0; i < n; i++) {
          await store.recordRejection({ reason: 'fence-expired', entity, presentedFence: BigInt(i), currentFence: null, idempotencyKey: null, audit: audit() });
        }
        await h.backdateRejections(
          (await rejectionsOf(store, { entity })).map((r) => r.id),
          2 * 3_600_000,
        );
        await sleep(PAST_EXPIRY_MS);
        return { entity, expired, dead };
      }
      const HOUR = 3_600_000;

      it('one sweep works through batch after batch until a batch comes back short; nothing is left behind', async () => {
        const { entity, expired, dead } = await pastRetention(25);
        const r = await store.sweep({ rejectionRetentionMs: HOUR, batch: 10 });
        // 25 rows of each kind in batches of 10: at least 3 batches each, the last one short.
        expect(r.expiredRecords).toBeGreaterThanOrEqual(25);
        expect(r.unknownRecords).toBeGreaterThanOrEqual(25);
        expect(r.oldRejections).toBeGreaterThanOrEqual(25);
        expect(r.batches).toBeGreaterThanOrEqual(9);
        expect(r.backlog).toEqual({
          expiredRecords: 0,
          unknownRecords: 0,
          oldRejections: 0,
          oldEntities: 0,
          oldFenceHistory: 0,
          oldOperatorActions: 0,
          oldCommands: 0,
        });
        for (const c of expired) expect(await store.getRecords(c.key!)).toEqual([]);
        for (const c of dead) expect((await store.getRecords(c.key!))[0]!.state).toBe('outcome_unknown');
        expect(await rejectionsOf(store, { entity })).toEqual([]);
      });

      it('negative control: one batch per kind (the old sweep) leaves rows past retention, and the backlog counts them', async () => {
        const { entity } = await pastRetention(25);
        const r = await store.sweep({ rejectionRetentionMs: HOUR, batch: 10, maxBatches: 1 });
        expect([r.expiredRecords, r.unknownRecords, r.oldRejections]).toEqual([10, 10, 10]);
        expect(r.backlog.expiredRecords).toBeGreaterThanOrEqual(15);
        expect(r.backlog.unknownRecords).toBeGreaterThanOrEqual(15);
        expect(r.backlog.oldRejections).toBeGreaterThanOrEqual(15);
        expect(await rejectionsOf(store, { entity })).toHaveLength(15);
        // The next full sweep catches up.
        const rest = await store.sweep({ rejectionRetentionMs: HOUR, batch: 10 });
        expect(Object.values(rest.backlog)).toEqual([0, 0, 0, 0, 0, 0, 0]);
        expect(await rejectionsOf(store, { entity })).toEqual([]);
      });

      it('a spent time budget stops after one batch per kind and reports the backlog it left', async () => {
        const { entity } = await pastRetention(25);
        const r = await store.sweep({ rejectionRetentionMs: HOUR, batch: 10, timeBudgetMs: 0 });
        expect(r.batches).toBe(3);
        expect(r.oldRejections).toBe(10);
        expect(r.backlog.oldRejections).toBeGreaterThanOrEqual(15);
        expect(r.backlog.expiredRecords).toBeGreaterThanOrEqual(15);
        expect(r.backlog.unknownRecords).toBeGreaterThanOrEqual(15);
        expect(await rejectionsOf(store, { entity })).toHaveLength(15);
        await store.sweep({ rejectionRetentionMs: HOUR });
      });

      it('entityRetention: forgets an entity and its history once its last accepted fence is older, unless its serial slot is live', async () => {
        const done = command({ entity: `gone-${uid()}`, fence: 5n });
        const busy = command({ entity: `busy-${uid()}`, fence: 5n });
        const dead = command({ entity: `dead-${uid()}`, fence: 5n, lockMs: SHORT });
        const fresh = command({ entity: `fresh-${uid()}`, fence: 5n });
        for (const c of [done, busy, dead, fresh]) expect((await store.admit(c)).outcome).toBe('forward');
        await store.finish(finishOf(done, 'completed'));
        await store.finish(finishOf(fresh, 'completed'));
        for (const c of [done, busy, dead]) {
          await h.backdate('fence_entities', 'accepted_at', 2 * HOUR, { column: 'entity', value: c.entity! });
          await h.backdate('fence_history', 'at', 2 * HOUR, { column: 'entity', value: c.entity! });
        }
        await sleep(PAST_EXPIRY_MS); // dead's slot (its gateway died) has expired
        // Without entityRetentionMs nothing is forgotten.
        await store.sweep({ rejectionRetentionMs: HOUR });
        expect((await store.getEntity(done.entity!))?.fence).toBe('5');

        const r = await store.sweep({ rejectionRetentionMs: HOUR, entityRetentionMs: HOUR, batch: 1 });
        expect(r.oldEntities).toBeGreaterThanOrEqual(2);
        expect(r.oldFenceHistory).toBeGreaterThanOrEqual(3);
        expect(r.backlog.oldEntities).toBe(0);
        expect(await store.getEntity(done.entity!)).toBeNull();
        expect(await store.getEntity(dead.entity!)).toBeNull();
        // A request in flight holds the slot: its entity stays, with its fence.
        expect(await store.getEntity(busy.entity!)).toMatchObject({ fence: '5', inflight: { until: expect.any(Date) } });
        expect(await store.admit(command({ entity: busy.entity, fence: 4n }))).toEqual({ outcome: 'stale-fence', currentFence: 5n });
        expect((await store.getEntity(fresh.entity!))?.fence).toBe('5');
        if (store.getFenceHistory) {
          expect((await store.getFenceHistory(done.entity!, { limit: 10 })).items).toEqual([]);
          expect((await store.getFenceHistory(busy.entity!, { limit: 10 })).items).toEqual([]); // history is kept by age alone
          expect((await store.getFenceHistory(fresh.entity!, { limit: 10 })).items.map((x) => x.fence)).toEqual(['5']);
        }
        // What forgetting means (docs/configuration.md, entityRetention): the entity is open
        // again to any fence, an older one included.
        expect((await store.admit(command({ entity: done.entity, fence: 1n, mode: 'concurrent' }))).outcome).toBe('forward');
      });

      it('operatorActionRetention: deletes operator actions older than it, and only with the option', async () => {
        if (!store.resolveRecord || !store.listOperatorActions) return;
        const input = command({ entity: null, fence: null });
        await store.admit(input);
        await store.finish(finishOf(input, 'unknown'));
        const resolved = await store.resolveRecord({
          scope: input.scope,
          key: input.key!,
          resolution: { outcome: 'released' },
          operator: 'ops',
          note: null,
          requestId: `req-${uid()}`,
        });
        expect(resolved.ok).toBe(true);
        const mine = async () => (await store.listOperatorActions!({ limit: 1000 })).items.filter((a) => a.key === input.key);
        expect(await mine()).toHaveLength(1);
        await h.backdate('operator_actions', 'at', 2 * HOUR, { column: 'key', value: input.key! });
        await store.sweep({ rejectionRetentionMs: HOUR });
        expect(await mine()).toHaveLength(1);
        const r = await store.sweep({ rejectionRetentionMs: HOUR, operatorActionRetentionMs: HOUR });
        expect(r.oldOperatorActions).toBeGreaterThanOrEqual(1);
        expect(await mine()).toEqual([]);
      });
    });

    describe('bounded rejection rows (src/store/bounds.ts)', () => {
      const long = (c: string, n: number) => c.repeat(n);
      const expectCut = (value: string | null | undefined, whole: string, max: number) => {
        expect(whole.length).toBeGreaterThan(max); // the input was over the limit, so an unbounded store fails below
        expect(value).toBe(cutText(whole, max));
        expect(value!.length).toBeLessThanOrEqual(max);
        expect(value!.endsWith(CUT_MARKER)).toBe(true);
      };

      it('recordRejection cuts every text field at its limit, with a visible marker', async () => {
        const entity = long('e', 600);
        const a = audit({
          path: `/payments/${long('p', 20_000)}`,
          caller: long('c', 1000),
          method: long('M', 100),
          requestId: long('r', 300),
          clientRequestId: long('x', 300),
          tool: long('t', 300),
        });
        await store.recordRejection({
          reason: 'unauthorized',
          entity,
          presentedFence: null,
          currentFence: null,
          idempotencyKey: long('k', 400),
          audit: a,
          detail: long('d', 5000),
        });
        const [row] = await rejectionsOf(store, { entity: cutText(entity, LIMITS.entity) });
        expectCut(row!.tool, a.tool!, LIMITS.tool);
        expectCut(row!.path, a.path, LIMITS.path);
        expectCut(row!.caller, a.caller!, LIMITS.caller);
        expectCut(row!.method, a.method, LIMITS.method);
        expectCut(row!.requestId, a.requestId, LIMITS.requestId);
        expectCut(row!.clientRequestId, a.clientRequestId!, LIMITS.clientRequestId);
        expectCut(row!.idempotencyKey, long('k', 400), LIMITS.idempotencyKey);
        expectCut(row!.entity, entity, LIMITS.entity);
        expectCut(row!.detail, long('d', 5000), LIMITS.detail);
      });

      it('values within the limits are kept whole', async () => {
        const entity = `e-${uid()}`.padEnd(LIMITS.entity, 'e');
        const a = audit({ path: '/p'.padEnd(LIMITS.path, 'p'), caller: 'c'.repeat(LIMITS.caller), clientRequestId: 'x'.repeat(LIMITS.clientRequestId) });
        await store.recordRejection({
          reason: 'forbidden',
          entity,
          presentedFence: null,
          currentFence: null,
          idempotencyKey: 'k'.repeat(LIMITS.idempotencyKey),
          audit: a,
          detail: 'd'.repeat(LIMITS.detail),
        });
        const [row] = await rejectionsOf(store, { entity });
        expect(row).toMatchObject({
          entity,
          path: a.path,
          caller: a.caller,
          clientRequestId: a.clientRequestId,
          idempotencyKey: 'k'.repeat(LIMITS.idempotencyKey),
          detail: 'd'.repeat(LIMITS.detail),
        });
      });

      it('admission and finish rows are cut the same way; the decision uses the whole entity and key', async () => {
        const entity = `${uid()}-${long('e', 600)}`;
        const key = `${uid()}-${long('k', 300)}`;
        const logged = cutText(entity, LIMITS.entity);
        const a = audit({ path: `/payments/${long('p', 9000)}`, caller: long('c', 500), clientRequestId: long('x', 200), tool: long('t', 200) });
        expect((await store.admit(command({ entity, key, fence: 5n, mode: 'concurrent', audit: a }))).outcome).toBe('forward');
        // stale-fence, written inside the admission
        expect(await store.admit(command({ entity, fence: 4n, audit: a }))).toEqual({ outcome: 'stale-fence', currentFence: 5n });
        // idempotency-key-reused, also inside the admission
        expect((await store.admit(command({ entity, key, fence: 5n, fingerprint: 'other', mode: 'concurrent', audit: a }))).outcome).toBe(
          'idempotency-key-reused',
        );
        const rows = await rejectionsOf(store, { entity: logged });
        expect(rows.map((r) => r.reason).sort()).toEqual(['idempotency-key-reused', 'stale-fence']);
        for (const row of rows) {
          expectCut(row.entity, entity, LIMITS.entity);
          expectCut(row.path, a.path, LIMITS.path);
          expectCut(row.caller, a.caller!, LIMITS.caller);
          expectCut(row.clientRequestId, a.clientRequestId!, LIMITS.clientRequestId);
          expectCut(row.tool, a.tool!, LIMITS.tool);
        }
        expectCut(rows.find((r) => r.reason === 'idempotency-key-reused')!.idempotencyKey, key, LIMITS.idempotencyKey);
        // The fence and the record belong to the whole values.
        expect((await store.getEntity(entity))?.fence).toBe('5');
        expect(await store.getEntity(logged)).toBeNull();
        expect((await store.getRecords(key)).map((r) => r.state)).toEqual(['in_progress']);

        // late-finish, written by the finish
        const first = command({ entity, key: `${uid()}-${long('q', 300)}`, fence: 5n, lockMs: SHORT, mode: 'concurrent', audit: a });
        await store.admit(first);
        await sleep(PAST_EXPIRY_MS);
        expect((await store.admit({ ...first, ownerToken: `owner-${uid()}`, onUnknown: 'retry' })).outcome).toBe('forward');
        expect(await store.finish(finishOf(first, 'completed'))).toEqual({ recorded: false });
        const [late] = await rejectionsOf(store, { entity: logged, reason: 'late-finish' });
        expectCut(late!.path, a.path, LIMITS.path);
        expectCut(late!.idempotencyKey, first.key!, LIMITS.idempotencyKey);
        expectCut(late!.entity, entity, LIMITS.entity);
        expectCut(late!.clientRequestId, a.clientRequestId!, LIMITS.clientRequestId);
      });
    });

    describe('waitForChange', () => {
      it('wakes a waiter on the entity and on the record when the holder finishes; on another replica too', async () => {
        const replica = await h.openReplica();
        try {
          const input = command();
          await store.admit(input);
          let woke = 0;
          const waits = [
            store.waitForChange(entityTopic(input.entity!), 600_000).then(() => woke++),
            store.waitForChange(recordTopic(input.scope, input.key!), 600_000).then(() => woke++),
            replica.waitForChange(entityTopic(input.entity!), 600_000).then(() => woke++),
            replica.waitForChange(recordTopic(input.scope, input.key!), 600_000).then(() => woke++),
          ];
          await sleep(5);
          await store.finish(finishOf(input, 'completed'));
          await Promise.all(waits);
          expect(woke).toBe(4);
          // The replica sees the result.
          expect((await replica.admit({ ...input, ownerToken: `owner-${uid()}` })).outcome).toBe('replay');
        } finally {
          await replica.close();
          await replica.close();
        }
      });

      it('resolves (never rejects) on timeout, on abort, and after close', async () => {
        await expect(store.waitForChange(entityTopic(`e-${uid()}`), 5)).resolves.toBeUndefined();
        await expect(store.waitForChange(entityTopic(`e-${uid()}`), 0)).resolves.toBeUndefined();
        const ac = new AbortController();
        const waiting = store.waitForChange(entityTopic(`e-${uid()}`), 600_000, ac.signal);
        ac.abort();
        await expect(waiting).resolves.toBeUndefined();
        await expect(store.waitForChange(entityTopic(`e-${uid()}`), 600_000, ac.signal)).resolves.toBeUndefined();
        const replica = await h.openReplica();
        const pending = replica.waitForChange(entityTopic(`e-${uid()}`), 600_000);
        await replica.close();
        await expect(pending).resolves.toBeUndefined();
        await expect(replica.waitForChange(entityTopic(`e-${uid()}`), 600_000)).resolves.toBeUndefined();
      });
    });

    describe('concurrency (real parallelism against the real database)', () => {
      it('G2: 100 parallel admissions of one key (serial, fenced) → exactly one forward; then 100 replays', async () => {
        const over = { key: `k-${uid()}`, entity: `e-${uid()}`, fence: 3n };
        const { violations, winner } = await checkSingleForward(store, 100, over);
        expect(violations).toEqual([]);
        const [rec] = await store.getRecords(over.key);
        expect(rec!.state).toBe('in_progress');
        expect(await store.finish(finishOf(winner!, 'completed', response({ body: new Uint8Array([0, 1, 2, 255]) })))).toEqual({ recorded: true });
        const replays = await Promise.all(Array.from({ length: 100 }, () => store.admit(command({ ...over }))));
        for (const r of replays) {
          expect(r.outcome).toBe('replay');
          expect(Array.from((r as { response: StoredResponse }).response.body)).toEqual([0, 1, 2, 255]);
        }
      });

      it('G2: 100 parallel admissions of one key (serial, no fence, entity already known) → exactly one forward', async () => {
        const entity = `e-${uid()}`;
        const warm = command({ entity, fence: null });
        await store.admit(warm);
        await store.finish(finishOf(warm, 'completed'));
        const { violations } = await checkSingleForward(store, 100, { key: `k-${uid()}`, entity, fence: null });
        expect(violations).toEqual([]);
      });

      it('G2: 50 parallel retries take over one outcome_unknown record exactly once (onUnknown: retry)', async () => {
        for (const over of [{ mode: 'concurrent' as const, entity: null, fence: null }, { mode: 'serial' as const }]) {
          const first = command({ ...over, onUnknown: 'retry' });
          await store.admit(first);
          await store.finish(finishOf(first, 'unknown'));
          const outcomes = await Promise.all(Array.from({ length: 50 }, () => store.admit({ ...first, ownerToken: `owner-${uid()}`, audit: audit() })));
          expect(outcomes.filter((o) => o.outcome === 'forward')).toEqual([{ outcome: 'forward', takeover: true }]);
          expect(outcomes.filter((o) => o.outcome === 'idempotency-in-progress')).toHaveLength(49);
        }
      });

      it('G2/G4: 50 parallel retries meet one dead lock: exactly one takeover (retry), or all refused and logged (reject)', async () => {
        const dead = command({ lockMs: SHORT, entity: null, fence: null, mode: 'concurrent', onUnknown: 'retry' });
        await store.admit(dead);
        await sleep(PAST_EXPIRY_MS);
        const taken = await Promise.all(Array.from({ length: 50 }, () => store.admit({ ...dead, lockMs: 30_000, ownerToken: `owner-${uid()}` })));
        expect(taken.filter((o) => o.outcome === 'forward')).toHaveLength(1);
        expect(taken.filter((o) => o.outcome === 'idempotency-in-progress')).toHaveLength(49);

        const entity = `e-${uid()}`;
        const dead2 = command({ lockMs: SHORT, entity, fence: 1n });
        await store.admit(dead2);
        await sleep(PAST_EXPIRY_MS);
        const refused = await Promise.all(Array.from({ length: 50 }, () => store.admit(command({ entity, key: dead2.key, fence: 1n }))));
        expect(refused.every((o) => o.outcome === 'outcome-unknown')).toBe(true);
        expect(await rejectionsOf(store, { entity, reason: 'outcome-unknown' })).toHaveLength(50);
      });

      it('G2: 100 parallel admissions of one key (concurrent mode, no entity) → exactly one forward', async () => {
        const { violations } = await checkSingleForward(store, 100, { key: `k-${uid()}`, entity: null, fence: null, mode: 'concurrent' });
        expect(violations).toEqual([]);
      });

      it('G1: 200 shuffled fences raced by 8 callers on one entity → no lower fence admitted after a higher one', async () => {
        const fences = shuffled(
          Array.from({ length: 200 }, (_, i) => BigInt(i + 1)),
          7,
        );
        const result = await checkFenceRace(store, fences, 8);
        expect(result.violations).toEqual([]);
        expect(result.admitted).toBeGreaterThan(0);
        expect(result.refused).toBeGreaterThan(0);
        expect(result.admitted + result.refused).toBe(200);
      });

      it('G1 across replicas: the same race sprayed over two stores on one database', async () => {
        const replica = await h.openReplica();
        try {
          const entity = `race-${uid()}`;
          let i = 0;
          const sprayed: GatewayStore = new Proxy(store, {
            get(target, prop) {
              if (prop === 'admit') return (input: AdmitInput) => (i++ % 2 === 0 ? target : replica).admit(input);
              const v = Reflect.get(target, prop, target);
              return typeof v === 'function' ? v.bind(target) : v;
            },
          });
          const result = await checkFenceRace(
            sprayed,
            shuffled(
              Array.from({ length: 120 }, (_, k) => BigInt(k + 1)),
              11,
            ),
            8,
            entity,
          );
          expect(result.violations).toEqual([]);
        } finally {
          await replica.close();
        }
      });

      it('G3: serial slot exclusivity — parallel admits of distinct keys on one entity → one forward, no records for the rest', async () => {
        const entity = `e-${uid()}`;
        const inputs = Array.from({ length: 30 }, () => command({ entity, fence: 1n }));
        const outcomes = await Promise.all(inputs.map((c) => store.admit(c)));
        expect(outcomes.filter((o) => o.outcome === 'forward')).toHaveLength(1);
        expect(outcomes.filter((o) => o.outcome === 'entity-busy')).toHaveLength(29);
        const records = await Promise.all(inputs.map((c) => store.getRecords(c.key!)));
        expect(records.filter((r) => r.length > 0)).toHaveLength(1);
      });

      it('G3: callers looping through one serial entity never overlap upstream', async () => {
        const r = await checkSerialExclusive(store, 4, 5);
        expect(r.violations).toEqual([]);
        expect(r.maxInFlight).toBe(1);
        expect(r.forwarded).toBe(20);
      });

      it('a finish racing a retry of the same request neither deadlocks nor double-forwards', async () => {
        const entity = `e-${uid()}`;
        for (let round = 0; round < 25; round++) {
          const first = command({ entity, fence: BigInt(round) });
          expect((await store.admit(first)).outcome).toBe('forward');
          const [, retry] = await Promise.all([
            store.finish(finishOf(first, 'completed')),
            store.admit(command({ entity, key: first.key, fence: BigInt(round) })),
          ]);
          expect(['replay', 'idempotency-in-progress']).toContain(retry.outcome);
        }
      });

      it('parallel admits of one key on different entities: still exactly one forward', async () => {
        const key = `k-${uid()}`;
        const outcomes = await Promise.all(Array.from({ length: 20 }, () => store.admit(command({ key, entity: `e-${uid()}`, fence: 1n }))));
        expect(outcomes.filter((o) => o.outcome === 'forward')).toHaveLength(1);
        expect(outcomes.filter((o) => o.outcome === 'idempotency-in-progress')).toHaveLength(19);
      });
    });

    describe('negative controls: each check fails when the store check it guards is switched off', () => {
      it('dropping the fence (fence: null) makes the stale-fence checks report violations', async () => {
        const bad = broken.withoutFence(store);
        expect((await checkStaleFence(bad)).length).toBeGreaterThan(0);
        const race = await checkFenceRace(
          bad,
          shuffled(
            Array.from({ length: 60 }, (_, i) => BigInt(i + 1)),
            7,
          ),
          8,
        );
        expect(race.violations.some((v) => v.includes('was forwarded although'))).toBe(true);
      });

      it('a resolution without createdAt settles the later attempt in place of the one seen', async () => {
        const v = await checkResolveAttempt(store, false);
        expect(v.some((x) => x.includes("settled the retry's record"))).toBe(true);
      });

      it('a release without its notBefore releases an attempt that may still be in flight', async () => {
        const v = await checkNotBeforeRelease(broken.withoutNotBefore(store), h);
        expect(v.some((x) => x.includes('was not refused too-early'))).toBe(true);
      });

      it("the bound from created_at (not the attempt's own lock end) releases an extended and a taken-over attempt too early", async () => {
        const v = await checkAttemptBound(broken.createdAtBound(store), h);
        expect(v.some((x) => x.includes('an extended attempt was released before'))).toBe(true);
        expect(v.some((x) => x.includes('a taken-over attempt was released before'))).toBe(true);
      });

      it('without the extension the retry meets an expired lock and the entity is free (the extended-lock check fails)', async () => {
        const v = await checkExtendedLock(store, h, false);
        expect(v.some((x) => x.includes('expected idempotency-in-progress'))).toBe(true);
        expect(v.some((x) => x.includes('expected entity-busy'))).toBe(true);
      });

      it('dropping the key makes the single-forward check report duplicates', async () => {
        const r = await checkSingleForward(broken.withoutKey(store), 20, { key: `k-${uid()}`, entity: null, fence: null, mode: 'concurrent' });
        expect(r.outcomes.forward).toBe(20);
        expect(r.violations.length).toBeGreaterThan(0);
      });

      it('forcing concurrent mode makes the serial-exclusivity check see overlap', async () => {
        const r = await checkSerialExclusive(broken.concurrent(store), 4, 3);
        expect(r.maxInFlight).toBeGreaterThan(1);
        expect(r.violations.length).toBeGreaterThan(0);
      });
    });
  });
}
