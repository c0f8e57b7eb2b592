import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import { SqliteGatewayStore } from '../../src/store/sqlite/index.js';
import type { AdmitInput } from '../../src/store/types.js';

/**
 * Group commit (issue 6): what is specific to grouping. The whole store
 * contract runs against the grouped store in sqlite.test.ts.
 */
const dirs: string[] = [];
const stores: SqliteGatewayStore[] = [];
afterEach(async () => {
  await Promise.all(stores.splice(0).map((s) => s.close()));
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function open(options: { busyTimeoutMs?: number } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-group-'));
  dirs.push(dir);
  const path = join(dir, 'gateway.db');
  const store = new SqliteGatewayStore({ path, ...options });
  stores.push(store);
  return { store, path };
}

let n = 0;
function admitInput(over: Partial<AdmitInput> = {}): AdmitInput {
  n++;
  return {
    scope: 'r',
    key: `k-${n}`,
    entity: `e-${n}`,
    fence: 1n,
    fingerprint: 'f',
    mode: 'serial',
    ownerToken: `o-${n}`,
    lockMs: 10_000,
    retentionMs: 60_000,
    onUnknown: 'reject',
    audit: { requestId: `r-${n}`, caller: null, method: 'POST', path: '/x', payloadSha256: '0' },
    ...over,
  };
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
