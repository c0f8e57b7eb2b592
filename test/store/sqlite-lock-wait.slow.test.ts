import { existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { command, expectProblem, paymentsRoute, recordRows, startTestGateway, tempDir, until, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { killAll, ROOT, spawnProc, type Proc } from '../helpers/child.js';
import { SqliteGatewayStore, type SqliteStoreOptions } from '../../src/store/sqlite/index.js';
import { admitInput } from './helpers/inputs.js';
import type { AdmitInput, GatewayStore } from '../../src/store/types.js';

/**
 * A process that holds SQLite's write lock (stopped by SIGSTOP, swapped out,
 * slow) must not freeze the event loop of the other processes on the file:
 * their writes wait for the lock with the loop free
 * (src/store/sqlite/write-lock.ts), then go through or fail with 503, and
 * health and reads keep answering meanwhile. The negative controls give the
 * store the old behaviour (SQLite's own busy wait, `blockingWaitMs` as long
 * as the whole wait) and show the same checks fail.
 */

const LOCKER = join(ROOT, 'test', 'store', 'helpers', 'sqlite-locker.mjs');
const dirs: string[] = [];
const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
  await killAll();
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function freshDir(): string {
  const dir = tempDir('fencegate-lockwait-').dir;
  dirs.push(dir);
  return dir;
}

/** Another process holding the write lock of `dbPath` (test/store/helpers/sqlite-locker.mjs). */
async function lockFromOtherProcess(
  dbPath: string,
  mode: 'write' | 'read' = 'write',
): Promise<{ proc: Proc; marker: string; released: () => boolean; commit(afterMs?: number): Promise<void> }> {
  const marker = `${dbPath}.released`;
  const proc = spawnProc('sqlite-locker', [LOCKER, dbPath, marker, mode], { stdin: true });
  await proc.waitFor((m) => m.msg === 'locked', 'the locker holding the write lock');
  return {
    proc,
    marker,
    released: () => existsSync(marker),
    async commit(afterMs) {
      proc.resume();
      proc.send(afterMs === undefined ? 'commit' : `commit-after ${afterMs}`);
      await proc.waitFor((m) => m.msg === 'committed', 'the locker letting the lock go');
    },
  };
}

describe('a gateway next to a process that holds the SQLite write lock', () => {
  let up: FakeUpstream;
  afterAll(async () => {
    await up?.close();
  });

  async function gatewayOn(sqliteOptions: Partial<SqliteStoreOptions>, wrapStore?: (s: GatewayStore) => GatewayStore): Promise<TestGateway> {
    up ??= await startUpstream();
    const tmp = tempDir('fencegate-lockwait-gw-');
    dirs.push(tmp.dir);
    const gw = await startTestGateway({ routes: [paymentsRoute(up.url)], dbPath: join(tmp.dir, 'shared.db'), sqliteOptions, wrapStore });
    closers.push(() => gw.close());
    return gw;
  }

  /**
   * The scenario of both the test and its negative control: the other
   * process takes the lock, a command's admission waits for it, then health
   * and a read are asked for. Reports whether each answered while the lock
   * was certainly still held (the locker's marker not yet written), then
   * lets the lock go and returns the command's answer.
   */
  async function healthWhileLocked(options: { sqliteOptions: Partial<SqliteStoreOptions>; stop: boolean; key: string }) {
    let admitted = false;
    let busyAtAdmit = 0;
    let gw: TestGateway | null = null;
    let locker: Awaited<ReturnType<typeof lockFromOtherProcess>> | null = null;
    // Without SIGSTOP the locker lets go by itself a while after the
    // admission started: a blocked event loop could not tell it to.
    const hook = (s: GatewayStore) =>
      onAdmit(s, () => {
        admitted = true;
        busyAtAdmit = gw!.sqlite.lock.stats.busy;
        if (!options.stop) locker!.proc.send('commit-after 1000');
      });
    gw = await gatewayOn(options.sqliteOptions, hook);
    locker = await lockFromOtherProcess(gw.dbPath);
    if (options.stop) locker.proc.pause();
    const before = up.callsFor(options.key).length;
    let settled = false;
    const cmd = command(gw.url, '/payments/p', { key: options.key, entity: options.key, fence: 1 }).then(async (r) => {
      settled = true;
      return { status: r.status, body: await r.text() };
    });
    // The admission is in the store and its BEGIN found the lock taken (or, with the loop blocked, all of that is over).
    await until(() => admitted && (gw!.sqlite.lock.stats.busy > busyAtAdmit || locker!.released()), 'the admission waiting for the lock');
    const health = await fetch(`${gw.url}${gw.config.adminPrefix}/health`);
    const healthWhileHeld = !locker.released();
    const read = await fetch(`${gw.url}${gw.config.adminPrefix}/v1/rejections?limit=5`);
    const readWhileHeld = !locker.released();
    const commandPendingWhileHeld = !settled && !locker.released();
    if (!locker.released()) await locker.commit();
    const answer = await cmd;
    return {
      healthWhileHeld,
      readWhileHeld,
      commandPendingWhileHeld,
      health: { status: health.status, body: await health.json() },
      read: read.status,
      answer,
      upstreamCalls: up.callsFor(options.key).length - before,
      record: recordRows(gw.sqlite, options.key),
    };
  }

  it('answers health and reads while the other process is stopped holding the lock; the command waits, then goes through once', async () => {
    const r = await healthWhileLocked({ sqliteOptions: { busyTimeoutMs: 60_000 }, stop: true, key: 'stopped-holder' });
    expect(r.health).toEqual({ status: 200, body: { status: 'ok' } });
    expect(r.healthWhileHeld).toBe(true);
    expect(r.read).toBe(200);
    expect(r.readWhileHeld).toBe(true);
    // The command waited for the lock (not refused, not forwarded) …
    expect(r.commandPendingWhileHeld).toBe(true);
    // … and went through exactly once when the lock came free.
    expect(r.answer.status).toBe(201);
    expect(r.upstreamCalls).toBe(1);
    expect(r.record).toMatchObject([{ state: 'completed', status: 201 }]);
  });

  it("negative control: with SQLite's own busy wait (the old behaviour) health answers only after the lock is let go", async () => {
    const r = await healthWhileLocked({ sqliteOptions: { busyTimeoutMs: 60_000, blockingWaitMs: 60_000 }, stop: false, key: 'blocking-wait' });
    expect(r.health.status).toBe(200);
    expect(r.healthWhileHeld).toBe(false);
    expect(r.readWhileHeld).toBe(false);
    // The store worked (it waited, with the loop stopped): the control differs only in the wait.
    expect(r.answer.status).toBe(201);
    expect(r.upstreamCalls).toBe(1);
  });

  it('refuses with 503 store-unavailable once the wait is over, nothing forwarded or written; the retry after the release goes through once', async () => {
    const gw = await gatewayOn({ busyTimeoutMs: 300 });
    const locker = await lockFromOtherProcess(gw.dbPath);
    locker.proc.pause();
    const key = 'wait-runs-out';
    const refused = await command(gw.url, '/payments/p', { key, entity: key, fence: 1 });
    // Answered while the locker is still stopped.
    expect(locker.released()).toBe(false);
    await expectProblem(refused, 503, 'store-unavailable');
    expect(up.callsFor(key)).toHaveLength(0);
    expect(recordRows(gw.sqlite, key)).toEqual([]);
    expect(gw.sqlite.lock.stats.timeouts).toBeGreaterThan(0);
    const health = await fetch(`${gw.url}${gw.config.adminPrefix}/health`);
    expect(health.status).toBe(200);
    expect(locker.released()).toBe(false);

    await locker.commit();
    const retried = await command(gw.url, '/payments/p', { key, entity: key, fence: 1 });
    expect(retried.status).toBe(201);
    const replay = await command(gw.url, '/payments/p', { key, entity: key, fence: 1 });
    expect(replay.status).toBe(201);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(up.callsFor(key)).toHaveLength(1);
    expect(recordRows(gw.sqlite, key)).toMatchObject([{ state: 'completed' }]);
  });

  it('a process stopped in a read transaction holds up no write; it only keeps the checkpoint behind its snapshot', async () => {
    const gw = await gatewayOn({ busyTimeoutMs: 60_000 });
    const reader = await lockFromOtherProcess(gw.dbPath, 'read');
    reader.proc.pause();
    const key = 'stopped-reader';
    const res = await command(gw.url, '/payments/p', { key, entity: key, fence: 1 });
    expect(res.status).toBe(201);
    expect(reader.released()).toBe(false);
    expect(gw.sqlite.lock.stats.busy).toBe(0);
    // PASSIVE (what SQLite runs after a COMMIT) never waits: it copies what
    // it may and leaves the frames the stopped reader may still need.
    const ckpt = await passiveCheckpoint(gw);
    expect(ckpt.checkpointed).toBeLessThan(ckpt.log);
    await reader.commit();
    const after = await passiveCheckpoint(gw);
    expect(after.checkpointed).toBe(after.log);
  });

  /**
   * A PASSIVE checkpoint on the gateway's connection that ran. One that met
   * the store's own checkpoint worker in the middle of a checkpoint
   * (src/store/sqlite/checkpoint.ts) could not run: SQLite answers busy,
   * with -1 for both counts, and it is asked again.
   */
  function passiveCheckpoint(gw: TestGateway): Promise<{ busy: number; log: number; checkpointed: number }> {
    return until(
      () => {
        const [r] = gw.sqlite.db.pragma('wal_checkpoint(PASSIVE)') as { busy: number; log: number; checkpointed: number }[];
        return r!.log >= 0 ? r! : null;
      },
      'a PASSIVE checkpoint that was not refused as busy',
      { everyMs: 5 },
    );
  }
});

/** The store with `admit` observed (every other member as it is). */
function onAdmit(inner: GatewayStore, seen: () => void): GatewayStore {
  return new Proxy(inner, {
    get(target, prop) {
      if (prop === 'admit') return (input: AdmitInput) => (seen(), target.admit(input));
      const v = Reflect.get(target, prop, target) as unknown;
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
}

/**
 * Every write of the store goes through the wait on the event loop. Here the
 * lock is held by a second connection in this process (it waits for nothing,
 * so it cannot block); a write is checked to stay pending while a timer set
 * after it fires, and to succeed once the lock is let go.
 */
describe('every write of the SQLite store waits for the lock with the event loop free', () => {
  function open(options: Partial<SqliteStoreOptions> = {}) {
    const path = join(freshDir(), 'gateway.db');
    const store = new SqliteGatewayStore({ path, ...options });
    closers.push(() => store.close());
    return { store, path };
  }

  /** Holds the lock from another connection, starts `call`, lets a timer run, then lets the lock go. */
  async function loopWhileLocked<T>(path: string, call: () => Promise<T>): Promise<{ order: string[]; result: PromiseSettledResult<T> }> {
    const other = new Database(path);
    other.exec('BEGIN IMMEDIATE');
    const order: string[] = [];
    const done = call().then(
      (v) => (order.push('settled'), v),
      (e) => {
        order.push('settled');
        throw e;
      },
    );
    const result = Promise.allSettled([done]).then(([r]) => r!);
    await new Promise((r) => setTimeout(r, 20));
    order.push('timer');
    other.exec('COMMIT');
    other.close();
    return { order, result: await result };
  }

  const wait = { busyTimeoutMs: 60_000 };

  async function unknownRecord(store: SqliteGatewayStore, key: string) {
    const input = admitInput({ key });
    await store.admit(input);
    await store.finish({ scope: input.scope, key, entity: input.entity, ownerToken: input.ownerToken, outcome: 'unknown', audit: input.audit });
    return input;
  }

  const cases: [string, Partial<SqliteStoreOptions>, (store: SqliteGatewayStore) => Promise<() => Promise<unknown>>][] = [
    ['admit (group commit)', wait, async (s) => () => s.admit(admitInput())],
    [
      'finish (group commit)',
      wait,
      async (s) => {
        const input = admitInput();
        await s.admit(input);
        return () =>
          s.finish({ scope: input.scope, key: input.key, entity: input.entity, ownerToken: input.ownerToken, outcome: 'released', audit: input.audit });
      },
    ],
    [
      'recordRejection (group commit)',
      wait,
      async (s) => () =>
        s.recordRejection({ reason: 'stale-fence', entity: 'e', presentedFence: 1n, currentFence: 2n, idempotencyKey: null, audit: admitInput().audit }),
    ],
    ['sweep (group commit)', wait, async (s) => () => s.sweep({ rejectionRetentionMs: 1000 })],
    [
      'resolveRecord',
      wait,
      async (s) => {
        const input = await unknownRecord(s, 'to-resolve');
        return () =>
          s.resolveRecord({ scope: input.scope, key: 'to-resolve', resolution: { outcome: 'released' }, operator: 'op', note: null, requestId: 'rq' });
      },
    ],
    ['admit (one transaction each)', { ...wait, groupCommit: false }, async (s) => () => s.admit(admitInput())],
    ['sweep (one transaction each)', { ...wait, groupCommit: false }, async (s) => () => s.sweep({ rejectionRetentionMs: 1000 })],
  ];

  for (const [name, options, prepare] of cases) {
    it(`${name}: pending while another connection holds the lock, done once it is let go`, async () => {
      const { store, path } = open(options);
      const call = await prepare(store);
      const { order, result } = await loopWhileLocked(path, call);
      expect(order).toEqual(['timer', 'settled']);
      expect(result.status, String((result as PromiseRejectedResult).reason)).toBe('fulfilled');
      expect(store.lock.stats.waits).toBeGreaterThan(0);
    });
  }

  it('resolveRecord commits what it did: the record is released and the action logged', async () => {
    const { store, path } = open(wait);
    const input = await unknownRecord(store, 'resolved');
    const { result } = await loopWhileLocked(path, () =>
      store.resolveRecord({ scope: input.scope, key: 'resolved', resolution: { outcome: 'released' }, operator: 'op', note: null, requestId: 'rq' }),
    );
    expect(result).toMatchObject({ status: 'fulfilled', value: { ok: true } });
    expect(await store.getRecords('resolved')).toEqual([]);
    expect((await store.listOperatorActions({ limit: 5 })).items).toHaveLength(1);
  });

  for (const groupCommit of [true, false]) {
    it(`negative control (${groupCommit ? 'group commit' : 'one transaction each'}): with SQLite's own busy wait the call holds the loop and fails before the timer runs`, async () => {
      const { store, path } = open({ busyTimeoutMs: 200, blockingWaitMs: 200, groupCommit });
      const { order, result } = await loopWhileLocked(path, () => store.admit(admitInput()));
      expect(order).toEqual(['settled', 'timer']);
      expect(result.status).toBe('rejected');
      expect(String((result as PromiseRejectedResult).reason)).toMatch(/locked|busy/i);
    });
  }
});

describe('group commit while waiting for the lock', () => {
  function open(options: Partial<SqliteStoreOptions> = {}) {
    const path = join(freshDir(), 'gateway.db');
    const store = new SqliteGatewayStore({ path, ...options });
    closers.push(() => store.close());
    return { store, path };
  }

  it('decisions that queue while it waits are decided in arrival order, in few groups, once the lock is free', async () => {
    const { store, path } = open({ busyTimeoutMs: 60_000 });
    const other = new Database(path);
    other.exec('BEGIN IMMEDIATE');
    const before = { ...store.group!.stats };
    const rising: Promise<unknown>[] = [];
    for (let i = 1; i <= 100; i++) {
      rising.push(store.admit(admitInput({ entity: 'queued', fence: BigInt(i), mode: 'concurrent' })));
      if (i % 25 === 0) await new Promise((r) => setTimeout(r, 5)); // arrivals spread over the wait
    }
    const stale = store.admit(admitInput({ entity: 'queued', fence: 50n, mode: 'concurrent' }));
    await until(() => store.lock.stats.busy > 0, 'a BEGIN that found the lock taken');
    other.exec('COMMIT');
    other.close();
    expect((await Promise.all(rising)).every((r) => (r as { outcome: string }).outcome === 'forward')).toBe(true);
    expect(await stale).toEqual({ outcome: 'stale-fence', currentFence: 100n });
    expect(store.group!.stats.decisions - before.decisions).toBe(101);
    expect(store.group!.stats.groups - before.groups).toBeLessThan(5);
  });

  it('a decision whose wait is over fails alone, nothing of it written; one queued later still waits and goes through', async () => {
    // The first decision waits the whole timeout (the lock stays held) and
    // fails; the later one only has to outlast the few steps to the COMMIT
    // below, which a stalled box can stretch past a second.
    const { store, path } = open({ busyTimeoutMs: 3_000 });
    const other = new Database(path);
    other.exec('BEGIN IMMEDIATE');
    await expect(store.admit(admitInput({ key: 'timed-out' }))).rejects.toThrow(/locked/);
    const busy = store.lock.stats.busy;
    const later = store.admit(admitInput({ key: 'later' }));
    await until(() => store.lock.stats.busy > busy, 'the later decision waiting', { everyMs: 5 });
    other.exec('COMMIT');
    other.close();
    await expect(later).resolves.toMatchObject({ outcome: 'forward' });
    expect(await store.getRecords('timed-out')).toEqual([]);
    expect(await store.getRecords('later')).toHaveLength(1);
  });
});
