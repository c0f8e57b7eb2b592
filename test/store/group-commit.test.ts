import { rmSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import { SqliteGatewayStore, migrateSqlite } from '../../src/store/sqlite/index.js';
import { GroupCommit, type DurableSync } from '../../src/store/sqlite/group-commit.js';
import { admitInput } from './helpers/inputs.js';
import { tempDir } from '../helpers/temp.js';

/**
 * Group commit (DESIGN §8.1): what is specific to grouping. The whole store
 * contract runs against the grouped store in sqlite.test.ts.
 */
const dirs: string[] = [];
const stores: SqliteGatewayStore[] = [];
afterEach(async () => {
  await Promise.all(stores.splice(0).map((s) => s.close()));
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function open(options: { busyTimeoutMs?: number } = {}) {
  const dir = tempDir('fencegate-group-').dir;
  dirs.push(dir);
  const path = join(dir, 'gateway.db');
  const store = new SqliteGatewayStore({ path, ...options });
  stores.push(store);
  return { store, path };
}

describe('sqlite group commit', () => {
  it('decisions that arrive together share one transaction, each still decided in arrival order', async () => {
    const { store } = open();
    const before = { ...store.group!.stats };
    // 100 admissions for ONE entity with rising fences, issued in the same tick,
    // then a stale one: serial equivalence means the stale one sees fence 100.
    const rising = Array.from({ length: 100 }, (_, i) => store.admit(admitInput({ entity: 'shared', fence: BigInt(i + 1), mode: 'concurrent' })));
    const stale = store.admit(admitInput({ entity: 'shared', fence: 50n, mode: 'concurrent' }));
    const results = await Promise.all(rising);
    expect(results.every((r) => r.outcome === 'forward')).toBe(true);
    expect(await stale).toEqual({ outcome: 'stale-fence', currentFence: 100n });
    const groups = store.group!.stats.groups - before.groups;
    expect(store.group!.stats.decisions - before.decisions).toBe(101);
    expect(groups).toBeLessThan(5); // not 101 transactions (and fsyncs)
  });

  it('a decision that throws fails alone; the others of its group are committed', async () => {
    const { store, path } = open();
    const before = store.group!.stats.fallbacks;
    const good1 = store.admit(admitInput({ key: 'good-1' }));
    // A scope the CHECK-free schema accepts but the record insert cannot: a NULL key
    // violates NOT NULL only inside the transaction, after the fence was raised.
    const bad = store.admit(admitInput({ key: 'bad', entity: 'bad-entity', fence: 7n, fingerprint: null as unknown as string }));
    const good2 = store.admit(admitInput({ key: 'good-2' }));
    await expect(good1).resolves.toMatchObject({ outcome: 'forward' });
    await expect(bad).rejects.toThrow(/NOT NULL/);
    await expect(good2).resolves.toMatchObject({ outcome: 'forward' });
    const db = new Database(path, { readonly: true });
    const keys = db.prepare("SELECT key FROM idempotency_records WHERE scope = 'r' ORDER BY key").pluck().all();
    // The group was rolled back and re-run one decision at a time: the failed
    // decision left nothing, not even its fence raise.
    expect(store.group!.stats.fallbacks - before).toBe(1);
    const badFence = db.prepare("SELECT fence FROM fence_entities WHERE entity = 'bad-entity'").get();
    db.close();
    expect(keys).toEqual(['good-1', 'good-2']);
    expect(badFence).toBeUndefined();
  });

  it('when the group cannot commit, every decision of it fails and nothing is written', async () => {
    const { store, path } = open({ busyTimeoutMs: 50 });
    // Another process holds the write lock: BEGIN IMMEDIATE of the group times out.
    const other = new Database(path);
    other.pragma('busy_timeout = 0');
    other.exec('BEGIN IMMEDIATE');
    const a = store.admit(admitInput({ key: 'locked-a' }));
    const b = store.admit(admitInput({ key: 'locked-b' }));
    await expect(a).rejects.toThrow(/locked|busy/i);
    await expect(b).rejects.toThrow(/locked|busy/i);
    other.exec('ROLLBACK');
    const count = other.prepare("SELECT count(*) FROM idempotency_records WHERE key LIKE 'locked-%'").pluck().get();
    other.close();
    expect(count).toBe(0);
    // And the store works again once the lock is gone.
    await expect(store.admit(admitInput({ key: 'after' }))).resolves.toMatchObject({ outcome: 'forward' });
  });

  it('hold() keeps new groups from beginning (the checkpointer restarts the WAL meanwhile); release lets them run', async () => {
    const { store, path } = open();
    const release = store.group!.hold();
    const pending = store.admit(admitInput({ key: 'held' }));
    let answered = false;
    void pending.then(() => (answered = true));
    await new Promise((r) => setTimeout(r, 50));
    const db = new Database(path, { readonly: true });
    const count = () => db.prepare("SELECT count(*) FROM idempotency_records WHERE key = 'held'").pluck().get();
    expect(answered).toBe(false);
    expect(count()).toBe(0); // not begun, not just unanswered
    release();
    release(); // idempotent
    await expect(pending).resolves.toMatchObject({ outcome: 'forward' });
    expect(count()).toBe(1);
    db.close();
  });

  it('close() waits for the queued group to commit', async () => {
    const { store, path } = open();
    const pending = store.admit(admitInput({ key: 'late' }));
    await store.close();
    await expect(pending).resolves.toMatchObject({ outcome: 'forward' });
    const db = new Database(path, { readonly: true });
    expect(db.prepare("SELECT count(*) FROM idempotency_records WHERE key = 'late'").pluck().get()).toBe(1);
    db.close();
  });
});

/**
 * Background sync (DESIGN §8.1): the group commits without SQLite's own fsync
 * and its callers are answered once the WAL sync reports. A sync held open
 * by the test shows the order; the same check against a sync that answers
 * before the disk did (the negative control) must see the early answer.
 */
describe('sqlite group commit with the WAL synced off the event loop', () => {
  /** A sync the test releases by hand, standing for a slow disk. */
  function heldSync() {
    const held: ((err: Error | null) => void)[] = [];
    const sync: DurableSync = (done) => void held.push(done);
    return { sync, release: (err: Error | null = null) => held.splice(0).forEach((done) => done(err)), pending: () => held.length };
  }

  /** Admits once; reports whether the caller heard back before the sync reported, and whether the row was already committed. */
  async function answeredBeforeSync(sync: DurableSync & { release?: () => void }, release: () => void) {
    const dir = tempDir('fencegate-bgsync-').dir;
    dirs.push(dir);
    const path = join(dir, 'gateway.db');
    const db = new Database(path);
    db.pragma('journal_mode = WAL');
    migrateSqlite(db);
    const group = new GroupCommit(db, { sync });
    const insert = db.prepare("INSERT INTO fence_entities (entity, fence, accepted_at) VALUES ('e', 1, 0)");
    let answered = false;
    const done = group.run(() => insert.run()).then(() => (answered = true));
    await new Promise((r) => setTimeout(r, 20)); // many event-loop turns
    const early = answered;
    const committed = new Database(path, { readonly: true });
    const visible = committed.prepare("SELECT count(*) FROM fence_entities WHERE entity = 'e'").pluck().get();
    committed.close();
    release();
    await done;
    await group.idle();
    db.close();
    return { early, visible };
  }

  it('answers only after the sync reports, though the group is committed (visible) before', async () => {
    const held = heldSync();
    const { early, visible } = await answeredBeforeSync(held.sync, () => held.release());
    expect(visible).toBe(1);
    expect(early).toBe(false);
  });

  it('negative control: a sync that reports before the disk did lets the answer out early, and the check sees it', async () => {
    const lying: DurableSync = (done) => done(null);
    const { early } = await answeredBeforeSync(lying, () => {});
    expect(early).toBe(true);
  });

  it('groups committed while a sync runs wait for the next sync, which covers them all', async () => {
    const { store, path } = open();
    expect(store.syncer).not.toBeNull(); // FULL (the default) syncs in the background
    const before = store.syncer!.fsyncs;
    const first = store.admit(admitInput({ key: 'bg-1' }));
    await new Promise((r) => setImmediate(r)); // group 1 committed, its sync started
    const rest = Array.from({ length: 20 }, (_, i) => store.admit(admitInput({ key: `bg-${i + 2}` })));
    await Promise.all([first, ...rest]);
    const fsyncs = store.syncer!.fsyncs - before;
    expect(fsyncs).toBeGreaterThanOrEqual(1);
    expect(fsyncs).toBeLessThanOrEqual(store.group!.stats.groups);
    const db = new Database(path, { readonly: true });
    expect(db.prepare("SELECT count(*) FROM idempotency_records WHERE key LIKE 'bg-%'").pluck().get()).toBe(21);
    db.close();
  });

  it('a failed sync stops the store: that group and every later call fail', async () => {
    const dir = tempDir('fencegate-bgsync-').dir;
    dirs.push(dir);
    const db = new Database(join(dir, 'gateway.db'));
    db.pragma('journal_mode = WAL');
    const held = heldSync();
    const group = new GroupCommit(db, { sync: held.sync });
    const a = group.run(() => 1);
    await new Promise((r) => setTimeout(r, 5));
    expect(held.pending()).toBe(1);
    held.release(Object.assign(new Error('EIO: i/o error, fdatasync'), { code: 'EIO' }));
    await expect(a).rejects.toThrow(/stopped: syncing its WAL failed \(EIO/);
    await expect(group.run(() => 2)).rejects.toThrow(/stopped/);
    db.close();
  });

  it('keeps the connection at its configured level outside the group transactions', async () => {
    const { store } = open();
    await store.admit(admitInput());
    // 2 = FULL: sweeps and operator actions on this connection still sync inside COMMIT.
    expect(store.db.pragma('synchronous', { simple: true })).toBe(2);
  });

  it('syncs the WAL of the file it opened, even after the working directory changes', async () => {
    const dir = tempDir('fencegate-bgsync-').dir;
    const elsewhere = tempDir('fencegate-bgsync-cwd-').dir;
    dirs.push(dir, elsewhere);
    const cwd = process.cwd();
    process.chdir(dir);
    let store: SqliteGatewayStore;
    try {
      store = new SqliteGatewayStore({ path: 'relative.db' });
      stores.push(store);
    } finally {
      process.chdir(elsewhere);
    }
    try {
      await expect(store.admit(admitInput())).resolves.toMatchObject({ outcome: 'forward' });
      expect(store.syncer!.fsyncs).toBeGreaterThan(0);
    } finally {
      process.chdir(cwd);
    }
  });

  it('is off at NORMAL and in memory: COMMIT behaves as the connection says', () => {
    const dir = tempDir('fencegate-bgsync-').dir;
    dirs.push(dir);
    const normal = new SqliteGatewayStore({ path: join(dir, 'n.db'), synchronous: 'NORMAL' });
    const memory = new SqliteGatewayStore({ path: ':memory:' });
    stores.push(normal, memory);
    expect(normal.syncer).toBeNull();
    expect(memory.syncer).toBeNull();
  });
});
